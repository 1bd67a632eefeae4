"""The one-pass summary of a trace (trace/overview.py): time bins that double, calls from nested state events
carried across chunks, the kept single calls, the pair matrix and the period, checked against plain loops."""

from __future__ import annotations

import io

import numpy as np
import pytest

from paramedic.trace import clog2, overview

# A synthetic run's states: (id, name, colour); a call of state s starts with event 2s and ends with 2s+1
STATES = ((10, "MPI_Send", "255 0 0"), (16, "MPI_Recv", "0 255 0"), (33, "MPI_Allreduce", "0 0 255"))
# one period of a rank: (slot's offset in the period, rectype, etype); messages go to the next rank
SLOTS = [
    (0.00, 5, 20), (0.01, 7, -101), (0.02, 5, 21),  # send
    (0.03, 5, 32), (0.04, 7, -102), (0.05, 5, 33),  # receive
    (0.10, 5, 66), (0.90, 5, 67),  # a long allreduce (the first half of the run) ...
]  # fmt: skip
LATE = {6: 0.95, 7: 0.97}  # ... then a short allreduce after a long computation (second half)


def _words(text: str, n: int) -> np.ndarray:
    return np.frombuffer(text.encode().ljust(4 * n, b"\0"), ">i4").astype(np.int32)


def synthetic_records(
    ranks: int, periods: int, first: int = 0, total: int | None = None, period_s: float = 1e-3
) -> clog2.Records:
    """Periods [first, first + periods) of a run of `total` periods (SLOTS, 8 records each, on every rank),
    in time order; the definitions when the part is the run's start, Finalize when it is its end."""
    total = periods if total is None else total
    k = len(SLOTS)
    offsets = np.asarray([s[0] for s in SLOTS])
    late = offsets.copy()
    for slot, at in LATE.items():
        late[slot] = at
    p = np.arange(first, first + periods)
    per_rank = np.where((p < total // 2)[:, None], offsets, late) * period_s + (p * period_s)[:, None]
    last = first + periods == total
    n = periods * k + 2 * last
    times, heads, bodies = [], [], []
    for r in range(ranks):
        body = np.zeros((n, clog2.BODY_WORDS), np.int32)
        body[: periods * k, 0] = np.tile([s[2] for s in SLOTS], periods)
        body[: periods * k, 2] = np.tile(
            [(r + 1) % ranks if s[2] == -101 else (r - 1) % ranks for s in SLOTS], periods
        )
        body[: periods * k, 4] = np.tile([800 if s[2] == -101 else 0 for s in SLOTS], periods)
        head = np.zeros((n, 4), np.int32)
        head[:, 1] = r
        head[:, 3] = [s[1] for s in SLOTS] * periods + [5, 5] * last
        t = per_rank.reshape(-1) + r * 1e-6
        if last:  # Finalize
            body[-2:, 0] = [4, 5]
            t = np.r_[t, total * period_s, total * period_s + 1e-4]
        times.append(t)
        heads.append(head)
        bodies.append(body)
    for state, name, colour in STATES if first == 0 else ():  # definitions first, at time 0 on rank 0
        body = np.zeros((1, clog2.BODY_WORDS), np.int32)
        body[0, :3] = [state, 2 * state, 2 * state + 1]
        body[0, 4:10] = _words(colour, 6)
        body[0, 10:18] = _words(name, 8)
        times.insert(0, np.zeros(1))
        heads.insert(0, np.asarray([[0, 0, 0, 2]], np.int32))
        bodies.insert(0, body)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return clog2.Records(
        t[order].view(np.uint64), np.concatenate(heads)[order], np.concatenate(bodies)[order]
    )


def synthetic(ranks: int, periods: int, period_s: float = 1e-3, block_size: int = 65536) -> bytes:
    """A CLOG2 file of `ranks` ranks each running `periods` periods of SLOTS (8 records), then Finalize:
    built with numpy and clog2.write, so millions of records take seconds."""
    rec = synthetic_records(ranks, periods, period_s=period_s)
    table = clog2.world_comm_table()

    def file(fptr: int) -> bytes:
        trace = clog2.Trace(
            clog2.make_preamble(ranks, fptr, block_size), True, block_size, rec, (0, 0, 0), [], table
        )
        return clog2.write(trace)

    probe = file(clog2.PREAMBLE_SIZE)
    return file(len(probe) - len(table))


def naive_bins(n: int, width: float, origin: float, calls: list[tuple[int, int, float, float]]) -> dict:
    """Seconds per (rank, bin, state) by a plain loop over each call's bins."""
    out: dict[tuple[int, int, int], float] = {}
    for rank, state, start, end in calls:
        for b in range(n):
            lo, hi = origin + b * width, origin + (b + 1) * width
            share = min(end, hi) - max(start, lo)
            if share > 0:
                out[(rank, b, state)] = out.get((rank, b, state), 0.0) + share
    return out


def test_bins_match_a_plain_loop_and_double_without_losing_time():
    rng = np.random.default_rng(3)
    bins = overview.Bins(ranks=3, n=64)
    bins.origin = 0.0
    calls = []
    for _ in range(5):  # five chunks, the later ones further out: the bins double in between
        start = np.sort(rng.uniform(0, 1e-4 * 4 ** len(calls[:1]) * (1 + len(calls) / 10), 50))
        end = start + rng.exponential(2e-6, 50)
        rank = rng.integers(0, 3, 50)
        state = rng.choice([10, 16, 33], 50)
        bins.add(rank, state, start, end)
        calls += list(zip(rank.tolist(), state.tolist(), start.tolist(), end.tolist(), strict=True))
    assert bins.width > overview.FIRST_WIDTH  # it doubled
    expect = naive_bins(bins.n, bins.width, 0.0, calls)
    got = {
        (r, b, s): float(bins.time[r, b, c])
        for r in range(3)
        for b in range(bins.n)
        for s, c in bins.states.items()
        if bins.time[r, b, c] > 0
    }
    assert got.keys() == expect.keys()
    assert all(got[k] == pytest.approx(expect[k], rel=1e-9, abs=1e-15) for k in got)


def test_a_call_over_many_bins_is_split_exactly():
    bins = overview.Bins(ranks=1, n=8, width=1.0)
    bins.origin = 0.0
    bins.add(np.asarray([0]), np.asarray([7]), np.asarray([0.5]), np.asarray([6.25]))
    assert bins.time[0, :, 0].tolist() == [0.5, 1, 1, 1, 1, 1, 0.25, 0]
    bins.add(np.asarray([0]), np.asarray([7]), np.asarray([7.0]), np.asarray([9.0]))  # past the end: doubles
    assert bins.width == 2.0 and bins.time[0, :, 0].tolist() == [1.5, 2, 2, 1.25, 1, 0, 0, 0]


def test_outside_mpi_is_the_traced_span_minus_the_calls():
    bins = overview.Bins(ranks=2, n=4, width=1.0)
    bins.origin = 0.0
    bins.add(np.asarray([0]), np.asarray([10]), np.asarray([0.5]), np.asarray([1.5]))
    out = overview.outside(bins, np.asarray([0.0, 2.5]), np.asarray([4.0, 3.0]))
    assert out.tolist() == [[0.5, 0.5, 1, 1], [0, 0, 0.5, 0]]


def feed_all(events: list[tuple[int, int, int, float]], cut: int) -> list[tuple]:
    """Calls from (rank, thread, etype, time) events fed in two chunks split at `cut`."""
    calls = overview.Calls()
    out = []
    for part in (events[:cut], events[cut:]):
        cols = [np.asarray(c) for c in zip(*part, strict=True)] if part else [np.zeros(0, np.int64)] * 4
        r, s, a, b = calls.feed(cols[0], cols[1], cols[2], cols[3].astype(float))
        out += list(zip(r.tolist(), s.tolist(), a.tolist(), b.tolist(), strict=True))
    return sorted(out)


def test_calls_are_outermost_per_thread_across_chunks():
    events = [
        (0, 0, 20, 1.0),  # rank 0 thread 0: Send ...
        (0, 1, 32, 1.5),  # rank 0 thread 1: Recv, at the same time
        (0, 0, 66, 2.0),  # a call inside Send: part of Send's time
        (0, 0, 67, 2.5),
        (0, 1, 33, 3.0),
        (1, 0, 21, 3.2),  # rank 1: an end with no start (the trace began in the call): ignored
        (1, 0, 20, 3.4),
        (0, 0, 21, 4.0),
        (1, 0, 21, 5.0),
    ]
    expect = [(0, 10, 1.0, 4.0), (0, 16, 1.5, 3.0), (1, 10, 3.4, 5.0)]
    for cut in range(len(events) + 1):  # wherever the chunks are cut, the same calls
        assert feed_all(events, cut) == expect, cut


def test_detail_windows_are_complete_up_to_their_cut():
    """Every call over a window before its cut was kept (those that began in an earlier window too),
    however the windows doubled."""
    rng = np.random.default_rng(5)
    detail = overview.Detail(per_window=5, windows=8)
    width = 1.0  # of a window
    calls: list[tuple[float, float]] = []
    for round_ in range(4):
        start = np.sort(rng.uniform(0, 8 * width * (1 + round_), 40))
        end = start + rng.exponential(0.7, 40)
        while end.max() >= 8 * width:
            detail.double()
            width *= 2
        got = (np.arange(40) + 40 * round_, np.full(40, 10), start, end)
        detail.add((start // width).astype(np.int64), (end // width).astype(np.int64), got)
        calls += list(zip(start.tolist(), end.tolist(), strict=True))
    rank, _, start, end = detail.kept()
    kept = set(zip(start.tolist(), end.tolist(), strict=True))
    assert len(kept) == len(start)  # once each
    assert sum(len(c[2]) for c in detail.calls) <= 5 * 8
    for w in range(8):
        lo = w * width
        hi = min(detail.cut[w], lo + width)
        over = {(a, b) for a, b in calls if a < hi and b > lo and (a >= lo or b > lo)}
        assert over <= kept, w


def test_summary_of_a_synthetic_run():
    ranks, periods = 3, 400
    data = synthetic(ranks, periods)
    summary = overview.summarise(io.BytesIO(data), budget=640)
    assert summary.records == len(clog2.read(data).records)
    names = {s: summary.state_names.get(s, ("Finalize", ""))[0] for s in summary.bins.states}
    seconds = {names[s]: summary.bins.time[:, :, c].sum(axis=1) for s, c in summary.bins.states.items()}
    # per rank: 400 sends and receives of 20 us each, 200 allreduces of 800 us and 200 of 20 us
    assert seconds["MPI_Send"] == pytest.approx([periods * 2e-5] * ranks)
    assert seconds["MPI_Recv"] == pytest.approx([periods * 2e-5] * ranks)
    assert seconds["MPI_Allreduce"] == pytest.approx([200 * 8e-4 + 200 * 2e-5] * ranks)
    span = summary.last - summary.first
    inside = summary.bins.time.sum(axis=(1, 2))
    assert summary.outside.sum(axis=1) == pytest.approx(span - inside)
    assert summary.messages.tolist() == [[0, periods, 0], [0, 0, periods], [periods, 0, 0]]
    assert summary.bytes.sum() == 800 * periods * ranks
    assert {r: p for r, (p, _) in summary.periods.items()} == {0: 8, 1: 8, 2: 8}
    assert summary.periods[0][1] == pytest.approx(1e-3, rel=1e-6)
    assert sum(len(c[2]) for c in summary.detail.calls) <= 640


def test_the_summary_is_the_same_whatever_the_chunk_size(monkeypatch):
    data = synthetic(2, 3000, block_size=4096)
    whole = overview.summarise(data)
    monkeypatch.setattr(overview, "CHUNK_BYTES", 4096 * 3)  # many chunks, a call cut between two
    parts = overview.summarise(data)
    assert parts.bins.width == whole.bins.width and parts.bins.states.keys() == whole.bins.states.keys()
    for state, col in whole.bins.states.items():
        assert np.allclose(
            parts.bins.time[:, :, parts.bins.states[state]], whole.bins.time[:, :, col], rtol=1e-12
        )


def test_damaged_files_are_one_clear_error():
    data = bytearray(synthetic(2, 50, block_size=4096))
    with pytest.raises(clog2.TraceFormatError, match="not a CLOG2 file"):
        overview.summarise(b"<html>" * 300)
    bad = bytearray(data)
    bad[clog2.PREAMBLE_SIZE + 20 : clog2.PREAMBLE_SIZE + 24] = (99).to_bytes(4, "big")  # a record's type
    with pytest.raises(clog2.TraceFormatError, match="unknown record type"):
        overview.summarise(bytes(bad))
    with pytest.raises(clog2.TraceFormatError):
        overview.summarise(bytes(data[:-5000]))  # cut: the table's offset is past the end


def test_states_past_the_bound_share_one_column():
    """A damaged or hostile file with a million distinct states: the bins keep MAX_STATES + 1 columns."""
    bins = overview.Bins(ranks=1, n=8, width=1.0)
    bins.origin = 0.0
    n = 1000
    state = np.arange(n) + 10
    bins.add(np.zeros(n, np.int64), state, np.linspace(0, 7, n), np.linspace(0, 7, n) + 0.001)
    assert len(bins.states) == overview.MAX_STATES + 1 and overview.OTHER_STATE in bins.states
    assert bins.time.shape[2] == overview.MAX_STATES + 1
    assert bins.time.sum() == pytest.approx(n * 0.001)  # no time lost
    other = bins.time[0, :, bins.states[overview.OTHER_STATE]].sum()
    assert other == pytest.approx((n - overview.MAX_STATES) * 0.001)


def test_a_chunk_holds_a_bounded_number_of_records(monkeypatch):
    monkeypatch.setattr(overview, "CHUNK_BYTES", 8192)
    data = synthetic(2, 2000, block_size=4096)
    sizes = [len(rec) for _, rec, _ in overview.chunks(io.BytesIO(data))]
    assert sum(sizes) == len(clog2.read(data).records)
    assert max(sizes) <= 8192 // clog2.HEADER_SIZE and len(sizes) > 10
