"""The semantic-metadata codec: round trips, compactness, and a strict decoder for untrusted input.

Most malformed containers would be caught by the SHA-256 trailer alone, which would hide bugs in the parser
behind it; so the fuzz tests also re-seal mutated containers (recompute the trailer) and build containers
from arbitrary header fields and bodies, so that every bounds check of the parser itself is exercised.
"""

from __future__ import annotations

import hashlib
import random

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramedic.ship.idcodec import (
    MAX_QUERIES,
    MAX_RAW_BYTES,
    MetadataFormatError,
    decode_subjects,
    encode_subjects,
)

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NSEQ = 5000


# -- helpers -----------------------------------------------------------------------------------------


def varint(v: int) -> bytes:
    """LEB128 for any v >= 0, including values the decoder must refuse (>= 2**63)."""
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def seal(payload: bytes) -> bytes:
    """Append a correct SHA-256 trailer, so the parser (not the checksum) has to reject what follows."""
    return payload + hashlib.sha256(payload).digest()


def reseal(container: bytes) -> bytes:
    """Recompute the trailer of a (mutated) container."""
    return seal(container[:-32])


def zframe(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def build(
    raw: bytes | None = None,
    *,
    first: int = 0,
    n_queries: int = 0,
    nseq: int = NSEQ,
    raw_len: int | None = None,
    body: bytes | None = None,
    comp_len: int | None = None,
    magic: bytes = b"PMDS",
    version: int = 1,
) -> bytes:
    """A sealed container with every field under the test's control (defaults consistent with `raw`)."""
    raw = b"" if raw is None else raw
    body = zframe(raw) if body is None else body
    header = magic + bytes([version])
    for v in (first, n_queries, nseq, len(raw) if raw_len is None else raw_len):
        header += varint(v)
    header += varint(len(body) if comp_len is None else comp_len)
    return seal(header + body)


def assert_sane(result: tuple[int, list[list[int]]], nseq: int) -> None:
    """What a decoder may return at all: in-bounds, strictly increasing ids that re-encode identically."""
    first, lists = result
    assert isinstance(first, int) and first >= 0
    assert len(lists) <= MAX_QUERIES
    for ids in lists:
        assert all(isinstance(i, int) for i in ids)
        assert all(0 <= i < nseq for i in ids)
        assert all(a < b for a, b in zip(ids, ids[1:], strict=False))
    assert decode_subjects(encode_subjects(first, lists, nseq), nseq) == (first, lists)


def decode_strict(data: object, nseq: int = NSEQ) -> None:
    """Decoding arbitrary input either raises MetadataFormatError or yields a sane result; nothing else."""
    try:
        result = decode_subjects(data, nseq)  # type: ignore[arg-type]
    except MetadataFormatError:
        return
    assert_sane(result, nseq)


def sample_container(seed: int = 0, n: int = 12, k: int = 6) -> bytes:
    r = random.Random(seed)
    subjects = [r.sample(range(NSEQ), r.randint(0, k)) for _ in range(n)]
    subjects[0] = []
    subjects[1] = [0, NSEQ - 1]
    return encode_subjects(r.randint(0, 10**6), subjects, NSEQ)


VALID = sample_container()


# -- round trips -------------------------------------------------------------------------------------


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, list[list[int]], int]:
    nseq = draw(
        st.one_of(
            st.just(1),
            st.integers(1, 300),
            st.integers(2**40 - 1000, 2**40 + 1000),
            st.integers(1, 2**62),
        )
    )
    ids = st.one_of(st.integers(0, nseq - 1), st.integers(max(0, nseq - 200), nseq - 1))
    lists = draw(st.lists(st.sets(ids, max_size=25).map(list), max_size=20))
    for ids_ in lists:
        draw(st.randoms()).shuffle(ids_)
    first = draw(st.one_of(st.integers(0, 1000), st.integers(0, 2**62)))
    return first, lists, nseq


@FUZZ
@given(runs())
def test_round_trip(run: tuple[int, list[list[int]], int]) -> None:
    first, lists, nseq = run
    data = encode_subjects(first, lists, nseq)
    assert decode_subjects(data, nseq) == (first, [sorted(ids) for ids in lists])
    assert encode_subjects(first, lists, nseq) == data  # deterministic


@pytest.mark.parametrize(
    ("first", "lists", "nseq"),
    [
        (0, [], 0),
        (0, [[], [], []], 0),
        (5, [[0]], 1),
        (0, [[]], 1),
        (2**62, [[2**62 - 1, 0, 2**61]], 2**62),
        (0, [list(range(300))], 300),  # dense: every delta is 0
    ],
)
def test_round_trip_edges(first: int, lists: list[list[int]], nseq: int) -> None:
    assert decode_subjects(encode_subjects(first, lists, nseq), nseq) == (first, [sorted(x) for x in lists])


def test_accepts_bytes_like_input() -> None:
    expected = decode_subjects(VALID, NSEQ)
    assert decode_subjects(bytearray(VALID), NSEQ) == expected
    assert decode_subjects(memoryview(VALID), NSEQ) == expected


def test_size_500_queries_of_48_ids_from_20000() -> None:
    r = random.Random(20000)
    subjects = [r.sample(range(20000), 48) for _ in range(500)]
    data = encode_subjects(0, subjects, 20000)
    per_id = len(data) / (500 * 48)
    assert per_id < 2.0, f"{len(data)} bytes = {per_id:.3f} bytes/id"
    assert decode_subjects(data, 20000) == (0, [sorted(s) for s in subjects])


# -- encoder refuses what the decoder would refuse ---------------------------------------------------


@pytest.mark.parametrize(
    ("first", "lists", "nseq"),
    [
        (0, [[5]], 5),  # id == nseq
        (0, [[-1]], 5),
        (0, [[1, 2, 1]], 5),  # duplicate
        (-1, [[1]], 5),
        (0, [[]], -1),
        (0, [[0]], 0),
        (0, [[]], 2**63),
        (2**63 - 1, [[]], 5),  # query ordinals overflow
        (0, [[1.0]], 5),  # not an int
    ],
)
def test_encode_rejects(first: int, lists: list[list[int]], nseq: int) -> None:
    with pytest.raises((ValueError, TypeError)):
        encode_subjects(first, lists, nseq)


def test_encode_rejects_too_many_queries() -> None:
    with pytest.raises(ValueError):
        encode_subjects(0, [[]] * (MAX_QUERIES + 1), 1)


# -- explicit malformed containers -------------------------------------------------------------------


def rejects(data: object, match: str | None = None, nseq: int = NSEQ) -> None:
    with pytest.raises(MetadataFormatError, match=match):
        decode_subjects(data, nseq)  # type: ignore[arg-type]


def test_container_layout() -> None:
    data = encode_subjects(3, [[1, 4], []], NSEQ)
    assert data[:5] == b"PMDS\x01"
    assert data[5:9] == varint(3) + varint(2) + varint(NSEQ)
    raw = varint(2) + varint(1) + varint(2) + varint(0)
    assert data[9:11] == varint(len(raw)) + varint(len(data) - 11 - 32)
    assert zstandard.ZstdDecompressor().decompress(data[11:-32]) == raw
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    assert build(raw, first=3, n_queries=2, body=data[11:-32]) == data


def test_header_rejections() -> None:
    rejects(b"", "truncated")
    rejects(VALID[:40], "truncated")
    rejects(reseal(b"XMDS" + VALID[4:]), "magic")
    rejects(reseal(VALID[:4] + b"\x02" + VALID[5:]), "version")
    rejects(VALID[:-1] + bytes([VALID[-1] ^ 1]), "checksum")
    rejects(VALID + b"\0", "checksum")
    rejects(VALID, "expected 4999", nseq=NSEQ - 1)
    rejects(VALID, "expected 5001", nseq=NSEQ + 1)
    rejects(12345, "bytes")
    rejects("PMDS", "bytes")
    rejects(None, "bytes")


def test_varint_rejections() -> None:
    rejects(build(first=2**63), "overflow")
    rejects(build(first=2**70), "overflow|longer")
    rejects(build(first=2**70 - 1), "overflow")
    rejects(build(b"\0", first=2**63 - 1, n_queries=1), "overflow")  # ordinals first..first+n would not fit
    long_zero = b"PMDS\x01" + b"\x80" * 10 + b"\x00" + b"\x00\x00\x00\x00"
    rejects(seal(long_zero + zframe(b"")), "varint")
    nonminimal = b"PMDS\x01" + b"\x80\x00" + b"\x00\x00\x00\x00"
    rejects(seal(nonminimal + zframe(b"")), "non-minimal")
    rejects(seal(b"PMDS\x01\x00\x00\x00\x00" + b"\x80" * 3), "truncated varint")


def test_bounds_rejections() -> None:
    rejects(build(b"\0" * 3, n_queries=MAX_QUERIES + 1), "too many queries")
    rejects(build(b"\0", n_queries=2), "too small")
    rejects(build(raw_len=MAX_RAW_BYTES + 1), "exceeds the limit")
    rejects(build(raw_len=2**62), "exceeds the limit")
    body = zframe(b"\0")
    rejects(build(b"\0", n_queries=1, body=body, comp_len=len(body) + 1), "truncated body")
    rejects(build(b"\0", n_queries=1, body=body, comp_len=len(body) - 1), "trailing bytes")


def test_zip_bombs_rejected() -> None:
    bomb = zframe(b"\0" * (16 * 2**20))
    assert len(bomb) < 2000
    # Declared raw length small, body much larger.
    rejects(build(b"\0" * 100, n_queries=1, body=bomb), "content size")
    # No content size in the frame at all.
    unsized = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"\0" * (16 * 2**20))
    rejects(build(b"\0" * 100, n_queries=1, body=unsized), "content size")
    # A frame header that lies about its own content size: the decoder must not trust it.
    frame = zframe(b"\0" * 2**20)
    assert frame[4] >> 6 == 2 and frame[4] & 0x20  # 4-byte content size, single segment, right after FHD
    liar = frame[:5] + (100).to_bytes(4, "little") + frame[9:]
    assert zstandard.get_frame_parameters(liar).content_size == 100
    rejects(build(b"\0" * 100, n_queries=1, body=liar), "zstd|declared")
    # Declared raw length above the cap, consistent with the frame: refused before decompressing.
    big = zframe(b"\0" * (MAX_RAW_BYTES + 1))
    rejects(build(n_queries=1, raw_len=MAX_RAW_BYTES + 1, body=big), "exceeds the limit")


def test_zstd_framing_rejections() -> None:
    raw = varint(1) + varint(7)
    rejects(build(raw, n_queries=1, body=zframe(raw) + zframe(b"")), "trailing bytes")
    rejects(build(raw, n_queries=1, body=zframe(raw)[:-1]), "truncated|corrupt")
    rejects(build(raw, n_queries=1, body=b"junk" * 3), "not a zstd frame")
    skippable = b"\x50\x2a\x4d\x18" + (0).to_bytes(4, "little")
    rejects(build(b"", body=skippable), "not a zstd frame")
    rejects(build(b"", body=b""), "not a zstd frame")


def body_case(raw: bytes, n_queries: int, nseq: int = 10) -> bytes:
    return build(raw, n_queries=n_queries, nseq=nseq)


def test_body_rejections() -> None:
    assert decode_subjects(body_case(varint(2) + varint(3) + varint(5), 1), 10) == (0, [[3, 9]])
    rejects(body_case(varint(2) + varint(3) + varint(6), 1), nseq=10, match="out of")  # id 10
    rejects(body_case(varint(1) + varint(10), 1), nseq=10, match="out of")
    rejects(body_case(varint(11) + b"\0" * 11, 1), nseq=10, match="exceeds nseq")
    rejects(body_case(varint(3) + b"\0\0", 1), nseq=10, match="remaining")
    rejects(body_case(varint(1) + b"\x81", 1), nseq=10, match="truncated varint")
    rejects(body_case(varint(1) + b"\x80\x00", 1), nseq=10, match="non-minimal")
    rejects(body_case(varint(1) + varint(2**63), 1), nseq=10, match="overflow")
    rejects(body_case(varint(0) + varint(0), 1), nseq=10, match="leftover")
    rejects(body_case(varint(0), 2), nseq=10, match="too small")
    rejects(body_case(varint(0) + varint(1), 2), nseq=10, match="truncated varint|remaining")
    rejects(body_case(varint(1) + varint(0), 1, nseq=0), nseq=0, match="exceeds nseq")


# -- fuzzing -----------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    decode_strict(data)


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 3))
def test_fuzz_random_sealed_after_magic(tail: bytes, version: int) -> None:
    decode_strict(seal(b"PMDS" + bytes([version]) + tail))


def test_truncation_at_every_position() -> None:
    for cut in range(len(VALID)):
        rejects(VALID[:cut])
        decode_strict(reseal(VALID[:cut]) if cut >= 32 else VALID[:cut])


@FUZZ
@given(st.data())
def test_fuzz_mutations(data: st.DataObject) -> None:
    """Unsealed mutations must all be caught; re-sealed ones reach the parser and must stay in bounds."""
    base = data.draw(st.sampled_from([VALID, sample_container(1, 3, 2), encode_subjects(0, [], NSEQ)]))
    kind = data.draw(st.sampled_from(["flip", "insert", "delete", "append", "splice"]))
    i = data.draw(st.integers(0, len(base) - 1))
    if kind == "flip":
        mutated = base[:i] + bytes([base[i] ^ data.draw(st.integers(1, 255))]) + base[i + 1 :]
    elif kind == "insert":
        mutated = base[:i] + data.draw(st.binary(min_size=1, max_size=12)) + base[i:]
    elif kind == "delete":
        mutated = base[:i] + base[i + data.draw(st.integers(1, 12)) :]
    elif kind == "append":
        mutated = base + data.draw(st.binary(min_size=1, max_size=12))
    else:
        mutated = base[:i] + data.draw(st.binary(max_size=40))
    if mutated != base:
        rejects(mutated)
    if len(mutated) >= 32:
        decode_strict(reseal(mutated))


@FUZZ
@given(
    st.lists(st.integers(0, 2**65), min_size=5, max_size=5),
    st.binary(max_size=60),
    st.booleans(),
)
def test_fuzz_header_fields(fields: list[int], raw: bytes, honest_frame: bool) -> None:
    first, n_queries, nseq, raw_len, comp_len = fields
    body = zframe(raw)
    if honest_frame:  # keep raw_len / comp_len consistent so the body parser is reached more often
        raw_len, comp_len = len(raw), len(body)
    nseq_expected = nseq if nseq < 2**63 else NSEQ
    data = build(
        raw, first=first, n_queries=n_queries, nseq=nseq, raw_len=raw_len, body=body, comp_len=comp_len
    )
    decode_strict(data, nseq_expected)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Bodies made of plausible, boundary and overflowing varints, plus raw junk."""
    value = st.one_of(
        st.integers(0, 12), st.integers(0, 2**64), st.sampled_from([2**63 - 1, 2**63, 2**7, 2**14])
    )
    parts = draw(st.lists(st.one_of(value.map(varint), st.binary(max_size=3)), max_size=40))
    return b"".join(parts)


@FUZZ
@given(bodies(), st.integers(0, 12), st.sampled_from([0, 1, 2, 10, 2**40]))
def test_fuzz_body(raw: bytes, n_queries: int, nseq: int) -> None:
    decode_strict(build(raw, n_queries=n_queries, nseq=nseq), nseq)
