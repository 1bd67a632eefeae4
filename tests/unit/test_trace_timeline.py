"""The report page of a trace (trace/timeline.py): the whole run's data for the page's script, escaped,
bounded whatever the trace's size, phases and period found on a synthetic run of two phases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paramedic.trace import clog2, overview, timeline
from tests.unit.test_trace_overview import synthetic


def data_of(page: str) -> dict:
    blob = page.split("<script id='data' type='application/json'>", 1)[1].split("</script>", 1)[0]
    return json.loads(blob)


def test_the_page_holds_the_whole_run():
    periods = 2000
    page = timeline.render(synthetic(3, periods), title="<run>")
    assert page.count("<script") == 3 and "<script src=" not in page  # plotly.js, the data, the drawing
    assert "&lt;run&gt;" in page and "<run>" not in page
    data = data_of(page)
    assert data["span"] == pytest.approx(periods * 1e-3 + 1e-4 + 2e-6)
    assert data["bins"] * data["width"] >= data["span"] > (data["bins"] - 1) * data["width"]
    names = [c[0] for c in data["categories"]]
    assert names[0] == "outside MPI" and names[1] == "MPI_Allreduce"  # the most time first
    assert {"MPI_Send", "MPI_Recv"} <= set(names)
    assert len(data["per_rank"]) == 3 and data["matrix"]["messages"][0][1] == periods
    assert {int(r): p[0] for r, p in data["periods"].items()} == {0: 8, 1: 8, 2: 8}
    # two phases: mostly MPI_Allreduce, then mostly outside MPI
    phases = [(names[p[2]], round(p[0] / data["span"], 1)) for p in data["phases"]]
    assert phases == [("MPI_Allreduce", 0.0), ("outside MPI", 0.5)]


def test_single_calls_kept_are_bounded_by_max_records():
    small = data_of(timeline.render(synthetic(2, 5000), max_records=640))
    kept = sum(w[3] for w in small["detail"]["windows"])
    assert 0 < kept <= 640
    for start, end, complete, calls in small["detail"]["windows"]:
        assert start <= complete <= end and calls <= 640 // overview.DETAIL_WINDOWS


def test_the_page_size_does_not_grow_with_the_trace():
    sizes = [len(timeline.render(synthetic(2, periods))) for periods in (5_000, 100_000)]
    assert abs(sizes[1] - sizes[0]) < 0.02 * sizes[0]
    assert max(sizes) < 4_900_000 + 1_000_000  # plotly.js and the data of 2 ranks


def test_top_cells_say_the_three_largest_shares():
    import numpy as np

    cells = np.zeros((1, 2, 5))
    cells[0, 0] = [0.1, 0.6, 0.0, 0.3, 0.0]
    out = timeline.top_cells(cells, 2)
    assert out[0, 0].tolist() == [1, 60, 3, 30, 0, 10, 90]  # then 90% in MPI (all but category 0)
    assert out[0, 1].tolist() == [255] * 7  # nothing traced


def test_not_a_trace_is_a_clear_error():
    with pytest.raises(clog2.TraceFormatError, match="not a CLOG2 file"):
        timeline.render(b"<html>" * 300)


def test_a_trace_of_more_states_than_the_page_colours():
    """600 distinct states (a damaged or hostile file): the page names the first ones and 'other states'."""
    import numpy as np

    n = 600
    etype = np.ravel(np.stack([2 * (np.arange(n) + 10), 2 * (np.arange(n) + 10) + 1], axis=1))
    t = np.arange(2 * n) * 1e-3
    head = np.zeros((2 * n, 4), np.int32)
    head[:, 3] = 5
    body = np.zeros((2 * n, clog2.BODY_WORDS), np.int32)
    body[:, 0] = etype
    rec = clog2.Records(t.view(np.uint64), head, body)
    table = clog2.world_comm_table()

    def file(fptr: int) -> bytes:
        preamble = clog2.make_preamble(1, fptr, 4096)
        return clog2.write(clog2.Trace(preamble, True, 4096, rec, (0, 0, 0), [], table))

    data = data_of(timeline.render(file(len(file(clog2.PREAMBLE_SIZE)) - len(table))))
    names = [c[0] for c in data["categories"]]
    assert len(names) <= timeline.MAX_CATEGORIES + 2 and names[-1] in ("other calls", "other states")
    assert sum(data["per_rank"][0]) == pytest.approx(2 * n * 1e-3 - 1e-3)


def test_phases_are_mixes_of_calls_cut_where_the_mix_changes():
    """A stretch whose calls alternate from bin to bin (an exchange and its wait) is one phase with its mix;
    the cuts fall on the bins where the mix changes (not on a 32nd of the run), and noise in the shares
    within a phase cuts nothing."""
    rng = np.random.default_rng(7)
    used, cuts = 640, (0, 200, 437, 640)
    cells = np.zeros((2, used, 4))  # 2 ranks; outside MPI, A, B, C
    cells[:, 0:200:2, 1] = 1.0  # A and B in turn
    cells[:, 1:200:2, 2] = 1.0
    cells[:, 200:437, 3] = rng.uniform(0.7, 1.0, (2, 237))  # mostly C, the rest outside MPI
    cells[:, 200:437, 0] = 1.0 - cells[:, 200:437, 3]
    cells[:, 437:, 0] = 1.0
    found = timeline.phases(cells, used, 0.5)
    assert [(a, b) for a, b, *_ in found] == [
        (lo * 0.5, hi * 0.5) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    assert [(c, round(s, 2), [[k, round(v, 2)] for k, v in o]) for _, _, c, s, o in found] == [
        (1, 0.5, [[2, 0.5]]),
        (3, round(cells[:, 200:437, 3].sum() / 474, 2), [[0, round(cells[:, 200:437, 0].sum() / 474, 2)]]),
        (0, 1.0, []),
    ]
    assert timeline.phases(cells[:, :40], 40, 0.5) == [(0.0, 20.0, 1, 0.5, [[2, 0.5]])]  # too short to cut
