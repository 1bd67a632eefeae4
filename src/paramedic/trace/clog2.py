"""CLOG2 files, MPE2's trace format: read with validation (the input is untrusted), write in MPE2's layout.

A file is a 1,024-byte text preamble (NUL-separated "name=" and value strings: version, byte order, block
size, world size, event-id ranges, the communicator table's offset), then blocks of `block_size` bytes, each a
run of records (a 24-byte header: double time, int32 icomm, rank, thread, rectype; then a body whose size the
rectype fixes), closed by an ENDBLOCK record (the last block by ENDLOG), then the communicator table (int32
count, then 40 bytes per communicator). MPE2 writes merged files big-endian; both orders are read.

Records are held as columns: `time` (the float64's bit pattern, uint64), `head` (icomm, rank, thread,
rectype: int32) and `body` (the body as up to 28 int32 words, zero beyond the body's size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from paramedic.errors import InputError

PREAMBLE_SIZE = 1024
HEADER_SIZE = 24
VERSION = "CLOG-02.44"
DEFAULT_BLOCK_SIZE = 65536
MAX_BLOCK_SIZE = 1 << 30
MAX_TIME = 100000000.0  # CLOG_MAXTIME: the ENDLOG record's time
BODY_WORDS = 28
REC_ENDLOG, REC_ENDBLOCK = 0, 1
# body bytes by rectype: ENDLOG, ENDBLOCK, STATEDEF, EVENTDEF, CONSTDEF, BAREEVT, CARGOEVT, MSGEVT,
# COLLEVT, COMMEVT, SRCLOC, TIMESHIFT (MPE2's clog_record.h)
BODY_SIZE = (0, 0, 112, 104, 40, 8, 40, 24, 16, 48, 48, 8)
REC_NAMES = (
    "ENDLOG",
    "ENDBLOCK",
    "STATEDEF",
    "EVENTDEF",
    "CONSTDEF",
    "BAREEVT",
    "CARGOEVT",
    "MSGEVT",
    "COLLEVT",
    "COMMEVT",
    "SRCLOC",
    "TIMESHIFT",
)
COMM_RECORD = 40  # the communicator table's entries: 32-byte global id, int32 local id, int32 kind


class TraceFormatError(InputError):
    """Not a CLOG2 file, or a damaged one."""


@dataclass
class Records:
    """Records in file order (without ENDBLOCK and ENDLOG), as columns."""

    time: np.ndarray  # uint64: the float64 time's bits
    head: np.ndarray  # int32 (n, 4): icomm, rank, thread, rectype
    body: np.ndarray  # int32 (n, BODY_WORDS), zero beyond the body

    def __len__(self) -> int:
        return len(self.time)

    def take(self, index: np.ndarray) -> Records:
        return Records(self.time[index], self.head[index], self.body[index])

    @staticmethod
    def concat(parts: list[Records]) -> Records:
        if not parts:
            return empty_records()
        return Records(
            np.concatenate([p.time for p in parts]),
            np.concatenate([p.head for p in parts]),
            np.concatenate([p.body for p in parts]),
        )

    def seconds(self) -> np.ndarray:
        return self.time.view(np.float64)


def empty_records() -> Records:
    return Records(np.zeros(0, np.uint64), np.zeros((0, 4), np.int32), np.zeros((0, BODY_WORDS), np.int32))


@dataclass
class Trace:
    """A whole CLOG2 file: what is needed to write it back byte for byte (`write`)."""

    preamble: bytes
    big_endian: bool
    block_size: int
    records: Records
    end_head: tuple[int, int, int]  # icomm, rank, thread of the ENDBLOCK and ENDLOG records
    tails: list[bytes]  # per block, the bytes after its ENDBLOCK/ENDLOG (b"" when all zero)
    commtable: bytes


@dataclass
class Preamble:
    fields: dict[str, str]
    big_endian: bool
    block_size: int
    world_size: int
    commtable_fptr: int


def make_preamble(world_size: int, commtable_fptr: int, block_size: int = DEFAULT_BLOCK_SIZE) -> bytes:
    """The preamble MPE2's merger writes (big-endian, finalized)."""
    giga = 1 << 30
    values: list[tuple[str, str]] = [
        ("is_big_endian=", "TRUE "),
        ("is_finalzed=", "TRUE "),  # sic: MPE2's spelling
        ("block_size=", str(block_size)),
        ("num_buffered_blocks=", "128"),
        ("max_comm_world_size=", str(world_size)),
        ("max_thread_count=", "1"),
        ("known_eventID_start=", "0"),
        ("user_eventID_start=", "600"),
        ("known_solo_eventID_start=", "-10"),
        ("user_solo_eventID_start=", "5000"),
        ("known_stateID_count=", "300"),
        ("user_stateID_count=", "0"),
        ("known_solo_eventID_count=", "10"),
        ("user_solo_eventID_count=", "0"),
    ]
    parts = [VERSION] + [s for pair in values for s in pair]
    parts += ["commtable_fptr=", str(commtable_fptr // giga), str(giga), str(commtable_fptr % giga)]
    text = b"".join(p.encode() + b"\0" for p in parts)
    return text.ljust(PREAMBLE_SIZE, b"\0")


def parse_preamble(data: bytes, file_size: int) -> Preamble:
    """The preamble's fields, checked against the file's size."""
    if len(data) < PREAMBLE_SIZE or not data.startswith(b"CLOG-02."):
        raise TraceFormatError("not a CLOG2 file (no CLOG-02 preamble)")
    strings = data[:PREAMBLE_SIZE].split(b"\0")
    try:
        words = [s.decode("ascii") for s in strings]
    except UnicodeDecodeError as exc:
        raise TraceFormatError("CLOG2 preamble is not text") from exc
    fields: dict[str, str] = {"version": words[0]}
    i = 1
    while i < len(words) and words[i].endswith("="):
        if words[i] == "commtable_fptr=":
            fields[words[i]] = ",".join(words[i + 1 : i + 4])
            i += 4
        else:
            fields[words[i]] = words[i + 1] if i + 1 < len(words) else ""
            i += 2

    def number(name: str, low: int, high: int) -> int:
        try:
            value = int(fields[name])
        except (KeyError, ValueError) as exc:
            raise TraceFormatError(f"CLOG2 preamble: bad or missing {name}") from exc
        if not low <= value <= high:
            raise TraceFormatError(f"CLOG2 preamble: {name}{value} out of range")
        return value

    order = fields.get("is_big_endian=", "").strip()
    if order not in ("TRUE", "FALSE"):
        raise TraceFormatError("CLOG2 preamble: bad is_big_endian")
    block_size = number("block_size=", HEADER_SIZE * 2, MAX_BLOCK_SIZE)
    if block_size % 8:
        raise TraceFormatError("CLOG2 preamble: block_size not a multiple of 8")
    world = number("max_comm_world_size=", 1, 1 << 24)
    try:
        giga, unit, sub = (int(x) for x in fields["commtable_fptr="].split(","))
    except (KeyError, ValueError) as exc:
        raise TraceFormatError("CLOG2 preamble: bad commtable_fptr") from exc
    fptr = giga * unit + sub
    if fptr < PREAMBLE_SIZE or fptr > file_size or (fptr - PREAMBLE_SIZE) % block_size:
        raise TraceFormatError(f"CLOG2 preamble: communicator table offset {fptr} does not fit the file")
    return Preamble(fields, order == "TRUE", block_size, world, fptr)


def read(data: bytes, max_records: int = 1 << 28) -> Trace:
    """Parse and validate a CLOG2 file (bounded by its size and `max_records`)."""
    pre = parse_preamble(data, len(data))
    bo = ">" if pre.big_endian else "<"
    nblocks = (pre.commtable_fptr - PREAMBLE_SIZE) // pre.block_size
    if nblocks < 1:
        raise TraceFormatError("CLOG2 file has no blocks")
    # records start on 8-byte slots (block sizes and record sizes are multiples of 8): every slot's would-be
    # record type at once, then every block walked at once; a damaged file (or a block of more than
    # FAST_WALK_STEPS records) is walked again record by record, which says what is wrong
    slots = nblocks * pre.block_size // 8
    rectypes = np.frombuffer(data, dtype=f"{bo}i4", count=slots * 2, offset=PREAMBLE_SIZE)[5::2]
    walked = _walk_blocks(rectypes, nblocks, pre.block_size // 8, max_records)
    if walked is None:
        walked = _walk_records(data, rectypes.tolist(), nblocks, pre.block_size // 8, max_records)
    start_slots, end_slots = walked
    tails: list[bytes] = []
    end_head: tuple[int, int, int] | None = None
    words = np.frombuffer(data, dtype=f"{bo}i4", count=slots * 2, offset=PREAMBLE_SIZE)
    ends = words[2 * end_slots[:, None] + np.arange(2, 5)].astype(np.int64).tolist()
    for b, (j, this) in enumerate(zip(end_slots.tolist(), ends, strict=True)):
        this_head = (int(this[0]), int(this[1]), int(this[2]))
        if end_head is not None and this_head != end_head:
            end_head = (-(1 << 31), 0, 0)  # not one constant: the writer cannot remake it
        elif end_head is None:
            end_head = this_head
        tail = data[PREAMBLE_SIZE + 8 * j + HEADER_SIZE : PREAMBLE_SIZE + (b + 1) * pre.block_size]
        tails.append(tail if tail.strip(b"\0") else b"")
    table = data[pre.commtable_fptr :]
    if len(table) < 4:
        raise TraceFormatError("CLOG2 communicator table missing")
    count = int.from_bytes(table[:4], "big" if pre.big_endian else "little", signed=True)
    if count < 0 or len(table) != 4 + COMM_RECORD * count:
        raise TraceFormatError("CLOG2 communicator table does not match its count")
    n = len(start_slots)
    time = np.zeros(n, np.uint64)
    head = np.zeros((n, 4), np.int32)
    body = np.zeros((n, BODY_WORDS), np.int32)
    if n:
        time = np.frombuffer(data, f"{bo}u8", count=slots, offset=PREAMBLE_SIZE)[start_slots].astype(
            np.uint64
        )
        head = word_rows(words, 4)[2 * start_slots + 2].astype(np.int32)
        _check_ranks(head[:, 1], start_slots, pre.world_size)
        body = gather_body_words(words, 2 * start_slots + HEADER_SIZE // 4, head[:, 3])
    if end_head is None or end_head[0] == -(1 << 31):
        end_head = (-(1 << 31), 0, 0)
    return Trace(
        data[:PREAMBLE_SIZE],
        pre.big_endian,
        pre.block_size,
        Records(time, head, body),
        end_head,
        tails,
        table,
    )


def _check_ranks(ranks: np.ndarray, start_slots: np.ndarray, world_size: int) -> None:
    """Every record's rank is one of the preamble's world (0..world_size-1): a file of 6.4 MB with 200,000
    distinct rank values took 42 s to ship (everything downstream works per rank) before it was refused."""
    bad = np.flatnonzero((ranks < 0) | (ranks >= world_size))
    if len(bad):
        at = PREAMBLE_SIZE + 8 * int(start_slots[bad[0]])
        raise TraceFormatError(
            f"CLOG2 record at byte {at}: rank {int(ranks[bad[0]])} is not one of the file's "
            f"{world_size} ranks (max_comm_world_size)"
        )


FAST_WALK_STEPS = 1 << 14  # records per block the vectorised walk follows before it gives up
SLOT_SIZES = np.asarray([(HEADER_SIZE + b) // 8 for b in BODY_SIZE], np.int64)


def _walk_blocks(
    rectypes: np.ndarray, nblocks: int, per_block: int, max_records: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Every block's records followed at once, one record per block a step: the slots where records start
    and where each block's ENDBLOCK/ENDLOG is; None when anything is wrong (the record-by-record walk then
    says what) or a block holds more than FAST_WALK_STEPS records."""
    j = np.arange(nblocks, dtype=np.int64) * per_block
    end = j + per_block
    block = np.arange(nblocks)
    ends = np.zeros(nblocks, np.int64)
    is_start = np.zeros(nblocks * per_block, bool)
    kinds = rectypes.astype(np.int64)
    for _ in range(FAST_WALK_STEPS):
        if not len(j):
            break
        if (j + HEADER_SIZE // 8 > end).any():  # no room for a header (or the last record crossed the end)
            return None
        r = kinds[j]
        if ((r < 0) | (r >= len(BODY_SIZE))).any():
            return None
        done = r <= REC_ENDBLOCK
        if done.any():
            ends[block[done]] = j[done]
            last = block[done] == nblocks - 1
            if np.any((r[done] == REC_ENDLOG) != last):  # ENDLOG ends the last block, and only it
                return None
            keep = ~done
            j, end, block, r = j[keep], end[keep], block[keep], r[keep]
        is_start[j] = True
        j = j + SLOT_SIZES[r]  # past `end` when the record crosses its block's end: refused above
    else:
        return None
    starts = np.flatnonzero(is_start)
    if len(starts) > max_records:
        return None
    return starts, ends


def _walk_records(
    data: bytes, rectypes: list[int], nblocks: int, per_block: int, max_records: int
) -> tuple[np.ndarray, np.ndarray]:
    """The record-by-record walk (any block size): the same slots as `_walk_blocks`, or what is wrong."""
    starts: list[int] = []
    ends: list[int] = []
    ended = False
    slot_sizes = SLOT_SIZES.tolist()
    for b in range(nblocks):
        if ended:
            raise TraceFormatError(f"CLOG2 block {b} follows the ENDLOG record")
        j = b * per_block
        end = j + per_block
        while True:
            if j + HEADER_SIZE // 8 > end:
                raise TraceFormatError(f"CLOG2 block {b} has no ENDBLOCK record")
            rectype = rectypes[j]
            pos = PREAMBLE_SIZE + 8 * j
            if not 0 <= rectype < len(BODY_SIZE):
                raise TraceFormatError(f"CLOG2 record at byte {pos}: unknown record type {rectype}")
            if rectype <= REC_ENDBLOCK:
                ends.append(j)
                ended = rectype == REC_ENDLOG
                break
            size = slot_sizes[rectype]
            if j + size > end:
                raise TraceFormatError(f"CLOG2 record at byte {pos} crosses its block's end")
            starts.append(j)
            j += size
        if len(starts) > max_records:
            raise TraceFormatError(f"CLOG2 file has more than {max_records} records")
    if not ended:
        raise TraceFormatError("CLOG2 file has no ENDLOG record")
    return np.asarray(starts, np.int64), np.asarray(ends, np.int64)


def gather_body_words(words: np.ndarray, at: np.ndarray, rectypes: np.ndarray) -> np.ndarray:
    """The bodies of records whose bodies start at int32 word `at` of `words` (the file's words in its
    byte order), zero past each body's end: gathered per record type (a bare event's 2 words, not 28)."""
    body = np.zeros((len(at), BODY_WORDS), np.int32)
    step = 1 << 16
    for rectype in np.unique(rectypes).tolist():
        size = BODY_SIZE[rectype] // 4 if 0 <= rectype < len(BODY_SIZE) else 0
        if size == 0:
            continue
        rows_of_type = np.flatnonzero(rectypes == rectype)
        starts = word_rows(words, size)
        for s in range(0, len(rows_of_type), step):  # in slices: the gathered rows stay small
            rows = rows_of_type[s : s + step]
            body[rows, :size] = starts[at[rows]]
    return body


def word_rows(words: np.ndarray, width: int, writeable: bool = False) -> np.ndarray:
    """`words` seen as rows of `width` words, row i starting at word i (overlapping, no copy): records are
    gathered or placed by their start alone, with no (records x width) index array to build (half the CPU
    of reading and writing a trace went to those). Bounds are the view's: a start too close to the end is
    an IndexError, as with explicit indices."""
    rows = max(len(words) - width + 1, 0)
    return np.lib.stride_tricks.as_strided(
        words, shape=(rows, width), strides=(words.strides[0],) * 2, writeable=writeable
    )


def gather_bodies(view: np.ndarray, offsets: np.ndarray, rectypes: np.ndarray, bo: str) -> np.ndarray:
    """The bodies of the records at `offsets` (header offsets) as int32 words, zero past each body's end:
    gathered per record type (a bare event's 8 bytes, not 112), in slices so the index arrays stay small."""
    body = np.zeros((len(offsets), BODY_WORDS), np.int32)
    step = 1 << 15
    for rectype in np.unique(rectypes).tolist():
        size = BODY_SIZE[rectype] if 0 <= rectype < len(BODY_SIZE) else 0
        if size == 0:
            continue
        rows_of_type = np.flatnonzero(rectypes == rectype)
        cols = np.arange(size)
        for s in range(0, len(rows_of_type), step):
            rows = rows_of_type[s : s + step]
            raw = view[offsets[rows, None] + HEADER_SIZE + cols]
            body[rows, : size // 4] = raw.view(f"{bo}i4").reshape(-1, size // 4)
    return body


def _record_words(rec: Records, rows: np.ndarray, size: int, bo: str) -> np.ndarray:
    """Records `rows` (all of one size in bytes) as they are in the file, as rows of 8-byte words."""
    words = (size - HEADER_SIZE) // 4
    if np.dtype(f"{bo}i4").isnative:  # the machine's byte order: int32 columns copied as they are, no bytes
        native = np.empty((len(rows), size // 4), np.int32)
        native[:, 0:2] = rec.time[rows].view(np.int32).reshape(-1, 2)
        native[:, 2:6] = rec.head[rows]
        native[:, 6:] = rec.body[rows, :words]
        return native.view(np.uint64)
    out = np.empty((len(rows), size), np.uint8)
    out[:, 0:8] = rec.time[rows].astype(f"{bo}u8").view(np.uint8).reshape(-1, 8)
    out[:, 8:24] = rec.head[rows].astype(f"{bo}i4").view(np.uint8).reshape(-1, 16)
    out[:, 24:] = rec.body[rows, :words].astype(f"{bo}i4").view(np.uint8).reshape(-1, words * 4)
    return out.view(np.uint64)


def write(trace: Trace, max_size: int | None = None, order: np.ndarray | None = None) -> bytes:
    """The file's bytes: records packed into blocks as MPE2's merger packs them (a block closes when the next
    record would leave less than an ENDBLOCK's room; the ENDBLOCK carries that next record's time).
    `order`: the records' order in the file (their order in `trace.records` when None), which spares the
    caller a reordered copy of every record."""
    bo = ">" if trace.big_endian else "<"
    rec = trace.records
    n = len(rec)
    if order is None:
        order = np.arange(n)
    elif len(order) != n:
        raise ValueError("order must name every record once")
    sizes = HEADER_SIZE + np.asarray(BODY_SIZE, np.int64)[rec.head[order, 3]] if n else np.zeros(0, np.int64)
    bs = trace.block_size
    end_icomm, end_rank, end_thread = trace.end_head
    # where each record goes: a new block when it would leave less than an ENDBLOCK's room
    if n and int(sizes.max()) + HEADER_SIZE >= bs:
        raise TraceFormatError(f"CLOG2 block size {bs} is too small for its records")
    cum = np.cumsum(sizes)  # bytes up to and including each record
    before = cum - sizes
    at = np.zeros(n, np.int64)  # file offset of each record
    closes: list[tuple[int, int]] = []  # (offset of the ENDBLOCK, index of the record after it)
    i, base, base_cum = 0, PREAMBLE_SIZE, 0
    while i < n:
        # the first record that would leave less than an ENDBLOCK's room in this block
        k = int(np.searchsorted(cum, base_cum + bs - HEADER_SIZE, side="left"))
        at[i:k] = base + before[i:k] - base_cum
        if k >= n:
            break
        closes.append((base + int(before[k]) - base_cum, k))
        i, base, base_cum = k, base + bs, int(before[k])
    used = int(cum[-1]) - base_cum if n else 0
    nblocks = len(closes) + 1
    total = PREAMBLE_SIZE + nblocks * bs
    if max_size is not None and total + len(trace.commtable) > max_size:
        raise TraceFormatError("CLOG2 file would exceed its recorded size")
    if trace.tails and len(trace.tails) != nblocks:
        raise TraceFormatError("CLOG2 block tails do not match the blocks")
    out = np.zeros(total + len(trace.commtable), np.uint8)  # the table in place: one copy of the file less
    out[total:] = np.frombuffer(trace.commtable, np.uint8)
    out[:PREAMBLE_SIZE] = np.frombuffer(trace.preamble, np.uint8)
    # offsets and sizes are multiples of 8: records are placed as 8-byte words, not bytes
    out_words = out[:total].view(np.uint64)
    word_at = at // 8
    for size in np.unique(sizes).tolist():
        places = np.flatnonzero(sizes == size)
        starts = word_rows(out_words, size // 8, writeable=True)  # records never overlap: rows written once
        for s in range(0, len(places), 1 << 16):  # in slices: the records' copies stay small
            part = places[s : s + (1 << 16)]
            starts[word_at[part]] = _record_words(rec, order[part], size, bo)
    end_ints = np.asarray([end_icomm, end_rank, end_thread], f"{bo}i4")
    ends = [
        (offset, rec.time[order[i : i + 1]].astype(f"{bo}u8").tobytes(), REC_ENDBLOCK) for offset, i in closes
    ]
    ends.append((base + used, np.asarray([MAX_TIME], f"{bo}f8").tobytes(), REC_ENDLOG))
    for block, (offset, time_bits, rectype) in enumerate(ends):
        record = time_bits + end_ints.tobytes() + np.asarray([rectype], f"{bo}i4").tobytes()
        out[offset : offset + HEADER_SIZE] = np.frombuffer(record, np.uint8)
        tail = trace.tails[block] if trace.tails else b""
        if tail:
            room = PREAMBLE_SIZE + (block + 1) * bs - (offset + HEADER_SIZE)
            if len(tail) != room:
                raise TraceFormatError("CLOG2 block tail does not fit its block")
            out[offset + HEADER_SIZE : offset + HEADER_SIZE + room] = np.frombuffer(tail, np.uint8)
    return out.tobytes()


def world_comm_table(big_endian: bool = True) -> bytes:
    """The communicator table of a trace that only uses MPI_COMM_WORLD: one intracommunicator, local id 0."""
    bo: Literal["big", "little"] = "big" if big_endian else "little"
    gid = b"\0" * 12 + b"MPI_COMM_WORLD".ljust(20, b"\0")
    return (1).to_bytes(4, bo) + gid + (0).to_bytes(4, bo) + (1).to_bytes(4, bo)
