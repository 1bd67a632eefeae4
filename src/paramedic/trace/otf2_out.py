"""A CLOG2 trace as an OTF2 archive (`paramedic convert TRACE.clog2 --otf2 DIR`), for Vampir, ViTE and
Score-P's tools, written with the OTF2 library itself (the `otf2` wheel of the Score-P developers, extra
`otf2`: its bundled libotf2 and its bindings of the C API).

The file is streamed twice, a chunk of blocks at a time (`overview.chunks`: bounded memory whatever its
size). The first pass checks it and finds what the definitions need: the ranks and threads, the states
called and their names (STATEDEF), the solo events (EVENTDEF), the first and last time. The second writes
the events, location by location as OTF2 wants them:

* every MPI call (a CLOG2 state: start and final bare events) as Enter/Leave of a region named by its MPI
  function, on the location of its rank and thread (a location group per rank, one system tree node);
* point-to-point messages (MSGEVT -101/-102) as MpiSend/MpiRecv with the peer, tag and bytes CLOG2
  records, on MPI_COMM_WORLD (the tracer records peers as ranks of MPI_COMM_WORLD);
* blocking collectives (COLLEVT) as MpiCollectiveBegin at the event and MpiCollectiveEnd before the
  call's Leave, with the root and the one byte count CLOG2 records (as bytes sent and received);
* times: CLOG2's seconds to integer nanoseconds (timer resolution 1 GHz, the tracer's clock), from the
  run's first record. A time before its location's previous event is moved up to it; a final event with
  no start is left out and a call still open at the end is closed at its location's last time, all
  counted in the result.

Memory: the chunk being converted (32 MB of records, about 300 MB of columns) plus at most CHUNKS of OTF2's
chunks per location (1 MiB, less with many locations, at least OTF2's 256 KiB), written as they fill
(`Memory`). The archive is written into a
temporary directory beside DIR and renamed to it once complete; any failure removes it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from paramedic.errors import InputError, OutputError, UsageError
from paramedic.trace import clog2, overview

ARCHIVE = "traces"  # DIR/traces.otf2 is what a viewer opens
TIMER_RESOLUTION = 1_000_000_000  # ticks per second: nanoseconds
MAX_THREADS = 1 << 10  # per rank
MAX_LOCATIONS = 1 << 14  # ranks x threads (the report page's bound on ranks too): a buffer and file each
BUFFER_BUDGET = 256 << 20  # OTF2's event buffers over all locations, when each can have less than 1 MiB
REC_EVENTDEF, REC_BAREEVT, REC_MSGEVT, REC_COLLEVT = 3, 5, 7, 8  # (STATEDEF's bodies: overview.chunks)
SEND, RECV = -101, -102
ENTER, LEAVE, MSG_SEND, MSG_RECV, COLL = 0, 1, 2, 3, 4
CHUNK_SIZE = 1 << 20  # OTF2's event chunk (at least its 256 KiB)
CHUNKS = 2  # OTF2 chunks a buffer holds before it is written to its file
SLICE = 1 << 16  # events handed to the library from one list of Python numbers
UNDEFINED = 0xFFFFFFFF  # OTF2_UNDEFINED_UINT32 (a root that is no rank)

# The blocking collectives a COLLEVT is written for (by the name of its state), and their region roles.
COLLECTIVES = {
    "MPI_Barrier": ("BARRIER", "BARRIER"),
    "MPI_Bcast": ("BCAST", "COLL_ONE2ALL"),
    "MPI_Scatter": ("SCATTER", "COLL_ONE2ALL"),
    "MPI_Scatterv": ("SCATTERV", "COLL_ONE2ALL"),
    "MPI_Gather": ("GATHER", "COLL_ALL2ONE"),
    "MPI_Gatherv": ("GATHERV", "COLL_ALL2ONE"),
    "MPI_Reduce": ("REDUCE", "COLL_ALL2ONE"),
    "MPI_Allgather": ("ALLGATHER", "COLL_ALL2ALL"),
    "MPI_Allgatherv": ("ALLGATHERV", "COLL_ALL2ALL"),
    "MPI_Alltoall": ("ALLTOALL", "COLL_ALL2ALL"),
    "MPI_Alltoallv": ("ALLTOALLV", "COLL_ALL2ALL"),
    "MPI_Alltoallw": ("ALLTOALLW", "COLL_ALL2ALL"),
    "MPI_Allreduce": ("ALLREDUCE", "COLL_ALL2ALL"),
    "MPI_Reduce_scatter": ("REDUCE_SCATTER", "COLL_ALL2ALL"),
    "MPI_Reduce_scatter_block": ("REDUCE_SCATTER_BLOCK", "COLL_ALL2ALL"),
    "MPI_Scan": ("SCAN", "COLL_OTHER"),
    "MPI_Exscan": ("EXSCAN", "COLL_OTHER"),
}
POINT2POINT = ("Send", "Recv", "Isend", "Irecv", "Ssend", "Bsend", "Rsend", "Issend", "Sendrecv", "Mrecv")


def library() -> tuple[Any, Any]:
    """The OTF2 bindings (`_otf2`, the C API) and their enums, or exit 2 saying how to install them."""
    try:
        import _otf2  # type: ignore[import-not-found,import-untyped,unused-ignore]
        from otf2 import enums  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as exc:
        raise UsageError(
            "paramedic convert --otf2 needs the OTF2 library's Python bindings: pip install 'paramedic[otf2]' "
            f"(the otf2 wheel; `make setup` installs it) ({exc})"
        ) from exc
    return _otf2, enums


# -- the first pass ------------------------------------------------------------------------------------------


@dataclass
class Scan:
    """What the definitions need, from the first pass."""

    world: int = 0
    records: int = 0
    first: float = np.inf
    last: float = -np.inf
    locations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rank << 32 | thread
    states: dict[int, str] = field(default_factory=dict)  # state id -> name (STATEDEF)
    etypes: dict[int, tuple[int, int]] = field(default_factory=dict)  # etype -> (state, ENTER/LEAVE)
    solo: set[int] = field(default_factory=set)  # EVENTDEF etypes: not states
    used: set[int] = field(default_factory=set)  # states with events


def _text(words: np.ndarray, bo: str) -> str:
    return words.astype(f"{bo}i4").tobytes().split(b"\0", 1)[0].decode("ascii", "replace")


def _check(pre: clog2.Preamble, rec: clog2.Records) -> np.ndarray:
    """The records' times, refused in one line when a record is not of the file's ranks, has a thread past
    MAX_THREADS or a time that is no time."""
    t = rec.seconds()
    rank, thread = rec.head[:, 1], rec.head[:, 2]
    bad = (rank < 0) | (rank >= pre.world_size)
    if bad.any():
        raise clog2.TraceFormatError(
            f"CLOG2 record of rank {int(rank[np.argmax(bad)])}: not one of the file's {pre.world_size} ranks"
        )
    bad = (thread < 0) | (thread >= MAX_THREADS)
    if bad.any():
        raise clog2.TraceFormatError(f"CLOG2 record of thread {int(thread[np.argmax(bad)])}: not a thread")
    if not np.all(np.isfinite(t) & (np.abs(t) < clog2.MAX_TIME)):
        raise clog2.TraceFormatError("CLOG2 record with a time that is not a time")
    return t


def scan(source: BinaryIO) -> Scan:
    """The first pass over the whole file (TraceFormatError: what is wrong with it)."""
    out = Scan()
    keys: list[np.ndarray] = []
    etypes: set[int] = set()
    for pre, rec, defs in overview.chunks(source):
        bo = ">" if pre.big_endian else "<"
        for body in defs:  # STATEDEF: state id, start etype, final etype, pad, colour, name
            state, start, final = (int(x) for x in body[:3])
            out.states[state] = _text(body[10:18], bo) or f"state {state}"
            out.etypes[start], out.etypes[final] = (state, ENTER), (state, LEAVE)
        out.world = pre.world_size
        out.records += len(rec)
        if not len(rec):
            continue
        t = _check(pre, rec)
        out.first, out.last = min(out.first, float(t.min())), max(out.last, float(t.max()))
        rectype = rec.head[:, 3]
        keys.append(np.unique(rec.head[:, 1].astype(np.int64) << 32 | rec.head[:, 2]))
        if len(keys) > 64:
            keys = [np.unique(np.concatenate(keys))]
        out.solo.update(rec.body[rectype == REC_EVENTDEF, 0].tolist())
        bare = rec.body[rectype == REC_BAREEVT, 0]
        etypes.update(np.unique(bare[bare >= 0]).tolist())
    if out.world == 0:
        raise clog2.TraceFormatError("CLOG2 file has no blocks")
    # states once every definition is known (a state's definition may come after its first event)
    out.used = {out.etypes.get(e, (e // 2, e % 2))[0] for e in etypes if e not in out.solo}
    world = np.arange(out.world, dtype=np.int64) << 32  # thread 0 of every rank: the ranks of MPI_COMM_WORLD
    out.locations = np.unique(np.concatenate([world, *keys]))
    if len(out.locations) > MAX_LOCATIONS:
        raise clog2.TraceFormatError(f"CLOG2 file has more than {MAX_LOCATIONS:,} ranks and threads")
    if not np.isfinite(out.first):
        out.first = out.last = 0.0
    return out


# -- the second pass: events ---------------------------------------------------------------------------------


@dataclass
class Plan:
    """How records become events: region per state, collective per state, the time origin."""

    scan: Scan
    regions: dict[int, int]  # state -> region ref
    collective: dict[int, Any]  # state -> OTF2 collective op (blocking collectives)
    base: int  # the first record's time in ns: tick 0
    etype_keys: np.ndarray = field(init=False)
    etype_kind: np.ndarray = field(init=False)  # per etype: ENTER/LEAVE, or -1 (a solo event)
    etype_region: np.ndarray = field(init=False)
    etype_state: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        rows = sorted(self.scan.etypes.items())
        self.etype_keys = np.asarray([e for e, _ in rows], np.int64)
        self.etype_kind = np.asarray([k for _, (_, k) in rows], np.int64)
        self.etype_state = np.asarray([s for _, (s, _) in rows], np.int64)
        self.etype_region = np.asarray([self.regions.get(s, -1) for _, (s, _) in rows], np.int64)

    def states_of(self, etype: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per bare event's etype: ENTER/LEAVE (-1: not a state's), its region ref, its state."""
        at = np.minimum(np.searchsorted(self.etype_keys, etype), max(len(self.etype_keys) - 1, 0))
        known = self.etype_keys[at] == etype if len(self.etype_keys) else np.zeros(len(etype), bool)
        state = np.where(known, self.etype_state[at] if len(self.etype_keys) else 0, etype // 2)
        kind = np.where(known, self.etype_kind[at] if len(self.etype_keys) else 0, etype % 2)
        lookup = np.asarray(sorted(self.regions.items()), np.int64).reshape(-1, 2)
        where = np.minimum(np.searchsorted(lookup[:, 0], state), max(len(lookup) - 1, 0))
        found = lookup[where, 0] == state if len(lookup) else np.zeros(len(etype), bool)
        region = np.where(found, lookup[where, 1] if len(lookup) else 0, -1)
        solo = np.isin(etype, np.asarray(sorted(self.scan.solo), np.int64)) | (etype < 0) | (region < 0)
        return np.where(solo, -1, kind), region, state


@dataclass
class Events:
    """One chunk's events in file order, as columns: location, kind, tick, then per kind: region (enter,
    leave); peer, tag, bytes (messages); state, root, bytes (collectives)."""

    loc: np.ndarray
    kind: np.ndarray
    tick: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray


def events(plan: Plan, rec: clog2.Records, last: np.ndarray) -> tuple[Events, int, int]:
    """A chunk's records as events; `last` (per location: its latest tick so far) is updated. Also the
    number of times moved up to their location's previous event, and of messages left out (their peer is
    no rank of the file)."""
    rectype, etype = rec.head[:, 3], rec.body[:, 0].astype(np.int64)
    kind = np.full(len(rec), -1, np.int64)
    a = np.zeros(len(rec), np.int64)
    b = np.zeros(len(rec), np.int64)
    c = np.zeros(len(rec), np.int64)
    bare = np.flatnonzero(rectype == REC_BAREEVT)
    k, region, _ = plan.states_of(etype[bare])
    kind[bare], a[bare] = k, region
    peer = rec.body[:, 2].astype(np.int64)
    msg = (rectype == REC_MSGEVT) & ((etype == SEND) | (etype == RECV))
    no_peer = int(np.count_nonzero(msg & ((peer < 0) | (peer >= plan.scan.world))))
    msg &= (peer >= 0) & (peer < plan.scan.world)
    kind[msg] = np.where(etype[msg] == SEND, MSG_SEND, MSG_RECV)
    a[msg], b[msg] = peer[msg], rec.body[msg, 3].astype(np.int64) & 0xFFFFFFFF
    c[msg] = np.maximum(rec.body[msg, 4], 0)
    coll = np.flatnonzero(rectype == REC_COLLEVT)
    if len(coll):
        _, _, state = plan.states_of(etype[coll])
        blocking = np.isin(state, np.asarray(sorted(plan.collective), np.int64))
        coll = coll[blocking]
        kind[coll], a[coll] = COLL, state[blocking]
        root = rec.body[coll, 1].astype(np.int64)
        b[coll] = np.where((root >= 0) & (root < plan.scan.world), root, UNDEFINED)
        c[coll] = np.maximum(rec.body[coll, 2], 0)
    keep = np.flatnonzero(kind >= 0)
    key = rec.head[keep, 1].astype(np.int64) << 32 | rec.head[keep, 2]
    loc = np.searchsorted(plan.scan.locations, key)
    tick = np.rint(rec.seconds()[keep] * 1e9).astype(np.int64) - plan.base
    moved = 0
    for where in np.unique(loc).tolist():  # each location's ticks never go back
        mine = np.flatnonzero(loc == where)
        fixed = np.maximum.accumulate(np.r_[last[where], tick[mine]])[1:]
        moved += int(np.count_nonzero(fixed != tick[mine]))
        tick[mine] = fixed
        last[where] = fixed[-1]
    return Events(loc, kind[keep], tick, a[keep], b[keep], c[keep]), moved, no_peer


# -- writing -------------------------------------------------------------------------------------------------


@dataclass
class Counts:
    """What was written and what was mended (the result of `convert`)."""

    records: int = 0
    locations: int = 0
    regions: int = 0
    enters: int = 0
    leaves: int = 0
    sends: int = 0
    receives: int = 0
    collectives: int = 0
    events: int = 0
    moved: int = 0  # times moved up to their location's previous event
    unmatched: int = 0  # final events with no start: left out
    closed: int = 0  # calls still open at their location's end (or under a final event): closed
    no_peer: int = 0  # messages whose peer is no rank of the file: left out
    flushes: int = 0  # OTF2 buffers written to their files as they filled
    per_location: dict[int, tuple[int, int]] = field(default_factory=dict)  # location -> rank, thread


class Writer:
    """An OTF2 archive being written: the C API through the wheel's bindings, the event calls bound once
    (ctypes function pointers of the wheel's libotf2: 1 call per event, no per-call set-up)."""

    def __init__(self, path: Path, scan: Scan, regions: dict[int, int], creator: str) -> None:
        self.lib, self.enums = library()
        from _otf2.Config import conf  # type: ignore[import-not-found,import-untyped,unused-ignore]

        e = self.enums
        self.scan, self.regions = scan, regions
        n = len(scan.locations)
        chunk = max(256 << 10, min(CHUNK_SIZE, BUFFER_BUDGET // max(n, 1)))
        self.archive = self.lib.Archive_Open(
            str(path), ARCHIVE, e.FileMode.WRITE, chunk, 4 << 20, e.FileSubstrate.POSIX, e.Compression.NONE
        )
        self.flush = self.lib.FlushCallbacks(pre_flush=lambda *_: e.FlushType.FLUSH, post_flush=None)
        self.lib.Archive_SetFlushCallbacks(self.archive, self.flush, None)
        self.memory = Memory(conf.lib, self.archive)
        self.lib.Archive_SetSerialCollectiveCallbacks(self.archive)
        self.lib.Archive_SetCreator(self.archive, creator)
        self.lib.Archive_OpenEvtFiles(self.archive)
        self.lib.Archive_OpenDefFiles(self.archive)
        self.writers = [self.lib.Archive_GetEvtWriter(self.archive, i) for i in range(n)]
        self.defs = [self.lib.Archive_GetDefWriter(self.archive, i) for i in range(n)]
        self.handles = [ctypes.cast(w, ctypes.c_void_p).value for w in self.writers]

        def bound(name: str, *args: Any) -> Callable[..., int]:
            fn = conf.lib[name]  # a function pointer of our own: the wheel's wrappers keep theirs
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, *args]
            fn.restype = ctypes.c_int
            return fn  # type: ignore[no-any-return]

        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        self.enter = bound("OTF2_EvtWriter_Enter", u32)
        self.leave = bound("OTF2_EvtWriter_Leave", u32)
        self.send = bound("OTF2_EvtWriter_MpiSend", u32, u32, u32, u64)
        self.recv = bound("OTF2_EvtWriter_MpiRecv", u32, u32, u32, u64)
        self.begin = bound("OTF2_EvtWriter_MpiCollectiveBegin")
        self.end = bound("OTF2_EvtWriter_MpiCollectiveEnd", ctypes.c_uint8, u32, u32, u64, u64)
        self.stacks: list[list[int]] = [[] for _ in range(n)]
        self.pending: list[tuple[int, int, int, int] | None] = [None] * n  # depth, op, root, bytes
        self.last = np.zeros(n, np.int64)
        self.counts = Counts()

    def write(self, ev: Events, ops: dict[int, int]) -> None:
        """A chunk's events, in order (a call's Leave after its collective's end), a slice at a time: as
        Python numbers, a million events would take 200 MB."""
        for at in range(0, len(ev.loc), SLICE):
            part = slice(at, at + SLICE)
            rows = zip(
                ev.loc[part].tolist(), ev.kind[part].tolist(), ev.tick[part].tolist(), ev.a[part].tolist(),
                ev.b[part].tolist(), ev.c[part].tolist(), strict=True,
            )  # fmt: skip
            self._rows(rows, ops)
        counts = self.counts
        counts.enters += int(np.count_nonzero(ev.kind == ENTER))
        counts.sends += int(np.count_nonzero(ev.kind == MSG_SEND))
        counts.receives += int(np.count_nonzero(ev.kind == MSG_RECV))
        if len(ev.loc):
            np.maximum.at(self.last, ev.loc, ev.tick)

    def _rows(self, rows: Iterator[tuple[int, int, int, int, int, int]], ops: dict[int, int]) -> None:
        enter, leave, send, recv, begin = self.enter, self.leave, self.send, self.recv, self.begin
        handles, stacks, pending = self.handles, self.stacks, self.pending
        failed = 0
        for loc, kind, t, a, b, c in rows:
            w = handles[loc]
            if kind == ENTER:
                stacks[loc].append(a)
                failed |= enter(w, None, t, a)
            elif kind == LEAVE:
                stack = stacks[loc]
                if stack and stack[-1] == a and pending[loc] is None:
                    stack.pop()
                    failed |= leave(w, None, t, a)
                else:
                    failed |= self._leave(loc, t, a)
            elif kind == MSG_SEND:
                failed |= send(w, None, t, a, 0, b, c)
            elif kind == MSG_RECV:
                failed |= recv(w, None, t, a, 0, b, c)
            elif stacks[loc] and pending[loc] is None and a in ops:  # a collective inside its call
                pending[loc] = (len(stacks[loc]), ops[a], b, c)
                failed |= begin(w, None, t)
        if failed:
            raise OutputError(f"the OTF2 library failed writing events (error {failed})")

    def _leave(self, loc: int, t: int, region: int) -> int:
        """A final event off the fast path: it ends a collective, or calls inside it were left open (closed
        here), or it has no start (left out)."""
        stack, failed = self.stacks[loc], 0
        if region not in stack:
            self.counts.unmatched += 1
            return 0
        while True:
            left, code = self._close(loc, t)
            failed |= code
            if left == region:
                return failed
            self.counts.closed += 1

    def _close(self, loc: int, t: int) -> tuple[int, int]:
        """Leave the innermost open call of `loc` at `t` (its collective's end first): its region, and
        the library's error code."""
        stack, w, failed = self.stacks[loc], self.handles[loc], 0
        pending = self.pending[loc]
        if pending is not None and pending[0] == len(stack):
            _, op, root, size = pending
            failed |= self.end(w, None, t, op, 0, root, size, size)
            self.pending[loc] = None
            self.counts.collectives += 1
        region = stack.pop()
        return region, failed | self.leave(w, None, t, region)

    def finish(self, names: dict[int, str], description: str) -> None:
        """Close what is open, then the definitions: clock, strings, system tree, location groups per rank,
        locations per thread, regions, MPI_COMM_WORLD."""
        failed = 0
        for loc in range(len(self.stacks)):
            while self.stacks[loc]:
                failed |= self._close(loc, int(self.last[loc]))[1]
                self.counts.closed += 1
        if failed:
            raise OutputError(f"the OTF2 library failed writing events (error {failed})")
        lib, e, a = self.lib, self.enums, self.archive
        sizes = []
        for w, d in zip(self.writers, self.defs, strict=True):
            sizes.append(int(lib.EvtWriter_GetNumberOfEvents(w)))
            lib.Archive_CloseEvtWriter(a, w)
            lib.Archive_CloseDefWriter(a, d)
        lib.Archive_CloseEvtFiles(a)
        lib.Archive_CloseDefFiles(a)
        self.counts.events = sum(sizes)
        self.counts.leaves = self.counts.enters  # every call closed once
        g = lib.Archive_GetGlobalDefWriter(a)
        strings: dict[str, int] = {}

        def string(text: str) -> int:
            if text not in strings:
                strings[text] = len(strings)
                lib.GlobalDefWriter_WriteString(g, strings[text], text)
            return strings[text]

        length = int(max(self.last.max(initial=0), 0))
        lib.GlobalDefWriter_WriteClockProperties(g, TIMER_RESOLUTION, 0, length, lib.UNDEFINED_TIMESTAMP)
        string("")
        lib.GlobalDefWriter_WriteSystemTreeNode(
            g, 0, string(description), string("machine"), lib.UNDEFINED_SYSTEM_TREE_NODE
        )
        for rank in range(self.scan.world):
            lib.GlobalDefWriter_WriteLocationGroup(
                g, rank, string(f"rank {rank}"), e.LocationGroupType.PROCESS, 0, lib.UNDEFINED_LOCATION_GROUP
            )
        first: dict[int, int] = {}
        for ref, key in enumerate(self.scan.locations.tolist()):
            rank, thread = key >> 32, key & 0xFFFFFFFF
            first.setdefault(rank, ref)
            self.counts.per_location[ref] = (rank, thread)
            lib.GlobalDefWriter_WriteLocation(
                g, ref, string(f"rank {rank} thread {thread}"), e.LocationType.CPU_THREAD, sizes[ref], rank
            )
        for state, ref in sorted(self.regions.items(), key=lambda kv: kv[1]):
            name = names.get(state, f"state {state}")
            role = region_role(name)
            paradigm = e.Paradigm.MPI if name.startswith("MPI_") else e.Paradigm.USER
            lib.GlobalDefWriter_WriteRegion(
                g, ref, string(name), string(name), string(""), getattr(e.RegionRole, role), paradigm,
                e.RegionFlag.NONE, string(""), 0, 0,
            )  # fmt: skip
        ranks = [first[r] for r in range(self.scan.world)]
        mpi = e.Paradigm.MPI
        lib.GlobalDefWriter_WriteGroup(
            g, 0, string(""), e.GroupType.COMM_LOCATIONS, mpi, e.GroupFlag.NONE, ranks
        )
        world = list(range(self.scan.world))
        lib.GlobalDefWriter_WriteGroup(g, 1, string(""), e.GroupType.COMM_GROUP, mpi, e.GroupFlag.NONE, world)
        lib.GlobalDefWriter_WriteComm(g, 0, string("MPI_COMM_WORLD"), 1, lib.UNDEFINED_COMM, e.CommFlag.NONE)
        lib.Archive_CloseGlobalDefWriter(a, g)
        lib.Archive_Close(a)
        self.archive = None
        self.counts.locations = len(sizes)
        self.counts.flushes = self.memory.refused
        self.counts.regions = len(self.regions)

    def abandon(self) -> None:
        if self.archive is not None:
            try:
                self.lib.Archive_Close(self.archive)
            except Exception:  # the directory is removed anyway
                pass
            self.archive = None


# OTF2's memory callbacks (otf2/OTF2_Callbacks.h): allocate(userData, fileType, location, perBufferData,
# chunkSize) and free_all(userData, fileType, location, perBufferData, final). Declared here: the wheel's
# declaration of allocate leaves out userData.
_ALLOCATE = ctypes.CFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_uint64,
)  # fmt: skip
_FREE_ALL = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p), ctypes.c_bool
)


class _MemoryCallbacks(ctypes.Structure):
    _fields_ = [("allocate", _ALLOCATE), ("free_all", _FREE_ALL)]


class Memory:
    """OTF2's buffers held to CHUNKS chunks each: without memory callbacks libotf2 mallocs a chunk whenever
    one fills and writes nothing before the archive closes (a 140 MB trace's conversion grew by 90 MB);
    when `allocate` says no, it flushes the buffer to its file and reuses the chunks."""

    def __init__(self, lib: Any, archive: Any) -> None:
        self.held: dict[tuple[int, int], list[Any]] = {}
        self.refused = 0  # buffers written to their files before the end
        self.callbacks = _MemoryCallbacks(_ALLOCATE(self.allocate), _FREE_ALL(self.free_all))
        fn = lib["OTF2_Archive_SetMemoryCallbacks"]
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_MemoryCallbacks), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        code = fn(ctypes.cast(archive, ctypes.c_void_p), ctypes.byref(self.callbacks), None)
        if code:
            raise OutputError(f"the OTF2 library refused its memory callbacks (error {code})")

    def allocate(self, _user: int, kind: int, location: int, _per: Any, size: int) -> int | None:
        chunks = self.held.setdefault((kind, location), [])
        if len(chunks) >= CHUNKS:
            self.refused += 1
            return None  # libotf2 flushes this buffer, then asks again
        chunks.append(ctypes.create_string_buffer(size))
        return ctypes.addressof(chunks[-1])

    def free_all(self, _user: int, kind: int, location: int, _per: Any, _final: bool) -> None:
        self.held.pop((kind, location), None)


def region_role(name: str) -> str:
    """The OTF2 region role of an MPI function's region."""
    if name in COLLECTIVES:
        return COLLECTIVES[name][1]
    if name.startswith("MPI_") and name[4:] in POINT2POINT:
        return "POINT2POINT"
    return "FUNCTION"


def plan_of(found: Scan, enums: Any) -> Plan:
    regions = {state: ref for ref, state in enumerate(sorted(found.used))}
    collective = {
        state: getattr(enums.CollectiveOp, COLLECTIVES[name][0])
        for state, name in found.states.items()
        if name in COLLECTIVES and state in regions
    }
    return Plan(found, regions, collective, int(np.rint(found.first * 1e9)))


def convert(trace: Path, out: Path, creator: str = "paramedic") -> Counts:
    """Write the OTF2 archive of the CLOG2 file `trace` as the directory `out` (streamed twice; nothing at
    `out` unless complete). InputError: the trace; OutputError: the directory."""
    _, enums = library()
    if trace.exists() and not trace.is_file():
        raise InputError(f"{trace}: not a regular file (a CLOG2 trace is read twice)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"{out}: already exists (give a new directory, or an empty one)")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise OutputError(f"{out}: no directory {parent}")
    with trace.open("rb") as fh:
        found = scan(fh)
        plan = plan_of(found, enums)
        ops = {state: int(op.value) for state, op in plan.collective.items()}  # the enum's uint8
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=parent))
        writer: Writer | None = None
        try:
            writer = Writer(work, found, plan.regions, creator)
            fh.seek(0)
            last = np.full(len(found.locations), np.iinfo(np.int64).min, np.int64)
            moved = 0
            for _, rec, _ in overview.chunks(fh):
                ev, shifted, no_peer = events(plan, rec, last)
                moved += shifted
                writer.counts.no_peer += no_peer
                writer.write(ev, ops)
            writer.finish(found.states, trace.name)
            counts = writer.counts
            counts.records, counts.moved = found.records, moved
            mask = os.umask(0)
            os.umask(mask)
            work.chmod(0o777 & ~mask)  # mkdtemp's 0700: the archive is the user's as any file it writes
            _sync(work)
            if out.is_dir():
                out.rmdir()  # empty (checked above): the archive takes its place
            os.rename(work, out)
            _fsync_dir(parent)
        except BaseException:
            if writer is not None:
                writer.abandon()
            shutil.rmtree(work, ignore_errors=True)
            raise
    return counts


def _sync(root: Path) -> None:
    """Every file and directory of the archive on disk before it is renamed into place."""
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file():
            with path.open("rb+") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():
            _fsync_dir(path)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def summary_line(counts: Counts) -> str:
    mended = []
    if counts.moved:
        mended.append(f"{counts.moved:,} times moved up to their location's previous event")
    if counts.unmatched:
        mended.append(f"{counts.unmatched:,} final events with no start left out")
    if counts.closed:
        mended.append(f"{counts.closed:,} calls left open closed")
    if counts.no_peer:
        mended.append(f"{counts.no_peer:,} messages with no rank of the file as peer left out")
    return (
        f"{counts.events:,} events on {counts.locations:,} locations from {counts.records:,} records: "
        f"{counts.enters:,} calls (Enter/Leave), {counts.sends:,} sends, {counts.receives:,} receives, "
        f"{counts.collectives:,} collectives" + (f"; {', '.join(mended)}" if mended else "")
    )
