"""A trace shipped in units (trace.units, ship.trace_codec): each range of whole blocks regenerated alone,
byte for byte, and every field of a unit checked (a hostile or damaged unit is refused, never written)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from paramedic.ship.codecs import Segment
from paramedic.ship.trace_codec import TraceMetadataCodec
from paramedic.ship.wire import ProtocolError
from paramedic.trace import clog2, codec, units
from tests.unit.test_trace_codec import make_trace, periodic_kinds, random_kinds

UNIT = 3 * 4096  # three blocks of make_trace's 4,096 bytes


@pytest.fixture(scope="module")
def periodic() -> bytes:
    return make_trace([periodic_kinds(0, 400), periodic_kinds(1, 400)], period=9)


def small_units() -> TraceMetadataCodec:
    made = TraceMetadataCodec()
    made.unit_bytes = UNIT
    return made


def regenerate(made: TraceMetadataCodec, chunks: list[tuple[dict, bytes]]) -> bytes:
    """What the storage site writes: every chunk decoded alone (as the site's header copy), the segments
    placed at their offsets."""
    segments: list[Segment] = []
    for header, payload in chunks:
        segments += made.decode(json.loads(json.dumps(header)), payload, None)
    out = bytearray()
    for segment in sorted(segments, key=lambda s: s.position):
        assert segment.position == len(out)
        out += segment.data
    return bytes(out)


@pytest.mark.parametrize(
    "trace",
    [
        lambda: make_trace([periodic_kinds(0, 400), periodic_kinds(1, 400)], period=9),
        lambda: make_trace([random_kinds(0, 3000, 3), random_kinds(1, 3000, 3)]),
    ],
    ids=["periodic", "aperiodic"],
)
def test_units_regenerate_the_file_byte_for_byte(trace) -> None:
    data = trace()
    made = small_units()
    cut = made.units(data)
    assert cut is not None and len(cut) >= 3
    assert [u.offset for u in cut] == sorted(u.offset for u in cut) and cut[0].offset == 0
    assert b"".join(u.data for u in cut) == data
    assert cut[0].first and cut[-1].last and not any(u.last for u in cut[:-1])
    for unit in cut:  # a standalone file that MPE2's layout reads, of the range's blocks
        assert len(clog2.read(unit.standalone).tails) == unit.blocks
    chunks = [made.encode_unit(u) for u in cut]
    assert regenerate(made, chunks) == data
    assert made.check_units(cut, data) is None
    assert regenerate(made, list(reversed(chunks))) == data  # the site decodes them in any order


def test_a_small_file_ships_whole(periodic: bytes) -> None:
    assert TraceMetadataCodec().units(periodic) is None  # under two units of the default size
    assert units.cut(periodic, len(periodic) // 2 + 1) is None
    assert units.cut(b"not a trace" * 10_000, UNIT) is None


def tampered(unit_header: dict, key: str, value: object) -> dict:
    changed = dict(unit_header)
    if value is None:
        changed.pop(key, None)
    else:
        changed[key] = value
    return changed


@pytest.mark.parametrize(
    ("which", "key", "value", "message"),
    [
        (1, "end_time", "00" * 8, "SHA-256 differs"),
        (1, "end_time", "zz", "bad end_time"),
        (1, "end_at", 1024, "end record"),
        (1, "end_at", 1 << 40, "end record"),
        (1, "end_at", None, "bad end_at"),
        (1, "blocks", 1, "blocks do not match"),
        (1, "first", True, "bad first"),
        (1, "last", True, "out of bounds"),
        (1, "sha256", "0" * 64, "SHA-256 differs"),
        (1, "preamble", "QQ==", "preamble in a unit"),
        (0, "preamble", "!!", "bad preamble"),
        (0, "preamble", "A" * 4000, "bad preamble"),
        (0, "preamble", None, "bad preamble"),
        (-1, "end_at", 2048, "ENDLOG"),
    ],
)
def test_a_tampered_unit_is_refused(
    periodic: bytes, which: int, key: str, value: object, message: str
) -> None:
    made = small_units()
    cut = made.units(periodic)
    assert cut is not None
    header, payload = made.encode_unit(cut[which])
    header = {**header, "unit": tampered(header["unit"], key, value)}
    with pytest.raises(ProtocolError, match=message):
        made.decode(header, payload, None)


def test_units_swapped_or_misplaced_are_refused(periodic: bytes) -> None:
    made = small_units()
    cut = made.units(periodic)
    assert cut is not None
    (h1, p1), (h2, p2) = made.encode_unit(cut[1]), made.encode_unit(cut[2])
    with pytest.raises(ProtocolError, match="trace chunk"):
        made.decode(h1, p2, None)  # another unit's metadata under this unit's header
    with pytest.raises(ProtocolError, match="out of bounds"):  # (its standalone file has a preamble)
        made.decode({**h1, "offset": 0}, p1, None)
    with pytest.raises(ProtocolError, match="SHA-256 differs"):  # another unit's place
        made.decode({**h1, "offset": h2["offset"]}, p1, None)
    with pytest.raises(ProtocolError, match="bad unit or offset"):
        made.decode({**h1, "offset": -5}, p1, None)
    with pytest.raises(ProtocolError, match="bad unit or offset"):
        made.decode({**h1, "unit": ["x"]}, p1, None)
    with pytest.raises(ProtocolError, match="size"):
        made.decode({**h1, "size": h1["size"] - 8}, p1, None)
    with pytest.raises(ProtocolError, match="offset 0"):  # a whole trace is at offset 0
        made.decode({k: v for k, v in h1.items() if k != "unit"}, p1, None)


def test_every_flipped_payload_byte_is_refused_or_exact(periodic: bytes) -> None:
    """A flipped byte anywhere in a unit's metadata: refused in one ProtocolError, or (a byte the decoder
    never reads) the same range."""
    made = small_units()
    cut = made.units(periodic)
    assert cut is not None
    unit = cut[1]
    header, payload = made.encode_unit(unit)
    rng = np.random.default_rng(22)
    for at in rng.choice(len(payload), size=min(len(payload), 300), replace=False).tolist():
        bad = bytearray(payload)
        bad[at] ^= 1 << int(rng.integers(8))
        try:
            segments = made.decode(header, bytes(bad), None)
        except ProtocolError as exc:
            assert "\n" not in str(exc)
            continue
        assert b"".join(s.data for s in segments) == unit.data


def test_a_range_the_columns_do_not_rebuild_is_found_by_the_check(periodic: bytes) -> None:
    """An ENDBLOCK whose time is not the next record's (another writer's layout) inside a unit: its
    standalone file's metadata, unchecked, does not rebuild the range; `check_units` says so and gives the
    whole file's checked metadata instead (what the compute site reships after the site's refusal)."""
    data = bytearray(periodic)
    pre = clog2.parse_preamble(bytes(data), len(data))
    nblocks = (pre.commtable_fptr - clog2.PREAMBLE_SIZE) // pre.block_size
    words = np.frombuffer(bytes(data), ">i4", count=nblocks * pre.block_size // 4, offset=clog2.PREAMBLE_SIZE)
    walked = clog2._walk_blocks(words[5::2], nblocks, pre.block_size // 8, 1 << 28)
    assert walked is not None
    at = clog2.PREAMBLE_SIZE + 8 * int(walked[1][4])  # block 4's ENDBLOCK: inside the second unit
    data[at : at + 8] = np.asarray([123.0], ">f8").tobytes()
    made = small_units()
    cut = made.units(bytes(data))
    assert cut is not None
    with pytest.raises(ProtocolError, match="SHA-256 differs"):
        regenerate(made, [made.encode_unit(u) for u in cut])
    replacement = made.check_units(cut, bytes(data))
    assert replacement is not None
    header, payload = replacement
    assert header["offset"] == 0 and "unit" not in header
    assert codec.decode(payload, max_size=len(data)) == bytes(data)
    assert hashlib.sha256(regenerate(made, [replacement])).digest() == hashlib.sha256(data).digest()
