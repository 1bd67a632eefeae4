"""A whole CLOG2 trace summarised in one pass with bounded memory, for the report page (trace/timeline.py).

The file is read a chunk of blocks at a time (`chunks`): no more than CHUNK_BYTES of records are held, so
a trace of any size is summarised in the same memory. What is kept, all bounded whatever the trace's size:

* `Bins`: per rank, time bin and state, the seconds spent in that MPI call (the outermost call of each
  thread: a nested state is inside its caller's time). The run's length is not known until its end, so
  the bins start 1 us wide and double (adjacent pairs summed) whenever a record falls past the last one,
  as a streaming histogram does; sums are exact at every width. Time outside MPI is each rank's traced
  span (first to last record) minus its calls, per bin.
* `Detail`: single calls for the page's zoom, DETAIL_WINDOWS stretches of the run (groups of bins, so
  they double with them) each keeping its first `budget / DETAIL_WINDOWS` calls; `cut` is the earliest
  start of a call left out, so a window is complete from its start up to `cut`.
* bytes and messages per (sender, receiver) pair, from the send records (MSGEVT -101);
* per rank, the first records' kinds, for the codec's FFT period (`codec.find_period`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from paramedic.trace import clog2, codec

CHUNK_BYTES = 32 << 20  # blocks read at once (the walk takes one numpy step per record of a block)
NBINS = 4096  # time bins over the whole run (fewer with many ranks: MAX_CELLS)
MAX_CELLS = 1 << 19  # ranks x bins held (and put in the page)
MAX_RANKS = 1 << 14
MAX_STATES = 256  # states with a column of their own (8 bytes a cell each); the rest share OTHER_STATE's
OTHER_STATE = -1
FIRST_WIDTH = 1e-6  # seconds: the bins' width before the first doubling
DETAIL_WINDOWS = 64
PERIOD_RECORDS = codec.PERIOD_WINDOW  # per rank, the records whose kinds find the period, as the codec's
PERIOD_TOTAL = 1 << 22  # ... and over all ranks (16 bytes each: fewer per rank with many ranks)
REC_STATEDEF, REC_BAREEVT, REC_MSGEVT = 2, 5, 7
BODY_USED = 5  # etype, icomm, peer, tag, bytes (a message's); a bare event's etype
SEND, RECV = -101, -102


# -- reading -------------------------------------------------------------------------------------------------


def _walk_chunk(rectypes: np.ndarray, nblocks: int, per_block: int, final: bool, at: int) -> np.ndarray:
    """The 8-byte slots where records start in `nblocks` consecutive blocks (each closed by ENDBLOCK, the
    file's last one by ENDLOG); TraceFormatError names the byte of what is wrong (`at`: the chunk's offset)."""
    j = np.arange(nblocks, dtype=np.int64) * per_block
    end = j + per_block
    block = np.arange(nblocks)
    starts: list[np.ndarray] = []
    while len(j):
        if (j + clog2.HEADER_SIZE // 8 > end).any():
            bad = int(block[np.argmax(j + clog2.HEADER_SIZE // 8 > end)])
            raise clog2.TraceFormatError(
                f"CLOG2 block at byte {at + bad * per_block * 8} has no ENDBLOCK record"
            )
        r = rectypes[j]
        if ((r < 0) | (r >= len(clog2.BODY_SIZE))).any():
            bad = int(j[np.argmax((r < 0) | (r >= len(clog2.BODY_SIZE)))])
            raise clog2.TraceFormatError(f"CLOG2 record at byte {at + 8 * bad}: unknown record type")
        done = r <= clog2.REC_ENDBLOCK
        endlog = done & (r == clog2.REC_ENDLOG)
        if (endlog & ~(final & (block == nblocks - 1))).any():
            raise clog2.TraceFormatError("CLOG2 ENDLOG record before the last block")
        keep = ~done
        j, end, block, r = j[keep], end[keep], block[keep], r[keep]
        starts.append(j)
        j = j + clog2.SLOT_SIZES[r]
    return np.sort(np.concatenate(starts)) if starts else np.zeros(0, np.int64)


def chunks(source: BinaryIO) -> Iterator[tuple[clog2.Preamble, clog2.Records, np.ndarray]]:
    """The file's records a chunk of blocks at a time, in file order (the whole file is never held), with
    the first BODY_USED words of each body (past a short body: the next record's words, never read); and
    the whole bodies of the chunk's state definitions."""
    source.seek(0, os.SEEK_END)
    size = source.tell()
    source.seek(0)
    pre = clog2.parse_preamble(source.read(clog2.PREAMBLE_SIZE), size)
    bo = ">" if pre.big_endian else "<"
    nblocks = (pre.commtable_fptr - clog2.PREAMBLE_SIZE) // pre.block_size
    if nblocks < 1:
        raise clog2.TraceFormatError("CLOG2 file has no blocks")
    step = max(1, CHUNK_BYTES // pre.block_size)
    for first in range(0, nblocks, step):
        count = min(step, nblocks - first)
        at = clog2.PREAMBLE_SIZE + first * pre.block_size
        data = source.read(count * pre.block_size)
        if len(data) != count * pre.block_size:
            raise clog2.TraceFormatError("CLOG2 file ends inside a block")
        words = np.frombuffer(data, dtype=f"{bo}i4").astype(np.int32)  # native: gathers are 4x faster
        slots = _walk_chunk(words[5::2], count, pre.block_size // 8, first + count == nblocks, at)
        time = np.frombuffer(data, f"{bo}u8")[slots].astype(np.uint64)
        head = clog2.word_rows(words, 4)[2 * slots + 2]
        bodies = 2 * slots + clog2.HEADER_SIZE // 4
        body = clog2.word_rows(words, BODY_USED)[bodies]
        defs = clog2.word_rows(words, clog2.BODY_WORDS)[bodies[head[:, 3] == REC_STATEDEF]]
        yield pre, clog2.Records(time, head, body), defs


# -- bins ----------------------------------------------------------------------------------------------------


@dataclass
class Bins:
    """Seconds per (rank, bin, state column) over [origin, origin + n * width), width doubling as needed."""

    ranks: int
    n: int = NBINS
    width: float = FIRST_WIDTH
    origin: float | None = None
    states: dict[int, int] = field(default_factory=dict)  # state id -> column
    time: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))

    def __post_init__(self) -> None:
        self.time = np.zeros((self.ranks, self.n, 0))

    def columns(self, states: np.ndarray) -> np.ndarray:
        """Each state's column, new states given one (a column is added: states are few); past MAX_STATES
        (a damaged or hostile file) the others share OTHER_STATE's."""
        for s in np.unique(states).tolist():
            if s not in self.states and len(self.states) < MAX_STATES:
                self._column(s)
        known = np.isin(states, np.asarray(list(self.states), np.int64))
        if not known.all():
            if OTHER_STATE not in self.states:
                self._column(OTHER_STATE)
            states = np.where(known, states, OTHER_STATE)
        lookup = np.asarray(sorted(self.states.items()), np.int64).reshape(-1, 2)
        return lookup[np.searchsorted(lookup[:, 0], states), 1]

    def _column(self, state: int) -> None:
        self.states[state] = len(self.states)
        self.time = np.concatenate([self.time, np.zeros((self.ranks, self.n, 1))], axis=2)

    def reach(self, t: float) -> int:
        """Double the width until `t` falls in the bins; returns the number of doublings."""
        if self.origin is None:
            self.origin = t
        doublings = 0
        while t >= self.origin + self.n * self.width:
            half = self.time.reshape(self.ranks, self.n // 2, 2, -1).sum(axis=2)
            self.time = np.concatenate([half, np.zeros_like(half)], axis=1)
            self.width *= 2
            doublings += 1
        return doublings

    def add(self, rank: np.ndarray, state: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """Calls [start, end) of `state` on `rank`, each split over the bins it covers."""
        if not len(start):
            return
        self.reach(float(end.max()))
        assert self.origin is not None
        col = self.columns(state)
        a = np.clip((start - self.origin) / self.width, 0, self.n)  # in bins; before the origin: at it
        b = np.clip((end - self.origin) / self.width, a, self.n)
        first = np.minimum(a.astype(np.int64), self.n - 1)
        last = np.minimum(np.ceil(b).astype(np.int64) - 1, self.n - 1)
        last = np.maximum(last, first)
        spans = last - first + 1
        idx = np.repeat(np.arange(len(a)), spans)
        k = np.arange(len(idx)) - np.repeat(np.cumsum(spans) - spans, spans) + first[idx]
        share = np.minimum(b[idx], k + 1) - np.maximum(a[idx], k)
        np.add.at(self.time, (rank[idx], k, col[idx]), np.maximum(share, 0) * self.width)


def outside(bins: Bins, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per (rank, bin): seconds of each rank's traced span [first, last] in the bin not spent in a call."""
    origin = bins.origin or 0.0
    lo = origin + np.arange(bins.n) * bins.width
    span = np.clip(np.minimum(lo + bins.width, last[:, None]) - np.maximum(lo, first[:, None]), 0, None)
    return np.clip(span - bins.time.sum(axis=2), 0, None)


# -- calls from state events ---------------------------------------------------------------------------------


@dataclass
class Calls:
    """Outermost calls [start, end) per (rank, thread) from bare state events, carried across chunks."""

    open: dict[tuple[int, int], tuple[int, float, int]] = field(default_factory=dict)  # depth, start, state

    def feed(
        self, rank: np.ndarray, thread: np.ndarray, etype: np.ndarray, t: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """The calls that ended among these events (in file order): rank, state, start, end."""
        if not len(rank):
            empty = np.zeros(0)
            return empty.astype(np.int64), empty.astype(np.int64), empty, empty
        key = rank.astype(np.int64) << 32 | (thread.astype(np.int64) & 0xFFFFFFFF)
        order = np.argsort(key, kind="stable")
        key, etype, t = key[order], etype[order], t[order]
        bounds = np.flatnonzero(np.diff(key)) + 1
        out: list[tuple[np.ndarray, ...]] = []
        for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(key)].tolist(), strict=True):
            k = int(key[lo])
            out.append(self._one((k >> 32, k & 0xFFFFFFFF), etype[lo:hi], t[lo:hi]))
        return tuple(np.concatenate(parts) for parts in zip(*out, strict=True))

    def _one(self, who: tuple[int, int], etype: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """One thread's events: depth kept at 0 or more (an end with no start is ignored), so a trace cut
        in a call still pairs the calls after it."""
        depth0, start0, state0 = self.open.get(who, (0, 0.0, 0))
        step = np.where(etype % 2 == 0, 1, -1)
        walk = depth0 + np.cumsum(step)
        depth = walk - np.minimum(np.minimum.accumulate(walk), 0)
        before = np.r_[depth0, depth[:-1]]
        opens = np.flatnonzero((step == 1) & (before == 0))
        closes = np.flatnonzero((step == -1) & (before == 1))
        starts, states = t[opens], etype[opens] // 2
        if depth0 > 0:
            starts, states = np.r_[start0, starts], np.r_[state0, states]
        n = len(closes)
        if int(depth[-1]) > 0:
            self.open[who] = (int(depth[-1]), float(starts[n]), int(states[n]))
        else:
            self.open.pop(who, None)
        rank = np.full(n, who[0], np.int64)
        return rank, states[:n].astype(np.int64), starts[:n], t[closes]


# -- detail --------------------------------------------------------------------------------------------------


@dataclass
class Detail:
    """Single calls kept for the page's zoom, per window (a group of bins): its first `per_window` calls
    that start in it, and every call that crosses its start (one at most per thread at any instant). A
    window is complete from its start up to `cut`, the earliest start of a call of its left out."""

    per_window: int
    windows: int = DETAIL_WINDOWS
    calls: list[list[np.ndarray]] = field(default_factory=list)  # per window: rank, state, start, end
    crossing: list[list[np.ndarray]] = field(default_factory=list)  # per window: calls over its start
    cut: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.calls = [_empty() for _ in range(self.windows)]
        self.crossing = [_empty() for _ in range(self.windows)]
        self.cut = np.full(self.windows, np.inf)

    def _keep(self, w: int, parts: list[np.ndarray]) -> None:
        """Window `w` gets `parts` up to its room; the earliest start left out lowers its cut."""
        room = max(self.per_window - len(self.calls[w][2]), 0)
        if len(parts[2]) > room:
            self.cut[w] = min(self.cut[w], float(parts[2][room:].min()))
        self.calls[w] = [np.concatenate([a, b[:room]]) for a, b in zip(self.calls[w], parts, strict=True)]

    def double(self) -> None:
        """The bins doubled: windows 2i and 2i+1 become window i (the calls over 2i+1's start are now
        inside it: they were offered to 2i when they ended)."""
        old, cut, crossing = self.calls, self.cut, self.crossing
        self.calls = [_empty() for _ in range(self.windows)]
        self.crossing = [_empty() for _ in range(self.windows)]
        self.cut = np.full(self.windows, np.inf)
        for i in range(self.windows // 2):
            self.calls[i], self.cut[i] = old[2 * i], min(cut[2 * i], cut[2 * i + 1])
            self.crossing[i] = crossing[2 * i]
            self._keep(i, old[2 * i + 1])

    def add(self, first: np.ndarray, last: np.ndarray, parts: tuple[np.ndarray, ...]) -> None:
        """Calls starting in window `first` and ending in window `last`."""
        for w in np.unique(first).tolist():
            pick = first == w
            self._keep(w, [p[pick] for p in parts])
        spans = last - first
        over = np.repeat(np.arange(len(first)), spans)  # each call once per window start it crosses
        window = first[over] + 1 + np.arange(len(over)) - np.repeat(np.cumsum(spans) - spans, spans)
        for w in np.unique(window).tolist():
            pick = over[window == w]
            self.crossing[w] = [
                np.concatenate([a, p[pick]]) for a, p in zip(self.crossing[w], parts, strict=True)
            ]

    def kept(self) -> list[np.ndarray]:
        """Every call kept, once: rank, state, start, end."""
        parts = [np.concatenate([c[i] for c in self.calls + self.crossing]) for i in range(4)]
        if not len(parts[2]):
            return parts
        keys = np.stack([parts[0].astype(np.float64), parts[2], parts[3]])
        _, once = np.unique(keys, axis=1, return_index=True)
        return [p[once] for p in parts]


def _empty() -> list[np.ndarray]:
    return [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)]


# -- the whole trace -----------------------------------------------------------------------------------------


@dataclass
class Summary:
    """What the page draws: everything bounded by the number of ranks, bins, states and the detail budget."""

    ranks: int
    records: int
    bins: Bins
    outside: np.ndarray  # (ranks, bins) seconds outside MPI
    first: np.ndarray  # per rank: its first and last record's time
    last: np.ndarray
    start: float  # the run's first record (the page's time zero) and last
    end: float
    state_names: dict[int, tuple[str, str]]  # state id -> name, CSS colour
    bytes: np.ndarray  # (ranks, ranks) sent from row to column
    messages: np.ndarray
    detail: Detail
    periods: dict[int, tuple[int, float]]  # rank -> period in records, its length in seconds


@dataclass
class _Pass:
    """The one pass's running state."""

    ranks: int
    budget: int
    bins: Bins = field(init=False)
    calls: Calls = field(default_factory=Calls)
    detail: Detail = field(init=False)
    records: int = 0
    names: dict[int, tuple[str, str]] = field(default_factory=dict)
    first: np.ndarray = field(init=False)
    last: np.ndarray = field(init=False)
    traffic: np.ndarray = field(init=False)  # (2, ranks, ranks): bytes, messages
    kinds: list[list[np.ndarray]] = field(init=False)  # per rank: kinds, times of its first records
    kept: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        nbins = max(DETAIL_WINDOWS, min(NBINS, MAX_CELLS // self.ranks))
        nbins = 1 << (nbins.bit_length() - 1)
        self.bins = Bins(self.ranks, nbins)
        self.detail = Detail(max(1, self.budget // DETAIL_WINDOWS))
        self.first = np.full(self.ranks, np.inf)
        self.last = np.full(self.ranks, -np.inf)
        self.traffic = (
            np.zeros((2, self.ranks, self.ranks), np.int64)
            if self.ranks <= 4096
            else np.zeros((2, 0, 0), np.int64)
        )
        self.kinds = [[] for _ in range(self.ranks)]
        self.kept = np.zeros(self.ranks, np.int64)

    def feed(self, rec: clog2.Records, defs: np.ndarray) -> None:
        self.records += len(rec)
        t = rec.seconds()
        rank, rectype = rec.head[:, 1], rec.head[:, 3]
        ok = np.isfinite(t) & (t < clog2.MAX_TIME) & (rank >= 0) & (rank < self.ranks)
        self._definitions(defs)
        if not ok.all():
            rec, t, rank, rectype = rec.take(np.flatnonzero(ok)), t[ok], rank[ok], rectype[ok]
        if not len(t):
            return
        np.minimum.at(self.first, rank, t)
        np.maximum.at(self.last, rank, t)
        self._period_window(rec, rank, t)
        self._messages(rec, rank, rectype)
        bare = (rectype == REC_BAREEVT) & (rec.body[:, 0] >= 0)
        if self.bins.origin is None:
            self.bins.origin = float(t.min())
        for _ in range(self.bins.reach(float(t.max()))):
            self.detail.double()
        got = self.calls.feed(rank[bare], rec.head[bare, 2], rec.body[bare, 0], t[bare])
        crank, cstate, cstart, cend = got
        self.bins.add(crank, cstate, cstart, cend)
        assert self.bins.origin is not None
        per = self.bins.n // DETAIL_WINDOWS
        first, last = (
            np.clip(((t - self.bins.origin) / self.bins.width).astype(np.int64) // per, 0, DETAIL_WINDOWS - 1)
            for t in (cstart, cend)
        )
        self.detail.add(first, last, got)

    def _definitions(self, defs: np.ndarray) -> None:
        for body in defs:
            colour = _text(body[4:10]).split()
            rgb = (
                "rgb({})".format(",".join(colour[:3]))
                if len(colour) >= 3 and all(c.isdigit() and int(c) < 256 for c in colour[:3])
                else "#888"
            )
            self.names[int(body[0])] = (_text(body[10:18]), rgb)

    def _messages(self, rec: clog2.Records, rank: np.ndarray, rectype: np.ndarray) -> None:
        if not self.traffic.shape[1]:
            return
        peer = rec.body[:, 2]
        send = (rectype == REC_MSGEVT) & (rec.body[:, 0] == SEND) & (peer >= 0) & (peer < self.ranks)
        np.add.at(self.traffic[0], (rank[send], peer[send]), np.maximum(rec.body[send, 4], 0))
        np.add.at(self.traffic[1], (rank[send], peer[send]), 1)

    def _period_window(self, rec: clog2.Records, rank: np.ndarray, t: np.ndarray) -> None:
        limit = max(64, min(PERIOD_RECORDS, PERIOD_TOTAL // self.ranks))
        if (self.kept >= limit).all():
            return
        kinds = codec.record_kinds(rec)
        for r in np.unique(rank).tolist():
            room = limit - int(self.kept[r])
            if room > 0:
                pick = np.flatnonzero(rank == r)[:room]
                self.kinds[r].append(np.stack([kinds[pick].astype(np.float64), t[pick]]))
                self.kept[r] += len(pick)

    def periods(self) -> dict[int, tuple[int, float]]:
        """The codec's FFT period of each rank's first records, and its median length in seconds."""
        out: dict[int, tuple[int, float]] = {}
        for r, parts in enumerate(self.kinds):
            if not parts:
                continue
            both = np.concatenate(parts, axis=1)
            kinds, t = both[0].astype(np.int64), both[1]
            p = codec.find_period(kinds)  # as the codec finds it (on the same first records)
            out[r] = (p, float(np.median(t[p:] - t[:-p])) if p else 0.0)
        return out

    def summary(self) -> Summary:
        seen = np.isfinite(self.first)
        start = float(self.first[seen].min()) if seen.any() else 0.0
        end = float(self.last[seen].max()) if seen.any() else 0.0
        if self.bins.origin is None:
            self.bins.reach(0.0)
        first = np.where(seen, self.first, 0.0)
        last = np.where(seen, self.last, 0.0)
        return Summary(
            self.ranks, self.records, self.bins, outside(self.bins, first, last), first, last, start, end,
            self.names, self.traffic[0], self.traffic[1], self.detail, self.periods(),
        )  # fmt: skip


def _text(words: np.ndarray) -> str:
    raw = words.astype(">i4").tobytes()
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def summarise(source: BinaryIO | bytes, budget: int = 20000) -> Summary:
    """The whole trace in one pass; `budget`: the single calls kept for zooming in (the page's bound)."""
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    state: _Pass | None = None
    for pre, rec, defs in chunks(stream):
        if state is None:
            if pre.world_size > MAX_RANKS:
                raise clog2.TraceFormatError(
                    f"the page draws at most {MAX_RANKS:,} ranks ({pre.world_size:,})"
                )
            state = _Pass(pre.world_size, budget)
        state.feed(rec, defs)
    assert state is not None
    return state.summary()
