"""The report page's pure parts (issue 24): which charts a record gets, that plotly.js is embedded once and
nothing is fetched; the summary's wording; the progress bar's task count; the launcher's bar after close.
(The page in a real browser: tests/integration/test_report_page.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from paramedic.engine.runtime.relay import Bar
from paramedic.report.html import render
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord, TaskCost


def record(**changes: Any) -> RunRecord:
    worker = RankStats(rank=1, role="worker")
    worker.add("search", 2.5)
    worker.add("regenerate", 0.4)
    worker.add_task(TaskCost("search", 0, 0, 5, 500, 1000, 1.5))
    worker.add_task(TaskCost("search", 0, 1, 5, 500, 1000, 1.0))
    worker.add_task(TaskCost("piece", 0, -1, 5, 500, 0, 0.4))
    master = RankStats(rank=0, role="master")
    master.add("write", 0.05)
    fields: dict[str, Any] = dict(
        program="blastp", command=["paramedic", "search", "--batch", "4"], database="db/uni",
        manifest_sha256="ab" * 32, queries=10, ranks=2, workers=1, batches=2, fragments=2, pieces=2,
        strategy="fragments", search_batch_queries=6, regen_group_queries=6, blast_startup_seconds=0.05,
        wall_seconds=4.0, output="hits.txt", output_bytes=123_456, metadata_pairs=20, queries_with_hits=9,
        searched_again=0, ranks_stats=[master, worker],
    )  # fmt: skip
    fields.update(changes)
    return RunRecord(**fields)


SHIP = {
    "site": "tls://127.0.0.1:7700", "mode": "metadata", "codec": "blast-metadata", "streams": 4,
    "output_path": "hits.txt", "output_bytes": 123_456, "shipped_payload_bytes": 300, "setup_bytes": 900,
    "wire_bytes": 2000, "ratio_output_to_payload": 411.5, "chunks": 1, "chunks_resent": 0, "reconnects": 0,
    "f_encode_seconds": 0.01, "transfer_seconds": 0.2, "finish_wait_seconds": 0.5,
    "g_site_decode_seconds": 1.5, "site_sha256": "cd" * 32, "auto_decision": None,
}  # fmt: skip
PREDICTION = {
    "wall_seconds": 3.5, "efficiency": 0.7, "queries": 10, "workers": 1,
    "roles": {"workers": {"ranks": 1, "busy_seconds": 3.0, "idle_seconds": 0.5, "idle_seconds_per_rank": 0.5}},
}  # fmt: skip


def charts(page: str) -> list[str]:
    return re.findall(r'<div id="(chart-\d+)"', page)


def test_a_page_has_its_charts_and_fetches_nothing() -> None:
    page = render(record())
    assert charts(page) == [f"chart-{i}" for i in range(1, 6)]  # timeline, phases, bytes, balance, Eq. 3
    assert "<script src=" not in page and page.count("plotly.js v") >= 1  # embedded, not a CDN
    assert "Timeline" in page and "Staging" not in page and "Prediction" not in page


def test_shipping_and_a_prediction_add_what_they_measured() -> None:
    page = render(record(ship=SHIP), PREDICTION)
    assert len(charts(page)) == 6 and "Prediction beside the measured run" in page
    assert "411x" in page or "412x" in page  # the headline ratio
    assert "regenerate at the storage site" in page  # g, in the phase split
    # the prediction is of the search: the run's 4.0 s less its 0.5 s wait for the site is compared with it
    assert "3.5 s of it before it waited 0.5 s for the storage site" in page
    assert "before it waited" not in render(record(), PREDICTION)  # a run that ships nothing waits for none


def test_an_older_record_without_start_times_says_so() -> None:
    old = record()
    for stats in old.ranks_stats:
        stats.task_starts = []
    page = render(old)
    assert "no task start times" in page and len(charts(page)) == 4


def test_the_summary_says_up_to_and_what_batch_became() -> None:
    text = record(ship=SHIP).summary()
    assert "2 batches of up to 6 queries" in text and "2 regenerations of up to 6 queries" in text
    assert "--batch 4 became 6: a batch holds whole report pieces" in text
    assert "1 chunk," in text and "0 reconnects" in text
    exact = record(command=["paramedic", "search"], search_batch_queries=5, regen_group_queries=5).summary()
    assert "2 batches of 5 queries" in exact and "became" not in exact


def test_a_dropped_replica_is_in_the_summary() -> None:
    run = record()
    run.ranks_stats[1].stage = {"replicas": [{"replica": "/m/uni", "dropped": "corrupt: sha256 mismatch"}]}
    assert "  replica /m/uni dropped: corrupt: sha256 mismatch" in run.summary()


def test_the_bar_counts_searches_then_pieces(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PARAMEDIC_PROGRESS_FILE", str(tmp_path / "progress"))
    bar = Progress(10, quiet=False, searches=4, pieces=2)
    shown = lambda: (tmp_path / "progress").read_text().split()  # noqa: E731
    assert shown() == ["0", "6", "task"]
    bar.search_done()
    bar.search_done()
    assert shown() == ["2", "6", "task"]  # moving before any query is written
    bar.search_done()
    bar.search_done()
    bar.advance(5)
    assert shown() == ["5", "6", "task"]
    bar.advance(5)
    assert shown() == ["6", "6", "task"]
    bar.close()
    kept = Progress(10, quiet=False, searches=4, pieces=2)  # searches and pieces kept from an earlier run
    kept.finish()
    assert shown() == ["6", "6", "task"]  # full at the end, whatever was counted
    kept.close()
    queries = Progress(10, quiet=False)  # query segmentation: queries written
    queries.search_done()
    queries.advance(3)
    assert shown() == ["3", "10", "query"]
    queries.close()


def test_the_launchers_bar_is_not_drawn_again_after_close(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An update after close drew a second, bogus bar (30/30 at 1592773 query/s) below the summary."""
    progress = tmp_path / "progress"
    progress.write_text("3 6 task")
    bar = Bar(progress)
    bar.update()
    assert bar.bar is not None and bar.bar.total == 6 and bar.bar.unit == "task"
    progress.write_text("6 6 task")
    bar.write("paramedic: blastp 10 queries ...")  # the summary: the full bar is closed first
    assert bar.bar is None and bar.closed
    bar.update()
    assert bar.bar is None
    err = capsys.readouterr().err
    assert err.rstrip().endswith("paramedic: blastp 10 queries ...")  # no bar after the summary
