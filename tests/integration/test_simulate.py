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
