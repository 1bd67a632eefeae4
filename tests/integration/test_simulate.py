"""The predictor on a real run's record (issue 13 item 4): a real search records every task's cost, and
`paramedic simulate --json` predicts the efficiency of a job on 32,768 workers in partitions from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paramedic.report.record import RunRecord
from tests.conftest import paramedic
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


def test_simulate_predicts_32768_workers_from_a_real_record(databases: Databases, tmp_path: Path) -> None:
    databases.place(tmp_path, 3000, fragments=3)
    queries = databases.queries(tmp_path / "q.fasta", 12)
    paramedic(
        "search", "blastp", "-query", str(queries), "-db", "db/uni", "-out", "hits.txt", "-evalue", "1e-5",
        "--strategy", "fragments", "--batch", "4", "--np", "2", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    record = RunRecord.load(tmp_path / "hits.txt.run.json")
    costs = [c for r in record.ranks_stats for c in r.costs()]
    searches = record.fragment_groups or record.fragments  # per batch: 3 fragments, or fewer groups of them
    assert sorted((c.number, c.fragment) for c in costs if c.kind == "search") == [
        (b, f) for b in range(record.batches) for f in range(searches)
    ]
    assert sum(c.queries for c in costs if c.kind == "piece") == 12
    assert all(c.seconds > 0 and c.query_residues > 0 for c in costs)

    done = paramedic(
        "simulate", "--record", "hits.txt.run.json", "--queries", "20000", "--workers", "32768",
        "--partition-size", "128", "--database-scale", "50", "--fragments", "32", "--json", cwd=tmp_path,
    )  # fmt: skip
    prediction = json.loads(done.stdout)
    assert prediction["workers"] == 32768 and prediction["ranks"] == 32769 and prediction["partitions"] == 256
    assert 0 < prediction["efficiency"] < 1 and prediction["wall_seconds"] > 0
    assert set(prediction["roles"]) == {"supermaster", "partition masters", "workers"}
    text = paramedic(
        "simulate", "--record", "hits.txt.run.json", "--queries", "100", "--workers", "3", cwd=tmp_path
    ).stdout
    assert "efficiency" in text and "workers: 3 ranks" in text


def test_simulate_predicts_the_start_on_nr_first_and_second_job(databases: Databases, tmp_path: Path) -> None:
    """Issue 42: a real pilot's record, then nr described by name (no nr here): the first job digests its
    364 GB before any search (on one node, rank 0's node all of it; on 64, a share of 3 of its 176
    volumes each), a second job only stamps; the same searches either way. A database given by its size:
    verification doubles with twice the bytes, a second job's start does not move. Bad descriptions: one
    line, exit 2."""
    databases.place(tmp_path, 1000, fragments=2)
    queries = databases.queries(tmp_path / "q.fasta", 6)
    paramedic(
        "search", "blastp", "-query", str(queries), "-db", "db/uni", "-out", "hits.txt", "-evalue", "1e-5",
        "--strategy", "fragments", "--np", "2", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    one_node = ["--node-ranks", "64"]
    base = ["simulate", "--record", "hits.txt.run.json", "--queries", "300", "--workers", "63", "--json"]

    def predicted(*extra: str) -> dict:
        return json.loads(paramedic(*base, *extra, cwd=tmp_path).stdout)

    first, second = (
        predicted("--database-profile", "nr", *one_node),
        predicted("--database-profile", "nr", "--second-job", *one_node),
    )
    assert first["startup"]["rank0_verify_bytes"] == 364 * 10**9 and first["startup"]["volumes"] == 176
    assert first["fragments"] == 176 and first["work_seconds"] == second["work_seconds"]
    verify = first["startup"]["rank0_verify_seconds"]
    assert verify == pytest.approx(364e9 / 2.1e9, rel=1e-3)
    assert second["startup"]["rank0_verify_seconds"] == 0 and second["startup"]["rank0_seconds"] < 1
    assert first["wall_seconds"] - second["wall_seconds"] == pytest.approx(verify, abs=0.01)
    assert first["where"]["start: verification"]["share"] > 0
    spread = predicted("--database-profile", "nr")["startup"]  # 64 ranks, one a node
    assert spread["verify_nodes"] == 64 and spread["rank0_verify_bytes"] == 364 * 10**9
    assert spread["rank0_verify_seconds"] == pytest.approx(3 * 364e9 / 176 / 2.1e9, rel=1e-3)
    assert second["where"]["start: verification"]["share"] == 0

    sized = ["--db-volumes", "176", "--db-residues", "200000000000"]
    once, twice = (predicted("--db-bytes", size, *sized, *one_node) for size in ("364G", "728G"))
    assert twice["startup"]["rank0_verify_seconds"] == pytest.approx(
        2 * once["startup"]["rank0_verify_seconds"], rel=1e-4
    )
    later = [predicted("--db-bytes", size, *sized, "--second-job") for size in ("364G", "728G", "10T")]
    assert len({p["wall_seconds"] for p in later}) == 1

    text = paramedic(
        *base[:-1], "--database-profile", "nr", "--stage", "--node-ranks", "32", cwd=tmp_path
    ).stdout
    assert "first job on nr" in text and "staged" in text and "where the time goes" in text

    for bad, words in (
        (["--db-bytes", "12Q", "--db-volumes", "3"], "--db-bytes '12Q'"),
        (["--database-profile", "nt"], "nucleotide database"),
        (["--db-bytes", "364G"], "go together"),
        (["--database-profile", "nr", "--digest-rate", "-1"], "--digest-rate"),
    ):
        done = paramedic(*base, *bad, cwd=tmp_path, check=False)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
        assert done.stdout == ""
