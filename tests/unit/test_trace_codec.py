"""The trace metadata codec on synthetic CLOG2 files: lossless, periodic and not, and corrupt input refused."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from paramedic.ship.apps import app_for_file, app_named
from paramedic.ship.registry import make_codec
from paramedic.ship.wire import ProtocolError
from paramedic.trace import clog2, codec


def make_trace(
    kinds_per_rank: list[list[tuple[int, int, int, int]]],
    seed: int = 1,
    block_size: int = 4096,
    period: int = 0,
) -> bytes:
    """A CLOG2 file from per-rank (rectype, etype, peer, size) sequences, times in integer ns: random gaps,
    or with `period`, a gap per position in the period plus a jitter of a few ns (a regular code)."""
    rng = np.random.default_rng(seed)
    times, heads, bodies = [], [], []
    base = rng.integers(200, 50000, max(period, 1))
    for rank, kinds in enumerate(kinds_per_rank):
        if period:
            gaps = base[np.arange(len(kinds)) % period] + rng.integers(0, 4, len(kinds))
        else:
            gaps = rng.integers(200, 5000, len(kinds))
        t = np.cumsum(gaps).astype(np.int64)
        for i, (rectype, etype, peer, size) in enumerate(kinds):
            body = [0] * clog2.BODY_WORDS
            body[0] = etype
            if rectype == 7:
                body[2], body[3], body[4] = peer, 5, size
            elif rectype == 8:
                body[1], body[2] = -1, size
            times.append(t[i])
            heads.append([0, rank, 0, rectype])
            bodies.append(body)
    ns = np.asarray(times, np.int64)
    order = np.argsort(np.concatenate([ns]), kind="stable")
    rec = clog2.Records((ns / 1e9).view(np.uint64), np.asarray(heads, np.int32), np.asarray(bodies, np.int32))
    rec = rec.take(order)
    table = clog2.world_comm_table()
    # find the table's offset by writing once
    probe = clog2.write(
        clog2.Trace(
            clog2.make_preamble(len(kinds_per_rank), 0, block_size),
            True,
            block_size,
            rec,
            (0, 0, 0),
            [],
            table,
        )
    )
    fptr = len(probe) - len(table)
    return clog2.write(
        clog2.Trace(
            clog2.make_preamble(len(kinds_per_rank), fptr, block_size),
            True,
            block_size,
            rec,
            (0, 0, 0),
            [],
            table,
        )
    )


def periodic_kinds(rank: int, periods: int) -> list[tuple[int, int, int, int]]:
    step = [
        (5, 20, 0, 0),
        (7, -101, 1 - rank, 800),
        (5, 21, 0, 0),
        (5, 32, 0, 0),
        (7, -102, 1 - rank, 800),
        (5, 33, 0, 0),
    ]
    step += [(5, 66, 0, 0), (8, 66, 0, 8), (5, 67, 0, 0)]
    return [(5, 2, 0, 0)] + step * periods + [(5, 4, 0, 0), (5, 5, 0, 0)]


def random_kinds(rank: int, n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed + rank)
    choices = [(5, e, 0, 0) for e in range(20, 80, 2)] + [(7, -101, 0, 0), (7, -102, 0, 0), (8, 62, 0, 0)]
    out = []
    for _ in range(n):
        rectype, etype, _, _ = choices[rng.integers(len(choices))]
        out.append((rectype, etype, int(rng.integers(0, 4)), int(rng.integers(1, 1 << 20))))
    return out


def test_clog2_write_read_round_trip():
    data = make_trace([periodic_kinds(0, 50), periodic_kinds(1, 50)])
    trace = clog2.read(data)
    assert len(trace.records) == 2 * (1 + 9 * 50 + 2)
    assert clog2.write(trace) == data
    assert len(data) > 2 * 4096  # several blocks
    assert (len(data) - clog2.PREAMBLE_SIZE - len(trace.commtable)) % 4096 == 0


def test_write_in_either_byte_order_reads_back_the_same_records():
    """The writer copies int32 columns as they are in the machine's byte order and packs bytes otherwise:
    both files hold the same records, and each field is in its file's byte order."""
    trace = clog2.read(make_trace([periodic_kinds(0, 40), random_kinds(1, 300, seed=3)]))
    big = clog2.write(trace)
    little_preamble = trace.preamble.replace(b"is_big_endian=\0TRUE ", b"is_big_endian=\0FALSE")
    assert little_preamble != trace.preamble
    swapped_table = clog2.world_comm_table(big_endian=False)
    assert trace.commtable == clog2.world_comm_table(big_endian=True)
    little_trace = clog2.Trace(
        little_preamble, False, trace.block_size, trace.records, trace.end_head, trace.tails, swapped_table
    )
    little = clog2.write(little_trace)
    assert len(little) == len(big) and little != big
    back = clog2.read(little).records
    assert np.array_equal(back.time, trace.records.time)
    assert np.array_equal(back.head, trace.records.head)
    assert np.array_equal(back.body, trace.records.body)
    assert clog2.write(clog2.read(little)) == little
    # the first record's fields, byte for byte
    first = clog2.PREAMBLE_SIZE
    rec = trace.records
    assert little[first : first + 8] == rec.time[:1].astype("<u8").tobytes()
    assert big[first : first + 8] == rec.time[:1].astype(">u8").tobytes()
    assert little[first + 8 : first + 24] == rec.head[0].astype("<i4").tobytes()
    assert big[first + 8 : first + 24] == rec.head[0].astype(">i4").tobytes()


def test_word_rows_are_the_words_from_each_start_and_bounded():
    words = np.arange(10, dtype=np.int32)
    rows = clog2.word_rows(words, 3)
    assert rows.shape == (8, 3)
    starts = np.asarray([0, 4, 7])
    assert np.array_equal(rows[starts], words[starts[:, None] + np.arange(3)])
    with pytest.raises(IndexError):
        rows[np.asarray([8])]  # a record whose words would run past the end
    out = np.zeros(10, np.int64)
    clog2.word_rows(out, 2, writeable=True)[np.asarray([1, 5])] = [[7, 8], [9, 10]]
    assert out.tolist() == [0, 7, 8, 0, 0, 9, 10, 0, 0, 0]


def test_periodic_trace_is_small_and_exact():
    data = make_trace([periodic_kinds(0, 400), periodic_kinds(1, 400)], period=9)
    encoded = codec.encode(data)
    assert encoded.mode == "periodic"
    assert encoded.periods == {0: 9, 1: 9}
    assert codec.decode(encoded.data) == data
    assert len(encoded.data) * 20 < len(data)


def test_periodic_kinds_with_random_times_keep_the_columns_and_say_why():
    data = make_trace([periodic_kinds(0, 400), periodic_kinds(1, 400)])
    encoded = codec.encode(data)
    assert encoded.periods == {0: 9, 1: 9}
    assert encoded.mode == "columns" and "columns alone are smaller" in encoded.reason
    assert codec.decode(encoded.data) == data
    assert len(encoded.data) * 10 < len(data)


def test_find_period_on_kinds():
    kinds = np.tile(np.array([1, 2, 3, 2, 1, 5, 7]), 100)
    assert codec.find_period(kinds) == 7
    assert codec.find_period(np.random.default_rng(3).integers(0, 50, 700)) == 0


def test_aperiodic_trace_falls_back_and_says_so():
    data = make_trace([random_kinds(0, 3000, 5), random_kinds(1, 3000, 5)])
    encoded = codec.encode(data)
    assert encoded.mode in ("columns", "general")
    assert "aperiodic" in encoded.reason
    assert codec.decode(encoded.data) == data


def test_unmodelled_layout_goes_general():
    data = bytearray(make_trace([periodic_kinds(0, 100), periodic_kinds(1, 100)]))
    data[clog2.PREAMBLE_SIZE + 4096 - 1] = 7  # a stray byte in the first block's tail: kept, exactly
    encoded = codec.encode(bytes(data))
    assert codec.decode(encoded.data) == bytes(data)


def _rewrite_header(meta: bytes, change) -> bytes:
    (length,) = struct.unpack_from("<I", meta, 8)
    header = json.loads(meta[12 : 12 + length])
    change(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return meta[:8] + struct.pack("<I", len(text)) + text + meta[12 + length :]


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda m: m[:-10], "do not add up"),
        (lambda m: b"XXXX" + m[4:], "bad magic"),
        (lambda m: _rewrite_header(m, lambda h: h.update(sha256="0" * 64)), "SHA-256 differs"),
        (lambda m: _rewrite_header(m, lambda h: h.update(size=1 << 40)), "out of bounds"),
        (lambda m: _rewrite_header(m, lambda h: h["streams"][0].update(n=10**9)), "out of bounds"),
        (
            lambda m: _rewrite_header(m, lambda h: h["streams"][0].update(period=3)),
            "SHA-256 differs|out of range",
        ),
        (lambda m: m[:-40] + bytes(40), "decompress"),
        # issue 41: numbers the records' int32 words cannot hold raised OverflowError at the site
        (lambda m: _rewrite_header(m, lambda h: h["streams"][0].update(key=2**31)), "out of bounds"),
        (lambda m: _rewrite_header(m, lambda h: h["streams"][1].update(key=-(2**31) - 1)), "out of bounds"),
        (lambda m: _rewrite_header(m, lambda h: h["streams"][0].update(key=2**70)), "out of bounds"),
        (lambda m: _rewrite_header(m, lambda h: h.update(end_head=[2**40, 0, 0])), "out of bounds"),
        # found by make fuzz (session 26): "size": Infinity (OverflowError), "size" as a string (TypeError)
        (lambda m: _rewrite_header(m, lambda h: h.update(size=float("inf"))), "bad header"),
    ],
)
def test_corrupt_metadata_is_a_clear_error(corrupt, message):
    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    meta = codec.encode(data).data
    with pytest.raises(codec.MetadataError, match=message):
        codec.decode(corrupt(meta), max_size=1 << 30)


def test_a_size_written_as_a_string_is_read_as_its_number():
    """Found by make fuzz (session 26): "size": "1234" passed int() in the header check and was then used
    as given, a string (TypeError, "internal error" at the site)."""
    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    meta = _rewrite_header(codec.encode(data).data, lambda h: h.update(size=str(h["size"])))
    assert codec.decode(meta, max_size=1 << 30) == bytes(data)


def test_every_flipped_byte_is_refused_or_exact():
    data = make_trace([periodic_kinds(0, 30), periodic_kinds(1, 30)])
    meta = codec.encode(data).data
    for i in range(0, len(meta), max(1, len(meta) // 300)):
        bad = bytearray(meta)
        bad[i] ^= 0x41
        try:
            out = codec.decode(bytes(bad), max_size=len(data))
        except clog2.TraceFormatError:
            continue
        assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: b"NOTCLOG" + d[7:], "not a CLOG2 file"),
        (lambda d: d[:2000], "does not fit|communicator table"),
        (lambda d: d[:1044] + struct.pack(">i", 99) + d[1048:], "unknown record type"),
    ],
)
def test_damaged_clog2_is_a_clear_error(damage, message):
    data = make_trace([periodic_kinds(0, 20), periodic_kinds(1, 20)])
    with pytest.raises(clog2.TraceFormatError, match=message):
        codec.encode(damage(data))


def test_registry_and_ship_codec():
    data = make_trace([periodic_kinds(0, 50), periodic_kinds(1, 50)])
    assert app_for_file(data[:1024]) is app_named("trace")
    assert app_named("blast").needs_replica and not app_named("trace").needs_replica
    ship = make_codec(app_named("trace").metadata_codec)
    header, payload = ship.encode((0, data))
    assert b"".join(s.data for s in ship.decode(header, payload, None)) == data
    with pytest.raises(ProtocolError):
        ship.decode(dict(header, size=len(data) + 1), payload, None)


def test_a_site_without_replica_refuses_blast_metadata_and_takes_traces(tmp_path):
    from paramedic.site.store import JobStore

    root = tmp_path / "root"
    root.mkdir()
    store = JobStore(root, tmp_path / "state", None, io_workers=1, log=lambda _: None)
    with pytest.raises(ProtocolError, match="no database replica"):
        store.open(
            "compute-a", {"job": "a" * 32, "codec": "blast-metadata", "setup": {"out": "r.txt"}}, b"setup"
        )
    assert store.open(
        "compute-a", {"job": "b" * 32, "codec": "trace-metadata", "setup": {"out": "t.clog2"}}, b""
    )


def test_site_refuses_metadata_whose_regeneration_is_over_its_memory(monkeypatch):
    """Metadata claiming a file of 8 GiB (a few KB of it) is refused before anything is allocated: the site's
    decode holds about 10 bytes per byte of file, whatever the payload's size."""
    from paramedic.ship import trace_codec

    monkeypatch.setattr(trace_codec, "MEMORY", trace_codec.MemoryBudget(64 * 2**20))
    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    meta = _rewrite_header(codec.encode(data).data, lambda h: h.update(size=8 << 30))
    assert 10 * (8 << 30) <= codec.decode_memory(meta) < 10 * (8 << 30) + len(data) * 4
    with pytest.raises(
        ProtocolError,
        match=r"about 81,920 MiB of memory, over this storage site's memory for traces \(64 MiB",
    ):
        make_codec("trace-metadata").decode({"offset": 0, "size": 8 << 30}, meta, None)
    assert trace_codec.MEMORY.held == 0
    # within the budget: regenerated, and the budget returned
    meta = codec.encode(data).data
    assert 10 * len(data) <= codec.decode_memory(meta) <= 14 * len(data) < 64 * 2**20
    segments = make_codec("trace-metadata").decode({"offset": 0, "size": len(data)}, meta, None)
    assert b"".join(s.data for s in segments) == data and trace_codec.MEMORY.held == 0


def test_memory_budget_is_shared_and_returned():
    """Two decodes that fit together hold it at once; one that does not fit waits for the budget (a thread
    blocked on the condition, released when the first returns its share); an error returns the share."""
    import threading

    from paramedic.ship.trace_codec import MemoryBudget

    budget = MemoryBudget(100)
    entered = threading.Event()
    with budget.take(60):
        with budget.take(40):
            assert budget.held == 100

        def second() -> None:
            with budget.take(50):
                entered.set()

        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.05)  # 60 + 50 > 100: it waits (it cannot have entered while 60 are held)
        assert budget.held == 60
    thread.join(30)
    assert entered.is_set() and budget.held == 0
    with pytest.raises(RuntimeError), budget.take(100):
        raise RuntimeError("a decode failed")
    assert budget.held == 0
    with pytest.raises(ProtocolError, match="over this storage site's"), budget.take(101):
        pass


@pytest.mark.parametrize("etype_range", [(-110, 170), (-(1 << 31), (1 << 31) - 1), (5, 6)])
def test_kind_order_is_the_stable_sort_of_the_kinds(etype_range):
    """The 16-bit key (and the int64 fallback) give np.argsort's stable permutation, ties too, and
    np.unique's ranks."""
    rng = np.random.default_rng(7)
    rectypes = rng.choice([2, 5, 7, 8, 11], 5000).astype(np.int32)
    etypes = rng.integers(*etype_range, 5000, dtype=np.int64).astype(np.int32)
    etypes[::3] = etypes[0]  # many equal kinds: their order must be kept
    kinds = rectypes.astype(np.int64) * (1 << 32) + etypes.astype(np.int64)
    assert np.array_equal(codec.kind_order(kinds), np.argsort(kinds, kind="stable"))
    assert np.array_equal(codec._kind_ranks(kinds), np.unique(kinds, return_inverse=True)[1])
    assert len(codec.kind_order(np.zeros(0, np.int64))) == 0
    odd = np.asarray([np.iinfo(np.int64).max, -5, 3, -5, np.iinfo(np.int64).min], np.int64)  # not rectypes
    assert np.array_equal(codec.kind_order(odd), np.argsort(odd, kind="stable"))
    assert np.array_equal(codec._kind_ranks(odd), np.unique(odd, return_inverse=True)[1])


def test_zigzag_round_trip_at_the_extremes():
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        values = np.asarray([0, 1, -1, 2, -2, info.max, info.min, info.min + 1], dtype)
        assert np.array_equal(codec._unzigzag(codec._zigzag(values)), values)
        assert codec._zigzag(values)[:5].tolist() == [0, 2, 1, 4, 3]


@pytest.mark.parametrize("blob", [0, -1])
@pytest.mark.parametrize("inflated", ["twice the column", "a GiB"])
def test_a_part_declaring_more_than_it_may_is_refused_before_it_is_inflated(blob, inflated):
    """Issue 41, item 2: zstd inflates a frame to the size it declares whatever max_output_size says; the
    declared size is checked first (from the header, before the memory budget is asked, and again at each
    part against the size the records give it)."""
    import resource

    import zstandard

    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    header, blobs = codec.parse_header(codec.encode(data, check=False).data, len(data))
    content = 2 * len(data) if inflated == "twice the column" else 1 << 30
    packer = zstandard.ZstdCompressor(level=1).compressobj(size=content)
    parts = [packer.compress(bytes(min(1 << 20, content - done))) for done in range(0, content, 1 << 20)]
    blobs[blob] = b"".join([*parts, packer.flush()])
    meta = codec._frame(header, blobs)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(codec.MetadataError, match=r"declares \d+ bytes"):
        codec.decode_memory(meta, len(data)) if content > 4 * len(data) else codec.decode(meta, len(data))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown < 64, f"{grown:.0f} MiB"


def test_a_decode_past_its_deadline_stops_with_a_reason(monkeypatch):
    """Issue 41, item 4: --regen-timeout bounds a trace decode at the site (its wait for memory and each
    step of its rebuild), so that its I/O worker is not held long past it."""
    import time

    from paramedic.ship import trace_codec

    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    meta = codec.encode(data).data
    assert codec.decode(meta, deadline=time.monotonic() + 60) == data
    with pytest.raises(codec.MetadataError, match="regenerating took longer than its time; stopped"):
        codec.decode(meta, deadline=time.monotonic() - 1)
    monkeypatch.setattr(trace_codec, "MEMORY", trace_codec.MemoryBudget(64 * 2**20, wait_seconds=0.0))
    with pytest.raises(ProtocolError, match="took longer than its time"):
        make_codec("trace-metadata").decode({"offset": 0, "size": len(data)}, meta, None)
    assert trace_codec.MEMORY.held == 0
