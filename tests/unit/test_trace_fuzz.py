"""Hostile and damaged trace input (issue 22): CLOG2 files and trace metadata damaged at random (seeded),
and header fields set to hostile values. Every case ends in a one-line TraceFormatError (an InputError:
exit 3) or in the exact file, never another exception, a hang, or a wrong file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from paramedic.errors import UsageError
from paramedic.trace import clog2, codec, precision
from tests.unit.test_trace_codec import make_trace, periodic_kinds, random_kinds


@pytest.fixture(scope="module")
def trace() -> bytes:
    return make_trace([periodic_kinds(0, 60), random_kinds(1, 500, 4)], block_size=2048)


def damaged(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    how = int(rng.integers(0, 4))
    if how == 0:  # a few bytes flipped anywhere
        for at in rng.integers(0, len(out), int(rng.integers(1, 6))).tolist():
            out[at] ^= int(rng.integers(1, 256))
    elif how == 1:  # a record type or size word set to something odd
        at = clog2.PREAMBLE_SIZE + 8 * int(rng.integers(0, (len(out) - clog2.PREAMBLE_SIZE) // 8)) + 20
        out[at : at + 4] = struct.pack(">i", int(rng.choice([-1, 0, 1, 11, 12, 1 << 30])))
    elif how == 2:  # truncated
        del out[int(rng.integers(0, len(out))) :]
    else:  # a preamble field rewritten
        text = bytes(out[: clog2.PREAMBLE_SIZE])
        field = [b"block_size=\0", b"max_comm_world_size=\0", b"is_big_endian=\0"][int(rng.integers(0, 3))]
        at = text.find(field) + len(field)
        value = [b"0", b"8", b"-9", b"99999999999", b"TRUE", b"4096", b"x"][int(rng.integers(0, 7))]
        end = text.index(b"\0", at)
        text = (text[:at] + value + text[end:]).ljust(clog2.PREAMBLE_SIZE, b"\0")[: clog2.PREAMBLE_SIZE]
        out[: clog2.PREAMBLE_SIZE] = text
    return bytes(out)


def test_damaged_clog2_is_refused_or_exact(trace: bytes) -> None:
    rng = np.random.default_rng(22)
    refused = 0
    for _ in range(150):
        bad = damaged(trace, rng)
        try:
            meta = codec.encode(bad).data
        except clog2.TraceFormatError as exc:
            assert "\n" not in str(exc) and str(exc)
            refused += 1
            continue
        assert codec.decode(meta, max_size=len(bad)) == bad
    assert refused > 50  # most damage is caught


def test_the_fast_walk_agrees_with_the_record_walk(trace: bytes) -> None:
    """The vectorised block walk accepts exactly the files the record-by-record walk accepts, with the
    same record and block-end slots (it gives up, None, on anything else)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        bad = damaged(trace, rng)
        try:
            pre = clog2.parse_preamble(bad, len(bad))
        except clog2.TraceFormatError:
            continue
        per_block = pre.block_size // 8
        nblocks = (pre.commtable_fptr - clog2.PREAMBLE_SIZE) // pre.block_size
        if nblocks < 1:
            continue
        bo = ">" if pre.big_endian else "<"
        types = np.frombuffer(bad, f"{bo}i4", count=nblocks * per_block * 2, offset=clog2.PREAMBLE_SIZE)[5::2]
        fast = clog2._walk_blocks(types, nblocks, per_block, 1 << 28)
        try:
            slow = clog2._walk_records(bad, types.tolist(), nblocks, per_block, 1 << 28)
        except clog2.TraceFormatError:
            assert fast is None
            continue
        if fast is not None:
            assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])


def _rewrite(meta: bytes, change) -> bytes:
    (length,) = struct.unpack_from("<I", meta, 8)
    header = json.loads(meta[12 : 12 + length])
    change(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return meta[:8] + struct.pack("<I", len(text)) + text + meta[12 + length :]


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h.update(time_unit=0),
        lambda h: h.update(time_unit=-7),
        lambda h: h.update(time_unit=10**13),
        lambda h: h.update(time_unit="ns"),
        lambda h: h.update(time_unit=[1]),
        lambda h: h.update(time_unit=3),  # not the unit the times were divided by: the digest says so
        lambda h: h.update(time="bits", time_unit=1000),
        lambda h: h.update(streams="all"),
        lambda h: h.update(streams=[{"n": 1}]),
        lambda h: h["streams"].append(dict(h["streams"][0])),
        lambda h: h.update(block_size=8),
        lambda h: h.update(end_head=[0, 0]),
        lambda h: h.update(order="random"),
        lambda h: h.update(tails=[-1]),
        lambda h: h.update(blobs=[-5] + h["blobs"][1:]),
        lambda h: h.update(mode="lossy"),
        lambda h: h.update(format=3),
        lambda h: h.update(format="2"),
        lambda h: h.update(format=True),
        lambda h: h.update(format=1),  # format 1 has no time unit
        lambda h: h.pop("format"),
    ],
)
def test_hostile_metadata_headers_are_refused(change) -> None:
    data = precision.reduce(make_trace([periodic_kinds(0, 80), periodic_kinds(1, 80)], period=9), 1000)
    meta = codec.encode(data).data
    assert b'"time_unit":1000' in meta
    with pytest.raises(clog2.TraceFormatError) as caught:
        codec.decode(_rewrite(meta, change), max_size=1 << 30)
    assert "\n" not in str(caught.value)


def test_random_metadata_damage_is_refused_or_exact() -> None:
    data = make_trace([periodic_kinds(0, 80), random_kinds(1, 300, 9)])
    meta = codec.encode(data).data
    rng = np.random.default_rng(7)
    for _ in range(150):
        bad = bytearray(meta)
        for at in rng.integers(0, len(bad), int(rng.integers(1, 4))).tolist():
            bad[at] = int(rng.integers(0, 256))
        try:
            out = codec.decode(bytes(bad), max_size=len(data))
        except clog2.TraceFormatError:
            continue
        assert out == data


def test_precision_option() -> None:
    assert precision.parse("lossless") == 0
    assert [precision.parse(x) for x in ("1ns", "100ns", "1us", "10us", "1ms", "1s")] == [
        1, 100, 1000, 10_000, 1_000_000, 10**9,
    ]  # fmt: skip
    assert [precision.label(q) for q in (0, 100, 1000, 2500, 10**6, 10**9)] == [
        "lossless", "100ns", "1us", "2500ns", "1ms", "1s",
    ]  # fmt: skip
    for bad in ("", "0us", "2s", "1h", "-1us", "1e3ns", "1 us us"):
        with pytest.raises(UsageError):
            precision.parse(bad)


def test_reduced_precision_keeps_records_and_rounds_times() -> None:
    data = make_trace([periodic_kinds(0, 200), random_kinds(1, 900, 3)], block_size=2048)
    coarse = precision.reduce(data, 10_000)
    before, after = clog2.read(data), clog2.read(coarse)
    assert np.array_equal(before.records.head, after.records.head)
    assert np.array_equal(before.records.body, after.records.body)
    ns = np.rint(after.records.seconds() * 1e9).astype(np.int64)
    assert np.all(ns % 10_000 == 0)
    assert np.all(np.abs(ns - before.records.seconds() * 1e9) <= 5_000 + 1)
    encoded = codec.encode(coarse, precision="10us")
    assert codec.decode(encoded.data) == coarse
    assert len(encoded.data) < len(codec.encode(data).data)
    assert precision.reduce(coarse, 10_000) == coarse  # rounding twice changes nothing
