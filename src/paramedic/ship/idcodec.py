"""Compact, strictly checked encoding of ParaMEDIC "semantic metadata".

For a run of consecutive queries, the metadata is the list of matched subject ids (global ordinal ids in
``[0, nseq)``) per query. It is what crosses the slow wide-area link instead of BLAST output, so it must be
small; and it is decoded on a server from untrusted network input, so the decoder is strict and bounded:
every malformed or out-of-bounds container raises :class:`MetadataFormatError` (and nothing else), the
decompressed body never exceeds :data:`MAX_RAW_BYTES` (a zip bomb is cut off, not inflated), and the result
holds at most one id per body byte. Note that as Python ints those ids take ~40 bytes each.

Container layout (all integers are unsigned LEB128 varints, at most 9 bytes, value < 2**63, minimal form)::

    b"PMDS"          magic
    0x01             version
    first_query      ordinal of the first query in this run
    n_queries        number of per-query lists (<= MAX_QUERIES)
    nseq             database size the ids refer to (must equal the decoder's expected nseq)
    raw_length       size of the decompressed body (<= MAX_RAW_BYTES)
    compressed_len   size of the zstd frame that follows (must reach exactly to the trailer)
    body             one zstd frame, content size written in its header
    sha256           32 bytes, SHA-256 of everything before it

Body (decompressed), per query: ``count`` then ``count`` deltas. Ids are sorted ascending; the first delta
is the first id, each later delta is ``id - previous_id - 1`` (ids are strictly increasing, so this is >= 0).
Random ids out of a large database then cost about one to two bytes each before compression.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence

import zstandard

__all__ = ["MAX_QUERIES", "MAX_RAW_BYTES", "MetadataFormatError", "decode_subjects", "encode_subjects"]


class MetadataFormatError(ValueError):
    """Malformed or out-of-bounds metadata container."""


MAX_QUERIES = 1_000_000  # per container
MAX_RAW_BYTES = (
    8 * 2**20
)  # ~5 million ids per container; bounds the server's memory per chunk (~350 MB of ints)

MAGIC = b"PMDS"
VERSION = 1
_DIGEST_LEN = 32
_VARINT_MAX_BYTES = 10
_VARINT_LIMIT = 2**63  # values must be strictly below this (fit in a signed 64-bit int)
_ZSTD_LEVEL = 19
_ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"
# Compressed bytes fed to zstd per call. An RLE block turns ~4 input bytes into 128 KiB of output, so this
# caps the overshoot past the declared size at ~8 MiB even if libzstd did not enforce the frame's own size.
_FEED = 256
# Smallest container: magic, version, five one-byte varints, an empty body, the trailer.
_MIN_LEN = len(MAGIC) + 1 + 5 + _DIGEST_LEN


def _put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` as an unsigned LEB128 varint (the caller has checked 0 <= value < 2**63)."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """Read one varint from ``buf[pos:end]``; return (value, new position). Strict: bounded and minimal."""
    value = 0
    shift = 0
    for i in range(_VARINT_MAX_BYTES):
        if pos >= end:
            raise MetadataFormatError(f"truncated varint ({what})")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if value >= _VARINT_LIMIT:
            raise MetadataFormatError(f"varint overflow ({what})")
        if b < 0x80:
            if b == 0 and i > 0:
                raise MetadataFormatError(f"non-minimal varint ({what})")
            return value, pos
        shift += 7
    raise MetadataFormatError(f"varint longer than {_VARINT_MAX_BYTES} bytes ({what})")


def _check_nseq(nseq: int) -> int:
    nseq = operator.index(nseq)
    if not 0 <= nseq < _VARINT_LIMIT:
        raise ValueError(f"nseq out of range: {nseq}")
    return nseq


def encode_subjects(first_query: int, subjects: Sequence[Sequence[int]], nseq: int) -> bytes:
    """Encode per-query lists of distinct subject ids (any order) for queries ``first_query, ...``.

    Raises ValueError for anything :func:`decode_subjects` would refuse, so a container that leaves the
    sender is always decodable by a receiver with the same ``nseq``.
    """
    nseq = _check_nseq(nseq)
    first_query = operator.index(first_query)
    n_queries = len(subjects)
    if first_query < 0 or first_query + n_queries >= _VARINT_LIMIT:
        raise ValueError(f"first_query out of range: {first_query}")
    if n_queries > MAX_QUERIES:
        raise ValueError(f"too many queries in one container: {n_queries} > {MAX_QUERIES}")

    raw = bytearray()
    for q, ids in enumerate(subjects):
        ordered = sorted(operator.index(s) for s in ids)
        if ordered and (ordered[0] < 0 or ordered[-1] >= nseq):
            raise ValueError(f"query {first_query + q}: subject id out of [0, {nseq})")
        _put_varint(raw, len(ordered))
        prev = -1
        for s in ordered:
            if s == prev:
                raise ValueError(f"query {first_query + q}: duplicate subject id {s}")
            _put_varint(raw, s - prev - 1)
            prev = s
    if len(raw) > MAX_RAW_BYTES:
        raise ValueError(f"metadata body too large: {len(raw)} > {MAX_RAW_BYTES} bytes; split the run")

    body = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True).compress(bytes(raw))
    out = bytearray(MAGIC)
    out.append(VERSION)
    for v in (first_query, n_queries, nseq, len(raw), len(body)):
        _put_varint(out, v)
    out += body
    out += hashlib.sha256(out).digest()
    return bytes(out)


def _decompress(body: bytes, raw_len: int) -> bytes:
    """Decompress exactly one zstd frame of exactly ``raw_len`` bytes, never producing much more."""
    if body[:4] != _ZSTD_FRAME_MAGIC:  # also refuses skippable frames, which carry no data
        raise MetadataFormatError("body is not a zstd frame")
    try:
        params = zstandard.get_frame_parameters(body)
    except zstandard.ZstdError as e:
        raise MetadataFormatError(f"bad zstd frame header: {e}") from None
    if params.dict_id:
        raise MetadataFormatError("zstd frame needs a dictionary")
    # Refuses frames without a content size (CONTENTSIZE_UNKNOWN) and lying headers alike; with the size in
    # the header libzstd itself refuses to produce more than that.
    if params.content_size != raw_len:
        raise MetadataFormatError(
            f"zstd frame content size {params.content_size} != declared raw length {raw_len}"
        )
    dobj = zstandard.ZstdDecompressor(max_window_size=MAX_RAW_BYTES).decompressobj()
    chunks: list[bytes] = []
    produced = 0
    consumed = 0
    try:
        while consumed < len(body) and not dobj.eof:
            chunk = body[consumed : consumed + _FEED]
            consumed += len(chunk)
            out = dobj.decompress(chunk)
            produced += len(out)
            if produced > raw_len:
                raise MetadataFormatError(f"body decompresses to more than the declared {raw_len} bytes")
            chunks.append(out)
    except zstandard.ZstdError as e:
        raise MetadataFormatError(f"corrupt zstd body: {e}") from None
    if not dobj.eof:
        raise MetadataFormatError("truncated zstd body")
    if dobj.unused_data or consumed < len(body):
        raise MetadataFormatError("trailing bytes after the zstd frame")
    if produced != raw_len:
        raise MetadataFormatError(f"body decompresses to {produced} bytes, declared {raw_len}")
    return b"".join(chunks)


def decode_subjects(data: bytes, nseq: int) -> tuple[int, list[list[int]]]:
    """Decode a container from an untrusted peer; return (first_query, per-query ascending id lists).

    ``nseq`` is the size of the database the receiver holds: a container made for another database is
    refused rather than silently mapped onto the wrong sequences.
    """
    nseq = _check_nseq(nseq)
    try:
        buf = data if isinstance(data, bytes) else memoryview(data).tobytes()  # not bytes(int): zeros
    except TypeError:
        raise MetadataFormatError(f"metadata must be bytes, not {type(data).__name__}") from None
    if len(buf) < _MIN_LEN:
        raise MetadataFormatError(f"truncated container ({len(buf)} bytes)")
    if buf[: len(MAGIC)] != MAGIC:
        raise MetadataFormatError("bad magic: not a ParaMEDIC metadata container")
    if buf[len(MAGIC)] != VERSION:
        raise MetadataFormatError(f"unsupported container version {buf[len(MAGIC)]}")
    end = len(buf) - _DIGEST_LEN
    if hashlib.sha256(buf[:end]).digest() != buf[end:]:
        raise MetadataFormatError("checksum mismatch: container corrupted or truncated")

    pos = len(MAGIC) + 1
    first_query, pos = _get_varint(buf, pos, end, "first_query")
    n_queries, pos = _get_varint(buf, pos, end, "n_queries")
    got_nseq, pos = _get_varint(buf, pos, end, "nseq")
    raw_len, pos = _get_varint(buf, pos, end, "raw length")
    comp_len, pos = _get_varint(buf, pos, end, "compressed length")
    if got_nseq != nseq:
        raise MetadataFormatError(f"container is for a database of {got_nseq} sequences, expected {nseq}")
    if n_queries > MAX_QUERIES:
        raise MetadataFormatError(f"too many queries: {n_queries} > {MAX_QUERIES}")
    if first_query + n_queries >= _VARINT_LIMIT:
        raise MetadataFormatError("query ordinals overflow")
    if raw_len > MAX_RAW_BYTES:
        raise MetadataFormatError(f"raw length {raw_len} exceeds the limit of {MAX_RAW_BYTES} bytes")
    if n_queries > raw_len:  # every query takes at least its one-byte count
        raise MetadataFormatError(f"raw length {raw_len} too small for {n_queries} queries")
    if comp_len > end - pos:
        raise MetadataFormatError("truncated body")
    if comp_len < end - pos:
        raise MetadataFormatError("trailing bytes after the body")

    raw = _decompress(buf[pos:end], raw_len)
    return first_query, _parse_body(raw, n_queries, nseq)


def _parse_body(raw: bytes, n_queries: int, nseq: int) -> list[list[int]]:
    """Parse the decompressed body; every count and id is checked before it is used."""
    rlen = len(raw)
    pos = 0
    lists: list[list[int]] = []
    for _ in range(n_queries):
        count, pos = _get_varint(raw, pos, rlen, "count")
        if count > nseq:
            raise MetadataFormatError(f"count {count} exceeds nseq {nseq}")
        if count > rlen - pos:  # every delta takes at least one byte
            raise MetadataFormatError(f"count {count} exceeds the remaining {rlen - pos} body bytes")
        ids: list[int] = []
        prev = -1
        for _ in range(count):
            b = raw[pos] if pos < rlen else 0x80
            if b < 0x80:  # fast path: one-byte delta
                pos += 1
                delta = b
            else:
                delta, pos = _get_varint(raw, pos, rlen, "delta")
            prev = prev + 1 + delta
            if prev >= nseq:
                raise MetadataFormatError(f"subject id {prev} out of [0, {nseq})")
            ids.append(prev)
        lists.append(ids)
    if pos != rlen:
        raise MetadataFormatError(f"{rlen - pos} leftover bytes after {n_queries} queries")
    return lists
