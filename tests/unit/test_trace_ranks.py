"""CLOG2 records whose rank is not one of the file's world (issue 41, item 10): refused by the reader,
at once, whatever reads the file (ship, report)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from paramedic.trace import clog2
from tests.unit.test_trace_codec import make_trace, random_kinds


def with_ranks(data: bytes, ranks: np.ndarray) -> bytes:
    """The file with its records' ranks replaced (the preamble's world size kept)."""
    trace = clog2.read(data)
    trace.records.head[:, 1] = ranks
    return clog2.write(trace)


@pytest.mark.parametrize("rank", [2, -1, 2**31 - 1])
def test_a_rank_outside_the_world_is_refused(rank: int) -> None:
    data = make_trace([random_kinds(0, 50, 1), random_kinds(1, 50, 1)])
    ranks = clog2.read(data).records.head[:, 1].copy()
    ranks[17] = rank
    with pytest.raises(clog2.TraceFormatError, match=rf"rank {rank} is not one of the file's 2 ranks"):
        clog2.read(with_ranks(data, ranks))


def test_many_rank_values_are_refused_at_once() -> None:
    """The probe's file: 200,000 records, each with a rank of its own, in a world of 2."""
    data = make_trace([random_kinds(0, 100_000, 3), random_kinds(1, 100_000, 4)])
    hostile = with_ranks(data, np.arange(200_000, dtype=np.int32))
    started = time.perf_counter()
    with pytest.raises(clog2.TraceFormatError, match="is not one of the file's 2 ranks"):
        clog2.read(hostile)
    assert time.perf_counter() - started < 5
    assert len(clog2.read(data).records) == 200_000  # the same file with its own ranks reads
