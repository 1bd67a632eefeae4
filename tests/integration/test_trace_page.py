"""The report page of a multi-million-record trace (issue 46, item 1): `paramedic report` on a synthetic CLOG2
file of 2.4 million records, opened in headless Chromium: no JavaScript error, the whole run on the time axis,
every rank drawn, and single calls where the zoomed window is one the page kept them for. The check is shown
to fail on a page that draws only the start of the run. With 1,024 ranks (2.5 million records) every rank
is a row of its own and the whole run still fits about one screen: rows of 2 px, every tenth named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.browser import Loaded, chromium, load
from tests.unit.test_trace_overview import synthetic

pytestmark = pytest.mark.integration

RANKS, PERIODS = 4, 75_000  # 8 records a period: 2.4 million records, 84 MB
SPAN = PERIODS * 1e-3 + 1e-4 + 3e-6  # the last rank's Finalize ends the run


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chromium()
    root = tmp_path_factory.mktemp("trace-page")
    (root / "big.clog2").write_bytes(synthetic(RANKS, PERIODS))
    done = paramedic("report", "big.clog2", "-o", "big.html", cwd=root)
    assert "big.html" in done.stderr
    return root / "big.html"


def data_of(page: Path) -> dict:
    text = page.read_text()
    return json.loads(text.split("<script id='data' type='application/json'>", 1)[1].split("</script>", 1)[0])


def chart(loaded: Loaded, div: str) -> dict[str, str]:
    """The data- attributes the page's script put on a chart's div."""
    head = loaded.dom.split(f'<div id="{div}"', 1)[1].split(">", 1)[0]
    return dict(re.findall(r'(data-[a-z]+)="([^"]*)"', head))


def overview_checks(loaded: Loaded) -> None:
    assert loaded.errors == []
    attrs = chart(loaded, "chart-1")
    start, end = (float(x) for x in attrs["data-range"].split(","))
    assert start == 0 and end == pytest.approx(SPAN, rel=1e-6), (start, end)
    assert int(attrs["data-ranks"]) == RANKS
    overview = loaded.dom.split('<div id="chart-1"', 1)[1].split('<div id="chart-2"', 1)[0]
    assert '<g class="hm"><image' in overview  # the cells
    assert all(f">rank {r}<" in overview for r in range(RANKS))
    ticks = [float(t) for t in re.findall(r'class="xtick"><text[^>]*data-unformatted="([0-9.]+)"', overview)]
    step = ticks[1] - ticks[0]
    assert min(ticks) == 0 and max(ticks) <= SPAN < max(ticks) + step  # the whole run on the axis, in seconds


def test_the_whole_run_is_drawn(page: Path, tmp_path: Path) -> None:
    assert page.stat().st_size < 8_000_000  # plotly.js (4.8 MB) and the bounded data
    loaded = load(page, tmp_path / "browser", screenshot=tmp_path / "page.png")
    overview_checks(loaded)
    assert loaded.charts["chart-2"]  # time per rank: bars
    assert loaded.dom.count("<td>8</td><td>1.000 ms</td>") == RANKS  # the period on every rank: 8 records
    # the phases (an MPI_Allreduce half, then a computing half): numbered over the rows, rows to click
    phases = data_of(page)["phases"]
    assert len(phases) == 2
    overview = loaded.dom.split('<div id="chart-1"', 1)[1].split('<div id="chart-2"', 1)[0]
    assert re.findall(r'class="annotation-text"[^>]*data-unformatted="(\d+)"', overview) == ["1", "2"]
    assert re.findall(r'<tr class="phase" data-phase="(\d+)"', loaded.dom) == ["0", "1"]
    assert (tmp_path / "page.png").stat().st_size > 30_000


def test_zoomed_in_single_calls_are_drawn(page: Path, tmp_path: Path) -> None:
    data = data_of(page)
    start, _, complete, calls = next(w for w in data["detail"]["windows"] if w[3] > 20)
    end = start + (complete - start) / 4
    zoomed = tmp_path / "zoomed.html"
    text = page.read_text()
    head = text.index("<head>") + len("<head>")
    zoomed.write_text(text[:head] + f"<script>location.hash='zoom={start},{end}'</script>" + text[head:])
    loaded = load(zoomed, tmp_path / "browser")
    assert loaded.errors == []
    attrs = chart(loaded, "chart-1")
    assert int(attrs["data-calls"]) > 0
    assert "single calls from" in loaded.dom and loaded.charts["chart-1"]  # bars drawn over the cells


def test_cells_by_their_share_in_mpi(page: Path, tmp_path: Path) -> None:
    text = page.read_text()
    head = text.index("<head>") + len("<head>")
    shares = tmp_path / "shares.html"
    shares.write_text(text[:head] + "<script>location.hash='cells=mpi'</script>" + text[head:])
    loaded = load(shares, tmp_path / "browser")
    overview_checks(loaded)
    overview = loaded.dom.split('<div id="chart-1"', 1)[1].split('<div id="chart-2"', 1)[0]
    assert "% in MPI" in overview  # the colour bar of the shares


def test_the_check_fails_on_a_page_of_the_first_records_only(page: Path, tmp_path: Path) -> None:
    """A page whose axis stops at the first 1% of the run (as the old page's 20,000 records did) fails."""
    text = (
        page.read_text()
        .replace("range:[0, D.span]", "range:[0, D.span/100]")
        .replace("update(asked ? [+asked[1], +asked[2]] : null);", "update([0, D.span/100]);")
    )
    short = tmp_path / "short.html"
    short.write_text(text)
    with pytest.raises(AssertionError):
        overview_checks(load(short, tmp_path / "browser"))


MANY, MANY_PERIODS = 1024, 300  # 2.5 million records, 89 MB


def test_every_rank_of_many_is_drawn_and_the_run_fits_a_screen(tmp_path: Path) -> None:
    chromium()
    (tmp_path / "many.clog2").write_bytes(synthetic(MANY, MANY_PERIODS))
    paramedic("report", "many.clog2", "-o", "many.html", cwd=tmp_path)
    page = tmp_path / "many.html"
    assert page.stat().st_size < 10_000_000  # plotly.js, at most 4.9 MB of cells, the rest
    loaded = load(page, tmp_path / "browser")
    assert loaded.errors == []
    attrs = chart(loaded, "chart-1")
    # the whole run: the last period's allreduce ends on the last rank, 1 us a rank late
    span = max(MANY_PERIODS * 1e-3 + 1e-4, (MANY_PERIODS - 1 + 0.97) * 1e-3 + (MANY - 1) * 1e-6)
    start, end = (float(x) for x in attrs["data-range"].split(","))
    assert start == 0 and end == pytest.approx(span, rel=1e-6), (start, end)
    assert int(attrs["data-ranks"]) == MANY  # every rank has cells
    overview = loaded.dom.split('<div id="chart-1"', 1)[1].split('<div id="chart-2"', 1)[0]
    image = re.search(r'<g class="hm"><image[^>]* height="([0-9.]+)"', overview)
    assert image is not None
    assert int(attrs["data-rowpx"]) == 2 and 2 * MANY <= float(image[1]) <= 2 * MANY + 40  # 2 px a rank
    named = {int(r) for r in re.findall(r">rank (\d+)<", overview)}
    assert named == set(range(0, MANY, 10))
    assert loaded.charts["chart-2"]  # time per rank
