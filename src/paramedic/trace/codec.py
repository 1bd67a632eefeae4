"""The trace application's metadata: a CLOG2 file as its first period plus per-period differences, lossless.

ParaMEDIC's MPE plugin (framework paper, section 4.2.2): most scientific codes communicate periodically,
so the trace is cut into periods, found with an FFT, and only the first period is kept in full, with the
differences for the others. Here, per process (the records of one header rank, in file order):

* the period: the autocorrelation of the record-kind sequence (record type and event type), computed by
  one FFT (kinds as random-phase unit complex numbers); the smallest lag whose match rate is within 5% of the best (at least
  50%) is the period;
* every record as 31 int32 words (icomm, thread, rectype, then the body): the first 9 (all a bare,
  message, collective or time-shift record has) as columns, minus the words of the record one period
  earlier when that is smaller (records that repeat their counterpart: state, peer, tag, size, cost zero
  words), the rest only for the few records with longer bodies (state definitions, communicators);
* times: integer nanoseconds when every time is one (`ns / 1e9`, as paramedic's tracer writes them; else
  the float64 bit patterns), divided by their greatest common divisor (`time_unit`: 1000 for a trace
  reduced to microseconds by trace.precision), as gaps to the previous record, minus the gap one period earlier when that is
  smaller, grouped by record kind (gaps of one kind are alike: 10-17% smaller on real traces);
* then each column zigzag-coded, split in byte planes and compressed with zstd (level 6).

On LAMMPS traces the period is found but its differences do not pay: zstd already matches the repeated
records in the columns, and the jitter of the times is as large as the gaps' differences; the columns
alone are kept there (mode "columns", and the reason says so). Differences win where the times are
regular (a per-position gap with small jitter).

The records' interleaving is the merge by time (stored explicitly when the file is not in that order),
block boundaries follow MPE2's packing rule, and the preamble, block tails and communicator table are
stored as they are. Encoding checks that this rebuilds the file byte for byte (`checked`; a sender whose receiver checks the
digest anyway may run it only when the receiver refuses); if it would not (a file
from another writer with a layout we do not model), or when zstd of the whole file is smaller, the file
is shipped with a general codec (zstd of the whole file) and the result says so; an aperiodic trace
keeps the columns without periods (mode "columns", "aperiodic" in the reason). Decoding is bounded by the sizes in
the header (checked against a caller's limit) and ends with the SHA-256 of the regenerated file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from paramedic.trace import clog2

MAGIC = b"PMTRACE1"
FORMAT = 2  # 2: times in `time_unit` nanoseconds, `precision` recorded; 1 (still read): time_unit 1
MAX_HEADER = 1 << 20
WORDS = 3 + clog2.BODY_WORDS  # icomm, thread, rectype, body
MAX_PERIOD = 1 << 16
MAX_TIME_UNIT = 10**9
PERIOD_WINDOW = 1 << 18  # records whose autocorrelation finds the period (FFT 0.17 -> 0.08 s on 0.4 M)
LEVEL = 9  # zstd level of a whole file (the general codec) and of the preamble
# zstd level of the columns. On LAMMPS flow.pois (775k events) level 6 is 2% larger than 9 (462 against 453
# KB: 7 ms at 10 Mbit/s) and saves 15-20% of the encoding's CPU (0.46-0.49 s against 0.54-0.63 s);
# level 3 is 11% larger; 19 is 3% smaller and 7x slower
COLUMN_LEVEL = 6


class MetadataError(clog2.TraceFormatError):
    """Trace metadata that is damaged, hostile, or does not rebuild its file."""


@dataclass
class Encoded:
    data: bytes
    mode: str  # "periodic", "columns" (no period: columns only) or "general" (zstd of the whole file)
    reason: str
    periods: dict[int, int]  # per process (header rank): the period in records, 0 for none
    precision: str = "lossless"  # of the file's times (trace.precision), recorded in the metadata


# -- period -------------------------------------------------------------------------------------------------


def find_period(kinds: np.ndarray, max_period: int = MAX_PERIOD) -> int:
    """The first-level period of a sequence of record kinds (0: none), from an FFT autocorrelation of its
    first PERIOD_WINDOW records (or 4 x max_period) and checked on all of them.

    Each kind becomes a unit complex number of random phase; the real part of the sequence's
    autocorrelation at lag p is then the number of positions whose kind repeats p later, plus the sum of
    random-phase terms of the others (about zero): one FFT pair whatever the number of kinds."""
    if len(kinds) < 8:
        return 0
    whole = kinds
    kinds = kinds[: max(PERIOD_WINDOW, 4 * max_period)]  # a period shows in the first records already
    n = len(kinds)
    inverse = _kind_ranks(kinds)
    phases = np.random.default_rng(0).uniform(0, 2 * np.pi, int(inverse.max()) + 1)
    z = np.exp(1j * phases)[inverse]  # one exp per kind, not per record: the same numbers
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.fft(z, size)
    matches = np.fft.ifft(f * np.conj(f))[:n].real
    limit = min(max_period, n // 2)
    if limit < 1:
        return 0
    lags = np.arange(1, limit + 1)
    rate = matches[1 : limit + 1] / (n - lags)
    best = float(rate.max())
    if best < 0.5:
        return 0
    candidates = lags[rate >= best * 0.95]
    period = int(candidates[0])
    exact = float(np.mean(whole[period:] == whole[:-period]))
    return period if exact >= 0.5 else 0


def _kind_ranks(kinds: np.ndarray) -> np.ndarray:
    """np.unique(kinds, return_inverse=True)[1] (each kind's rank among the distinct kinds), counted in one
    pass when the kinds' (rectype, etype) pairs span under 2**16 values, sorted otherwise."""
    key = _kind_key(kinds)
    if key is None:
        return np.unique(kinds, return_inverse=True)[1].reshape(-1)
    present = np.bincount(key, minlength=1 << 16) > 0
    ranks = np.cumsum(present) - 1
    return ranks[key]


def _kind_key(kinds: np.ndarray) -> np.ndarray | None:
    """A uint16 key in the same order as the int64 kinds (rectype * 2**32 + int32 etype), None when their
    pairs span 2**16 values or more (or there are none)."""
    if not len(kinds):
        return None
    r = (kinds + (1 << 31)) >> 32  # the rectype: etype is a signed 32-bit word
    e = kinds - (r << 32)
    r_low, e_low = int(r.min()), int(e.min())
    span = int(e.max()) - e_low + 1
    if r_low < 0 or (int(r.max()) - r_low + 1) * span > 1 << 16:  # r_low < 0: not a rectype (or wrapped)
        return None
    return ((r - r_low) * span + (e - e_low)).astype(np.uint16)


def record_kinds(rec: clog2.Records) -> np.ndarray:
    return rec.head[:, 3].astype(np.int64) * (1 << 32) + rec.body[:, 0].astype(np.int64)


def kind_order(kinds: np.ndarray) -> np.ndarray:
    """np.argsort(kinds, kind="stable"): the same permutation from the 16-bit key when there is one (a radix
    sort, 4x faster than sorting the int64 kinds; the key keeps the kinds' order, so ties keep theirs)."""
    key = _kind_key(kinds)
    return np.argsort(kinds if key is None else key, kind="stable")


# -- columns ------------------------------------------------------------------------------------------------


def _zigzag(a: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    u: np.ndarray = a.view(np.uint64 if bits == 64 else np.uint32)
    return np.left_shift(u, 1) ^ (a >> (bits - 1)).view(u.dtype)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    signed = np.int64 if u.dtype == np.uint64 else np.int32
    low = u & 1
    np.negative(low, out=low)  # 0 or all ones (unsigned negation wraps): no array of zeros to subtract from
    return ((u >> 1) ^ low).view(signed)


def _pack(columns: np.ndarray) -> bytes:
    """Signed integer columns (k, n) -> zstd of their zigzag byte planes."""
    z = _zigzag(np.ascontiguousarray(columns))
    planes = z.reshape(-1).view(np.uint8).reshape(-1, z.dtype.itemsize).T
    return zstandard.ZstdCompressor(level=COLUMN_LEVEL).compress(np.ascontiguousarray(planes).tobytes())


# The largest zstd window a frame without a declared size may ask for (the encoder's levels 6 and 9 use
# at most 4 MiB; zstd's own limit is 128 MiB, allocated before a byte is out)
MAX_WINDOW_BYTES = 8 * 2**20


def declared_size(blob: bytes) -> int | None:
    """The content size a zstd frame declares in its header (None: not declared), read without inflating."""
    try:
        size = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise MetadataError(f"trace metadata: not a zstd frame ({exc})") from exc
    return None if size < 0 else size


def _inflate(blob: bytes, expected: int, what: str) -> bytes:
    """zstd-decompress at most `expected` bytes. A frame that declares its size is inflated to that size
    whatever max_output_size says (83 KB declaring 2 GiB took the site to 2 GiB, issue 41): the declared
    size is checked first, and a frame that declares none is bounded by its window and max_output_size."""
    declared = declared_size(blob)
    if declared is not None and declared > expected:
        raise MetadataError(f"trace metadata: {what} declares {declared} bytes, more than its {expected}")
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        return decompressor.decompress(blob, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise MetadataError(f"trace metadata: {what} does not decompress ({exc})") from exc


def _unpack(blob: bytes, shape: tuple[int, int], dtype: type) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    expected = shape[0] * shape[1] * itemsize
    raw = _inflate(blob, expected, "a column") if expected else b""
    if len(raw) != expected:
        raise MetadataError("trace metadata: a column has the wrong size")
    udtype = np.uint64 if itemsize == 8 else np.uint32
    planes = np.frombuffer(raw, np.uint8).reshape(itemsize, -1).T
    z = np.ascontiguousarray(planes).view(udtype).reshape(shape)
    return _unzigzag(z)


def _period_diff(a: np.ndarray, p: int) -> np.ndarray:
    """a[i] - a[i-p] along axis 1 (wrapping), a[i] for i < p."""
    out = a.copy()
    if p:
        out[:, p:] = a[:, p:] - a[:, :-p]
    return out


def _period_undiff(d: np.ndarray, p: int) -> np.ndarray:
    if not p:
        return d
    k, n = d.shape
    q = -(-n // p)
    padded = np.zeros((k, q * p), d.dtype)
    padded[:, :n] = d
    return np.cumsum(padded.reshape(k, q, p), axis=1, dtype=d.dtype).reshape(k, q * p)[:, :n]


def _time_values(seconds: np.ndarray, bits: np.ndarray) -> tuple[str, np.ndarray]:
    """Integer nanoseconds when they rebuild every time exactly, else the float64 bit patterns."""
    with np.errstate(all="ignore"):
        ns = np.rint(seconds * 1e9)
        ok = bool(np.all(np.isfinite(ns))) and bool(np.all(np.abs(ns) < 2**62))
        if ok:
            n = ns.astype(np.int64)
            if np.array_equal((n / 1e9).view(np.uint64), bits):
                return "ns", n
    return "bits", bits.view(np.int64)


def _time_unit(mode: str, values: np.ndarray) -> int:
    """The largest whole number of nanoseconds every time is a multiple of (a reduced precision's step):
    the times are stored in it (1 for float bit patterns)."""
    if mode != "ns" or not len(values):
        return 1
    unit = int(np.gcd.reduce(values))
    return unit if 0 < unit <= MAX_TIME_UNIT else 1


def _time_bits(mode: str, values: np.ndarray) -> np.ndarray:
    if mode == "ns":
        return (values / 1e9).view(np.uint64)
    return values.view(np.uint64)


COMMON = 3 + 6  # the words every frequent record has: icomm, thread, rectype and a body of up to 24 bytes
RARE_TYPES = np.asarray([size > 24 for size in clog2.BODY_SIZE])  # definitions, cargo, communicators, ...


def _encode_stream(
    rec: clog2.Records, index: np.ndarray, times: np.ndarray, max_period: int
) -> tuple[int, dict[str, Any], list[bytes]]:
    """A process's records (`index` in `rec`): its period, and the first COMMON words of every record, the
    other words of the few records with long bodies (definitions), and the time gaps; the words and the
    gaps each with or without the period's differences, whichever is smaller; the gaps grouped by record
    kind (gaps of one kind of record are alike). Only the words needed are gathered (not whole records)."""
    head = rec.head[index]
    common = np.empty((COMMON, len(index)), np.int32)
    common[:3] = head[:, [0, 2, 3]].T
    common[3:] = rec.body[index, : COMMON - 3].T
    kinds = head[:, 3].astype(np.int64) * (1 << 32) + common[3].astype(np.int64)
    period = find_period(kinds, max_period)
    rare = RARE_TYPES[head[:, 3]]
    word_blob = _pack(common)
    word_period = False
    if period:
        diffed = _pack(_period_diff(common, period))
        if len(diffed) < len(word_blob):
            word_blob, word_period = diffed, True
    rare_blob = _pack(np.ascontiguousarray(rec.body[index[rare], COMMON - 3 :].T))
    by_kind = kind_order(kinds)
    gaps = np.diff(times, prepend=np.int64(0))[None, :]
    time_blob = _pack(gaps[:, by_kind])
    time_period = False
    if period:
        diffed = _pack(_period_diff(gaps, period)[:, by_kind])
        if len(diffed) < len(time_blob):
            time_blob, time_period = diffed, True
    info = {"n": len(index), "period": period, "word_period": word_period, "time_period": time_period}
    return period, info, [word_blob, rare_blob, time_blob]


def _decode_stream(
    info: dict[str, Any], key: int, blobs: list[bytes], time_mode: str, unit: int, into: clog2.Records
) -> None:
    """A process's records, written into `into` (its rows of the whole trace's arrays, zeroed: the streams
    are decoded in place, with no copy of the whole trace to join them)."""
    n, period = info["n"], info["period"]
    common = _unpack(blobs[0], (COMMON, n), np.int32)
    if info["word_period"]:
        common = _period_undiff(common, period)
    head = into.head
    head[:, 0] = common[0]
    head[:, 1] = key
    head[:, 2] = common[1]
    head[:, 3] = common[2]
    if n and (head[:, 3].min() < 2 or head[:, 3].max() >= len(clog2.BODY_SIZE)):
        raise MetadataError("trace metadata: a record type out of range")
    rare = RARE_TYPES[head[:, 3]]
    body = into.body
    body[:, : COMMON - 3] = common[3:].T
    body[rare, COMMON - 3 :] = _unpack(blobs[1], (WORDS - COMMON, int(rare.sum())), np.int32).T
    kinds = head[:, 3].astype(np.int64) * (1 << 32) + body[:, 0].astype(np.int64)
    grouped = _unpack(blobs[2], (1, n), np.int64)
    gaps = np.empty_like(grouped)
    gaps[:, kind_order(kinds)] = grouped
    if info["time_period"]:
        gaps = _period_undiff(gaps, period)
    times = np.cumsum(gaps[0], dtype=np.int64)
    if unit > 1:
        if n and float(np.abs(times).max()) * unit >= 2.0**62:
            raise MetadataError("trace metadata: a time out of range")
        times = times * unit
    into.time[:] = _time_bits(time_mode, times)


# -- the file -----------------------------------------------------------------------------------------------


def _frame(header: dict[str, Any], blobs: list[bytes]) -> bytes:
    header["blobs"] = [len(b) for b in blobs]
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(text)) + text + b"".join(blobs)


def _general(data: bytes, reason: str, digest: str, precision: str) -> Encoded:
    blob = zstandard.ZstdCompressor(level=LEVEL).compress(data)
    header = {"format": FORMAT, "mode": "general", "size": len(data), "sha256": digest, "reason": reason}
    header["precision"] = precision
    return Encoded(_frame(header, [blob]), "general", reason, {}, precision)


def encode(
    data: bytes, max_period: int = MAX_PERIOD, check: bool = True, precision: str = "lossless"
) -> Encoded:
    """The metadata of a CLOG2 file (validated first: a damaged file is an error, not metadata); with
    `check`, decoded here and compared with the file (`checked`). `precision` is recorded: the precision
    of the file's times (trace.precision; the file given is already reduced to it)."""
    digest = hashlib.sha256(data).hexdigest()
    trace = clog2.read(data)
    rec = trace.records
    if trace.end_head[0] == -(1 << 31) or len(rec) == 0:
        return _general(data, "its block ends are not uniform", digest, precision)
    time_mode, times = _time_values(rec.seconds(), rec.time)
    unit = _time_unit(time_mode, times)
    if unit > 1:
        times = times // unit
    keys, stream_of = np.unique(rec.head[:, 1], return_inverse=True)
    # the interleaving: canonical when the file is the stable merge by time of its streams in key order
    by_stream = np.argsort(stream_of, kind="stable")
    canonical = by_stream[np.argsort(rec.seconds()[by_stream], kind="stable")]
    blobs: list[bytes] = []
    header: dict[str, Any] = {"format": FORMAT, "size": len(data), "sha256": digest, "time": time_mode}
    header["time_unit"] = unit
    header["precision"] = precision
    if np.array_equal(canonical, np.arange(len(rec))):
        header["order"] = "merge"
    else:
        header["order"] = "explicit"
        blobs.append(_pack(stream_of.astype(np.int32)[None, :]))
    streams = []
    periods: dict[int, int] = {}

    def one(s: int) -> tuple[int, dict[str, Any], list[bytes]]:
        index = np.flatnonzero(stream_of == s)
        return _encode_stream(rec, index, times[index], max_period)

    # the processes in parallel (numpy's FFT and zstd release the GIL): the paper's compute site does the
    # FFTs in parallel too
    with ThreadPoolExecutor(max_workers=max(1, min(len(keys), os.cpu_count() or 1))) as pool:
        results = list(pool.map(one, range(len(keys))))
    for key, (period, info, parts) in zip(keys.tolist(), results, strict=True):
        periods[int(key)] = period
        info["key"] = int(key)
        streams.append(info)
        blobs += parts
    header["streams"] = streams
    header["preamble"] = len(blobs)
    blobs.append(zstandard.ZstdCompressor(level=LEVEL).compress(trace.preamble + trace.commtable))
    header["commtable"] = len(trace.commtable)
    header["big_endian"] = trace.big_endian
    header["block_size"] = trace.block_size
    header["end_head"] = list(trace.end_head)
    if any(trace.tails):
        header["tails"] = [len(t) for t in trace.tails]
        blobs.append(zstandard.ZstdCompressor(level=LEVEL).compress(b"".join(trace.tails)))
    else:
        header["tails"] = []
    used = any(s["word_period"] or s["time_period"] for s in streams)
    mode = "periodic" if used else "columns"
    header["mode"] = mode
    encoded = _frame(header, blobs)
    if mode == "periodic":
        reason = "periodic: the period's differences are smaller than the columns alone"
    elif any(periods.values()):
        reason = "periodic, but the columns alone are smaller than the period's differences"
    else:
        reason = "aperiodic: no process has a period"
    if len(encoded) * 8 > len(data):  # zstd of a whole CLOG2 file does not reach 8x: not worth trying below
        general = _general(data, reason + "; zstd of the file is smaller", digest, precision)
        if len(general.data) < len(encoded):
            return general
    made = Encoded(encoded, mode, reason, periods, precision)
    return checked(made, data) if check else made


def checked(encoded: Encoded, data: bytes) -> Encoded:
    """`encoded` if it rebuilds `data` byte for byte, else the general codec's metadata (which says why).
    Apart from `encode` so a sender can check while the unchecked metadata is on its way."""
    if encoded.mode == "general":
        return encoded
    try:
        rebuilt = decode(encoded.data, max_size=len(data))
    except clog2.TraceFormatError:
        rebuilt = b""
    if rebuilt != data:
        digest = hashlib.sha256(data).hexdigest()
        return _general(data, "the columns do not rebuild this file's layout", digest, encoded.precision)
    return encoded


def parse_header(meta: bytes, max_size: int) -> tuple[dict[str, Any], list[bytes]]:
    """The header and the blobs of trace metadata, bounded: the file it describes is at most `max_size`."""
    if len(meta) < 12 or not meta.startswith(MAGIC):
        raise MetadataError("not trace metadata (bad magic)")
    (length,) = struct.unpack_from("<I", meta, 8)
    if length > MAX_HEADER or 12 + length > len(meta):
        raise MetadataError("trace metadata: header too long or truncated")
    try:
        header = json.loads(meta[12 : 12 + length])
        sizes = [int(x) for x in header["blobs"]]
        size = int(header["size"])
        digest = str(header["sha256"])
        mode = header["mode"]
        version = header.get("format")
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # Overflow: "size": Infinity (fuzzed)
        raise MetadataError("trace metadata: bad header") from exc
    if not isinstance(header, dict) or mode not in ("general", "periodic", "columns"):
        raise MetadataError("trace metadata: bad header")
    if version not in (1, 2) or isinstance(version, bool):
        raise MetadataError(
            f"trace metadata format {str(version)[:20]!r}: this paramedic reads formats 1 and 2"
        )
    if version == 1 and header.get("time_unit", 1) != 1:
        raise MetadataError("trace metadata: bad header (format 1 has no time unit)")
    if not 0 < size <= max_size:
        raise MetadataError(f"trace metadata: file size {size} out of bounds (limit {max_size})")
    if len(digest) != 64 or any(x < 0 for x in sizes) or 12 + length + sum(sizes) != len(meta):
        raise MetadataError("trace metadata: blob sizes do not add up to its length (truncated?)")
    blobs, pos = [], 12 + length
    for n in sizes:
        blobs.append(meta[pos : pos + n])
        pos += n
    header["size"], header["sha256"] = size, digest  # as checked ("size": "123" was used as given: fuzzed)
    return header, blobs


# Peak memory of decode() per byte of the file it regenerates: the records' arrays (56 bytes per 24-byte
# header: 2.3x), their sort and the file's bytes twice; measured 8.4x (LAMMPS indent, 152 MB) and 9.3x
# (friction, 51 MB) over the interpreter's own; "general" is zstd of the file (the file once, plus a copy).
DECODE_MEMORY_PER_BYTE = {"general": 2, "columns": 10, "periodic": 10}
# The most any part of the metadata inflates to per byte of its file: the records' columns are at most 4
# bytes per byte of records (a record of 24 bytes has 36 bytes of common words, 8 of time, and a long body
# as many as it has itself); the preamble, tails and the whole file at most 1.
MAX_BLOB_PER_BYTE = 4


def decode_memory(meta: bytes, max_size: int = 1 << 36) -> int:
    """The memory decode(meta) may take at its peak (bytes), from the header alone: what a storage site
    weighs before it regenerates a trace from untrusted metadata."""
    header, blobs = parse_header(meta, max_size)
    size = int(header["size"])
    declared = [declared_size(blob) or 0 for blob in blobs]
    if any(n > MAX_BLOB_PER_BYTE * size for n in declared):
        raise MetadataError(
            f"trace metadata: a part declares {max(declared)} bytes, more than a file of {size} bytes has"
        )
    return size * DECODE_MEMORY_PER_BYTE[header["mode"]] + sum(declared)


def decode(meta: bytes, max_size: int = 1 << 36, deadline: float | None = None) -> bytes:
    """The CLOG2 file that `meta` describes, checked against its SHA-256. With `deadline` (time.monotonic),
    a MetadataError once it has passed, at the next step of the rebuild (a storage site's --regen-timeout:
    its I/O worker is not held long past it)."""
    header, blobs = parse_header(meta, max_size)
    size = header["size"]
    if header["mode"] == "general":
        if len(blobs) != 1:
            raise MetadataError("trace metadata: bad header")
        data = _inflate(blobs[0], size, "the file")
    else:
        try:
            data = _rebuild(header, blobs, size, deadline)
        except OverflowError as exc:  # a number of the header that the records' words cannot hold
            raise MetadataError(f"trace metadata: a value out of range ({exc})") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != header["sha256"]:
        raise MetadataError("trace metadata: the regenerated file's SHA-256 differs from the recorded one")
    return data


def _is_int32(value: int) -> bool:
    """A header's stream key and end-of-blocks words go into the records' int32 words (a key of 2**31
    raised OverflowError at the storage site, an "internal error": issue 41)."""
    return -(2**31) <= value < 2**31


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise MetadataError("trace metadata: regenerating took longer than its time; stopped")


def _rebuild(header: dict[str, Any], blobs: list[bytes], size: int, deadline: float | None = None) -> bytes:
    try:
        streams = header["streams"]
        time_mode = header["time"]
        unit = int(header.get("time_unit", 1))
        order = header["order"]
        block_size = int(header["block_size"])
        end_head = tuple(int(x) for x in header["end_head"])
        tails = [int(x) for x in header["tails"]]
        table_len = int(header["commtable"])
        big_endian = bool(header["big_endian"])
        infos = [
            {
                "n": int(s["n"]),
                "period": int(s["period"]),
                "word_period": bool(s["word_period"]),
                "time_period": bool(s["time_period"]),
                "key": int(s["key"]),
            }
            for s in streams
        ]
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise MetadataError("trace metadata: bad header") from exc
    total = sum(i["n"] for i in infos)
    if (
        time_mode not in ("ns", "bits")
        or not 1 <= unit <= MAX_TIME_UNIT
        or (unit > 1 and time_mode != "ns")
        or order not in ("merge", "explicit")
        or len(end_head) != 3
        or not clog2.HEADER_SIZE * 2 <= block_size <= clog2.MAX_BLOCK_SIZE
        or any(i["n"] < 0 or not 0 <= i["period"] <= max(i["n"], 0) for i in infos)
        or total * clog2.HEADER_SIZE > size
        or len(tails) * block_size > size
        or not 0 <= table_len <= size
        or len({i["key"] for i in infos}) != len(infos)
        or not all(_is_int32(v) for v in (*end_head, *(i["key"] for i in infos)))
    ):
        raise MetadataError("trace metadata: header out of bounds")
    expected = (1 if order == "explicit" else 0) + 3 * len(infos) + 1 + (1 if tails else 0)
    if len(blobs) != expected:
        raise MetadataError("trace metadata: wrong number of blobs")
    pos = 0
    stream_of = None
    if order == "explicit":
        stream_of = _unpack(blobs[0], (1, total), np.int32)[0]
        if total and (stream_of.min() < 0 or stream_of.max() >= len(infos)):
            raise MetadataError("trace metadata: bad record order")
        pos = 1
    jobs = [(info, blobs[pos + 3 * i : pos + 3 * i + 3]) for i, info in enumerate(infos)]
    pos += 3 * len(infos)
    records = clog2.Records(
        np.zeros(total, np.uint64),
        np.zeros((total, 4), np.int32),
        np.zeros((total, clog2.BODY_WORDS), np.int32),
    )
    firsts = np.concatenate([[0], np.cumsum([i["n"] for i in infos], dtype=np.int64)]).tolist()

    def one(s: int) -> None:
        _in_time(deadline)
        info, parts = jobs[s]
        rows = slice(firsts[s], firsts[s + 1])
        into = clog2.Records(records.time[rows], records.head[rows], records.body[rows])
        _decode_stream(info, info["key"], parts, time_mode, unit, into)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        list(pool.map(one, range(len(jobs))))
    fixed = _inflate(blobs[pos], clog2.PREAMBLE_SIZE + table_len, "the preamble")
    if len(fixed) != clog2.PREAMBLE_SIZE + table_len:
        raise MetadataError("trace metadata: preamble has the wrong size")
    tail_bytes: list[bytes] = []
    if tails:
        if any(t < 0 or t > block_size for t in tails):
            raise MetadataError("trace metadata: block tails have the wrong size")
        joined = _inflate(blobs[pos + 1], sum(tails), "the block tails")
        if len(joined) != sum(tails):
            raise MetadataError("trace metadata: block tails have the wrong size")
        at = 0
        for t in tails:
            tail_bytes.append(joined[at : at + t])
            at += t
    _in_time(deadline)
    if order == "merge":
        keys = (
            np.concatenate([np.full(i["n"], s, np.int64) for s, i in enumerate(infos)])
            if infos
            else np.zeros(0)
        )
        by_stream = np.argsort(keys, kind="stable")
        index = by_stream[np.argsort(records.seconds()[by_stream], kind="stable")]
    else:
        assert stream_of is not None
        starts = np.concatenate([[0], np.cumsum([i["n"] for i in infos])])[:-1].astype(np.int64)
        counts = np.bincount(stream_of, minlength=len(infos))
        if not np.array_equal(counts, [i["n"] for i in infos]):
            raise MetadataError("trace metadata: record order does not match the streams")
        rank_in_stream = np.zeros(total, np.int64)
        by_stream = np.argsort(stream_of, kind="stable")
        rank_in_stream[by_stream] = np.arange(total) - np.repeat(starts, counts)
        index = starts[stream_of] + rank_in_stream
    trace = clog2.Trace(
        fixed[: clog2.PREAMBLE_SIZE],
        big_endian,
        block_size,
        records,
        (end_head[0], end_head[1], end_head[2]),
        tail_bytes,
        fixed[clog2.PREAMBLE_SIZE :],
    )
    _in_time(deadline)
    return clog2.write(trace, max_size=size, order=index)
