"""The reference merge of the tracer's per-process logs into one CLOG2 file, by time, and the tree
merge's summary.

The tracer merges inside MPI_Finalize, along a binary tree of the processes, as MPE2 does
(native/clogtrace_merge.h); rank 0 writes the file and a summary that `read_summary` reads. `merge` here
is the same merge done in one Python process from logs kept with PARAMEDIC_TRACE_KEEP: a k-way merge by
(corrected time, rank), the order the tree's three-way merges give. The tests compare the two byte for
byte.

Each process's clock is corrected to rank 0's: the library measured the offset at MPI_Init and at
MPI_Finalize, and a record's correction is interpolated linearly between the two (clock drift). Times stay
integers of nanoseconds until the end, and become seconds since rank 0's MPI_Init (`ns / 1e9`). Each process's
two offsets are recorded in the file as TIMESHIFT records (rectype 11), as MPE2 does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paramedic.trace import clog2

MAGIC = 0x5052544345544D50
TRAILER = struct.Struct("<7q")
REC_STATEDEF, REC_COMMEVT, REC_TIMESHIFT = 2, 9, 11
MAX_RAW_BYTES = 1 << 34


class MergeError(clog2.TraceFormatError):
    """A process's log is missing or damaged (the traced program did not reach MPI_Finalize?)."""


@dataclass
class RankLog:
    rank: int
    ns: np.ndarray  # int64 local clock, per record
    head: np.ndarray
    body: np.ndarray
    t_init: int
    off_init: int
    t_fini: int
    off_fini: int
    dropped: int


def read_rank(path: Path, rank: int) -> RankLog:
    """One process's log: records in the CLOG2 record layout (native order, time as int64 ns) between a
    16-byte head and a trailer (record count, dropped message events, times and offsets, magic)."""
    try:
        size = path.stat().st_size
        if size > MAX_RAW_BYTES:
            raise MergeError(f"trace log {path} is too large")
        data = path.read_bytes()
    except OSError as exc:
        raise MergeError(
            f"no trace log for rank {rank} ({exc.strerror}): did it reach MPI_Finalize?"
        ) from exc
    if len(data) < 16 + TRAILER.size or struct.unpack_from("<Q", data)[0] != MAGIC:
        raise MergeError(f"trace log of rank {rank} is not one of paramedic's")
    count, dropped, t_init, off_init, t_fini, off_fini, magic = TRAILER.unpack_from(
        data, len(data) - TRAILER.size
    )
    if magic != MAGIC:
        raise MergeError(f"trace log of rank {rank} is incomplete: did it reach MPI_Finalize?")
    end = len(data) - TRAILER.size
    offsets: list[int] = []
    pos = 16
    while pos < end:
        if pos + clog2.HEADER_SIZE > end:
            raise MergeError(f"trace log of rank {rank} ends inside a record")
        rectype = struct.unpack_from("<i", data, pos + 20)[0]
        if not 2 <= rectype < len(clog2.BODY_SIZE):
            raise MergeError(f"trace log of rank {rank}: bad record type {rectype}")
        offsets.append(pos)
        pos += clog2.HEADER_SIZE + clog2.BODY_SIZE[rectype]
    if pos != end or len(offsets) != count:
        raise MergeError(f"trace log of rank {rank} holds {len(offsets)} records, its trailer says {count}")
    view = np.frombuffer(data, np.uint8)
    off = np.asarray(offsets, np.int64)
    ns = view[off[:, None] + np.arange(8)].copy().view("<i8").reshape(-1) if count else np.zeros(0, np.int64)
    head = (
        view[off[:, None] + 8 + np.arange(16)].copy().view("<i4").reshape(-1, 4)
        if count
        else np.zeros((0, 4), np.int32)
    )
    body = (
        clog2.gather_bodies(view, off, head[:, 3], "<")
        if count
        else np.zeros((0, clog2.BODY_WORDS), np.int32)
    )
    # strings (state names and colours, communicator ids) are bytes, not numbers: keep their byte order
    for rectype in (REC_STATEDEF, REC_COMMEVT):
        rows = head[:, 3] == rectype
        body[rows, 4:] = body[rows, 4:].byteswap()
    return RankLog(rank, ns, head.astype(np.int32), body, t_init, off_init, t_fini, off_fini, dropped)


def corrected(log: RankLog) -> np.ndarray:
    """The log's times on rank 0's clock (ns): the offset interpolated between MPI_Init and MPI_Finalize."""
    span = max(log.t_fini - log.t_init, 1)
    slope = (log.off_fini - log.off_init) / span
    if abs(slope) >= 0.5:  # not a drift: two offsets too noisy for so short a run (as the tree merge says)
        slope = 0.0
    shift = log.off_init + np.rint((log.ns - log.t_init) * slope).astype(np.int64)
    return log.ns + shift


def timeshift_words(seconds: float) -> list[int]:
    """A float64 as the two int32 words of a big-endian body."""
    hi, lo = struct.unpack(">ii", struct.pack(">d", seconds))
    return [hi, lo]


def merge(directory: Path, world_size: int) -> tuple[bytes, dict[str, object]]:
    """The merged CLOG2 file of the run whose logs are in `directory`, and a summary (records per rank,
    clock offsets) for the run record."""
    logs = [read_rank(directory / f"rank-{r}.raw", r) for r in range(world_size)]
    base = logs[0].t_init + logs[0].off_init
    parts: list[clog2.Records] = []
    times: list[np.ndarray] = []
    for log in logs:
        ns = corrected(log) - base
        extra_ns = []
        extra_head = []
        extra_body = []
        for t, off in ((log.t_init, log.off_init), (log.t_fini, log.off_fini)):
            extra_ns.append(t + off - base)
            extra_head.append([0, log.rank, 0, REC_TIMESHIFT])
            extra_body.append(timeshift_words(off / 1e9) + [0] * (clog2.BODY_WORDS - 2))
        all_ns = np.concatenate([ns, np.asarray(extra_ns, np.int64)])
        head = np.concatenate([log.head, np.asarray(extra_head, np.int32)])
        body = np.concatenate([log.body, np.asarray(extra_body, np.int32)])
        order = np.argsort(all_ns, kind="stable")
        all_ns = all_ns[order]
        seconds = all_ns / 1e9
        parts.append(clog2.Records(seconds.view(np.uint64), head[order], body[order]))
        times.append(all_ns)
    records = clog2.Records.concat(parts)
    order = np.argsort(np.concatenate(times), kind="stable")
    records = records.take(order)
    table = clog2.world_comm_table()
    trace = clog2.Trace(
        clog2.make_preamble(world_size, 0), True, clog2.DEFAULT_BLOCK_SIZE, records, (0, 0, 0), [], table
    )
    data = clog2.write(trace)
    # the preamble holds the communicator table's offset, known once the blocks are packed
    data = clog2.make_preamble(world_size, len(data) - len(table)) + data[clog2.PREAMBLE_SIZE :]
    summary = {
        "ranks": world_size,
        "records": {str(log.rank): int(len(log.ns)) for log in logs},
        "dropped_message_events": {str(log.rank): log.dropped for log in logs if log.dropped},
        "clock_offset_ns": {str(log.rank): [log.off_init, log.off_fini] for log in logs},
    }
    return data, summary


SUMMARY_MAGIC = 0x594D4D5553544D50
SUMMARY_HEAD = struct.Struct("<4q")
STATUS = {
    1: "its log could not be read back",
    2: "its records were out of time order (MPI called from several threads at once?)",
    3: "a child's stream was damaged",
    4: "the merged file could not be written",
    5: "its log could not be written (disk full?)",
}


def read_summary(path: Path) -> dict[str, object]:
    """The tree merge's summary (records per rank, clock offsets, the merge's time) for the run record;
    MergeError when the merge failed or did not finish."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MergeError(
            "the ranks' tree merge did not finish (no summary from rank 0): did every rank reach MPI_Finalize?"
        ) from exc
    if len(data) < SUMMARY_HEAD.size:
        raise MergeError("the tree merge's summary is damaged")
    magic, size, status, merge_ns = SUMMARY_HEAD.unpack_from(data)
    body = data[SUMMARY_HEAD.size :]
    rows = np.frombuffer(body, "<i8").reshape(-1, 9) if size > 0 and len(body) % 72 == 0 else None
    if magic != SUMMARY_MAGIC or rows is None or len(rows) != size:
        raise MergeError("the tree merge's summary is damaged")
    if status:
        bad = [str(r) for r in range(size) if rows[r, 4]]
        where = f" (rank {', '.join(bad)})" if bad else ""
        raise MergeError(
            f"the ranks' tree merge failed{where}: {STATUS.get(int(status), f'status {status}')}"
        )
    records, dropped, off_init, off_fini = (rows[:, i].tolist() for i in range(4))
    logged, calls, events, cut_ns = (rows[:, i].tolist() for i in range(5, 9))
    left_out = {
        str(r): {
            "from_seconds": cut_ns[r] / 1e9 if cut_ns[r] >= 0 else None,
            "calls": int(calls[r]),
            "events": int(events[r]),
        }
        for r in range(size)
        if calls[r] or events[r]
    }
    return {
        "ranks": size,
        "merge": "binary tree in MPI_Finalize",
        "merge_seconds": round(merge_ns / 1e9, 3),
        "records": {str(r): int(records[r]) for r in range(size)},
        "dropped_message_events": {str(r): int(dropped[r]) for r in range(size) if dropped[r]},
        "clock_offset_ns": {str(r): [int(off_init[r]), int(off_fini[r])] for r in range(size)},
        # bytes of each rank's records in the file (its own and its two TIMESHIFT records)
        "rank_bytes": {str(r): int(logged[r]) + 64 for r in range(size)},
        # what --max-trace-size left out, per rank: from when (seconds on the trace's clock), how many
        # calls, and how many message or collective events of the call it stopped in
        "left_out": left_out,
    }
