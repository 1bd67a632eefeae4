"""The timeline page of a trace: one bar per call, one arrow per matched message, bounded, escaped."""

from __future__ import annotations

import pytest

from paramedic.trace import clog2
from paramedic.trace.timeline import render
from tests.unit.test_trace_codec import make_trace, periodic_kinds


def test_bars_and_arrows_match_the_trace():
    periods = 20
    page = render(make_trace([periodic_kinds(0, periods), periodic_kinds(1, periods)]), title="<run>")
    # per rank and period: Send, Recv, Allreduce; then Finalize once per rank (Init has no end here)
    assert page.count("<rect") == 2 * (3 * periods + 1)
    # every send is received: rank 0 -> 1 and 1 -> 0, once per period
    assert page.count("<line") == 2 * periods
    assert "&lt;run&gt;" in page and "<run>" not in page


def test_bounded_by_max_records():
    page = render(make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)]), max_records=100)
    assert page.count("<rect") <= 50
    assert "100 of 3,606 records drawn" in page


def test_not_a_trace_is_a_clear_error():
    with pytest.raises(clog2.TraceFormatError, match="not a CLOG2 file"):
        render(b"<html>" * 300)


def test_each_thread_nests_its_own_states():
    """Two threads of one rank (CLOG2 thread 1 and 2, MPI_THREAD_MULTIPLE) in calls at once: A starts, B
    starts, A ends, B ends. Kept on one stack per rank, A's end did not match B's start and A's bar was lost."""
    trace = clog2.read(make_trace([periodic_kinds(0, 1), periodic_kinds(1, 1)]))
    rec = trace.records
    rows = [i for i in range(len(rec)) if rec.head[i, 1] == 0 and rec.head[i, 3] == 5][1:5]  # Send, Recv...
    etypes = [20, 32, 21, 33]  # thread 1 starts state 10, thread 2 starts state 16, 10 ends, 16 ends
    for row, etype, thread in zip(rows, etypes, [1, 2, 1, 2], strict=True):
        rec.body[row, 0] = etype
        rec.head[row, 2] = thread
    page = render(clog2.write(trace))
    assert page.count("MPI_Send rank 0") + page.count("state 10 rank 0") == 1
    assert page.count("state 16 rank 0") + page.count("MPI_Recv rank 0") == 1


def test_legend_names_only_the_states_drawn():
    """A file defines every call the tracer wraps (132 states); the legend lists the ones on the page, with
    their calls and time, most time first (it listed all 132 in a block above LAMMPS's two rows)."""
    periods = 20
    page = render(make_trace([periodic_kinds(0, periods), periodic_kinds(1, periods)]))
    legend = page.split("</p>\n<p>", 1)[1].split("</p>", 1)[0]
    assert legend.count("<span") == 4  # Send, Recv, Allreduce, Finalize
    for state, calls in ((10, 2 * periods), (16, 2 * periods), (33, 2 * periods), (2, 2)):
        assert f">state {state}</span> {calls} calls, " in legend
    seconds = [float(part.split(" calls, ")[1].split(" s;")[0]) for part in legend.split("</span>")[1:]]
    assert seconds == sorted(seconds, reverse=True)
