"""The run record as a versioned, typed contract: what `write` writes, `load` reads back; another
version or an unknown key is refused (bench/ and users' scripts read records with `load`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paramedic.report.record import VERSION, RankStats, RunRecord


def record() -> RunRecord:
    stats = RankStats(rank=1, role="worker")
    stats.add("search", 2.5)
    stats.tasks["search"] = 3
    return RunRecord(
        program="blastp", command=["paramedic", "search"], database="db/uni", manifest_sha256="ab" * 32,
        queries=10, ranks=2, workers=1, batches=2, fragments=3, pieces=4, strategy="fragments",
        search_batch_queries=5, regen_group_queries=3, blast_startup_seconds=0.05, wall_seconds=4.0,
        output="hits.txt", output_bytes=1234, metadata_pairs=20, queries_with_hits=9, searched_again=0,
        ranks_stats=[RankStats(rank=0, role="master"), stats], resumed={"searches": 1, "pieces": 0},
    )  # fmt: skip


def test_a_written_record_loads_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "hits.txt.run.json"
    record().write(path)
    data = json.loads(path.read_text())
    assert data["version"] == VERSION and data["phase_totals"]["search"] == 2.5
    assert RunRecord.load(path) == record()


@pytest.mark.parametrize(
    "change,message",
    [({"version": 1}, "run record version 1, expected"), ({"cost": 3}, "unknown run record keys")],
)
def test_another_version_or_an_unknown_key_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "r.json"
    record().write(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=message):
        RunRecord.load(path)


def test_task_costs_round_trip_and_malformed_ones_are_refused(tmp_path: Path) -> None:
    from paramedic.report.record import TaskCost

    rec = record()
    rec.ranks_stats[1].add_task(TaskCost("search", 1, 2, 5, 1200, 90000, 1.23456))
    rec.ranks_stats[1].add_task(TaskCost("piece", 3, -1, 2, 400, 0, 0.5))
    path = tmp_path / "r.json"
    rec.write(path)
    loaded = RunRecord.load(path).ranks_stats[1]
    assert loaded.task_costs == [["search", 1, 2, 5, 1200, 90000, 1.2346], ["piece", 3, -1, 2, 400, 0, 0.5]]
    assert loaded.costs()[0] == TaskCost("search", 1, 2, 5, 1200, 90000, 1.2346)
    for bad in (["search", 1, 2], ["sort", 1, 2, 5, 1, 1, 1.0], ["piece", 1, -1, 2, 1, 0, -1.0]):
        loaded.task_costs = [bad]
        with pytest.raises(ValueError, match="malformed task cost"):
            loaded.costs()


@pytest.mark.parametrize(("groups", "said"), [(1, "in 1 search per batch"), (2, "in 2 searches per batch")])
def test_the_summary_counts_fragment_groups_in_english(groups: int, said: str) -> None:
    import dataclasses

    line = dataclasses.replace(record(), fragment_groups=groups).summary().splitlines()[0]
    assert said in line and "searchs" not in line
