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
