"""The report page (issue 24): a real search writes it with --report, `paramedic report` writes it from
the record with a real `paramedic simulate` prediction, and a real headless Chromium opens both: no
JavaScript error, every chart drawn, a screenshot taken. The check itself is shown to catch a thrown error
and an empty chart."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.browser import chromium, load
from tests.support.databases import Databases

pytestmark = pytest.mark.integration

# Sections whose charts every fragments run has (a staging run adds one, a prediction one more)
BASE_CHARTS = 5  # timeline, phase split, load balance, bytes, Eq. 3


@pytest.fixture(scope="module")
def run(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real staged search of 16 queries over 3 fragments with a mirror, its page written by --report."""
    chromium()
    root = tmp_path_factory.mktemp("report")
    databases.place(root, 3000, fragments=3, out="db/uni")
    # the mirror is a copy of the same files: a second `paramedic format` is another database whenever
    # the two runs straddle a minute (makeblastdb writes its date into the volumes; CI failed so once)
    shutil.copytree(root / "db", root / "mirror")
    databases.queries(root / "q.fasta", 16)
    done = paramedic(
        "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", "hits.txt", "-evalue", "1e-5",
        "--strategy", "fragments", "--batch", "8", "--np", "2", "--stage", "stage", "--mirror", "mirror/uni",
        "--report", "page.html", cwd=root,
    )  # fmt: skip
    assert "report page: " in done.stderr
    return root


def test_search_report_page_opens_in_chromium_with_every_chart_drawn(run: Path, tmp_path: Path) -> None:
    page = run / "page.html"
    assert "<script src=" not in page.read_text()  # plotly.js embedded: nothing fetched
    shot = tmp_path / "report.png"
    loaded = load(page, tmp_path / "browser", screenshot=shot)
    assert loaded.errors == []
    assert len(loaded.charts) == BASE_CHARTS + 1  # + staging and mirrors
    assert all(loaded.charts.values()), f"empty charts: {[k for k, v in loaded.charts.items() if not v]}"
    assert shot.stat().st_size > 30_000  # a drawn page, not a blank one
    if os.environ.get("PARAMEDIC_SCREENSHOT"):  # where to keep it, e.g. for docs/report.png
        Path(os.environ["PARAMEDIC_SCREENSHOT"]).write_bytes(shot.read_bytes())


def test_report_command_with_a_prediction(run: Path, tmp_path: Path) -> None:
    record = run / "hits.txt.run.json"
    assert stat.S_IMODE(record.stat().st_mode) & 0o044 == 0o044  # readable by others, as the output
    predicted = paramedic(
        "simulate", "--record", str(record), "--query-file", str(run / "q.fasta"), "--workers", "2", "--json"
    )
    (tmp_path / "prediction.json").write_text(predicted.stdout)
    done = paramedic("report", str(record), "-o", "p.html", "--prediction", "prediction.json", cwd=tmp_path)
    assert "report page p.html" in done.stderr
    loaded = load(tmp_path / "p.html", tmp_path / "browser")
    assert loaded.errors == []
    assert len(loaded.charts) == BASE_CHARTS + 2 and all(loaded.charts.values())
    assert "Prediction beside the measured run" in loaded.dom


def test_report_command_refuses_what_is_not_a_record(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"version": 1}))
    for args, words in (
        (["x.json"], "run record version 1"),
        (["missing.json"], "cannot read the run record"),
    ):
        done = paramedic("report", *args, cwd=tmp_path, check=False)
        assert done.returncode == 3 and done.stderr.startswith("paramedic: error:"), done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_the_check_sees_a_thrown_error_and_an_empty_chart(tmp_path: Path) -> None:
    """The browser check can fail: a page with a script that throws and a chart with no data."""
    chromium()
    import plotly.graph_objects as go

    empty = go.Figure().to_html(full_html=False, include_plotlyjs=True, div_id="chart-1")
    drawn = go.Figure(go.Bar(x=[1], y=[2])).to_html(full_html=False, include_plotlyjs=False, div_id="chart-2")
    page = tmp_path / "bad.html"
    page.write_text(
        f"<!DOCTYPE html><html><head></head><body>{empty}{drawn}"
        "<script>throw new Error('boom')</script></body></html>"
    )
    loaded = load(page, tmp_path / "browser")
    assert any("boom" in e for e in loaded.errors)
    assert loaded.charts == {"chart-1": False, "chart-2": True}
