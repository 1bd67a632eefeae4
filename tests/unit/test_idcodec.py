"""The semantic-metadata codec: round trips, compactness, and a strict decoder for untrusted input.

Most malformed containers would be caught by the SHA-256 trailer alone, which would hide bugs in the parser
behind it; so the fuzz tests also re-seal mutated containers (recompute the trailer) and build containers
from arbitrary header fields and bodies, so that every bounds check of the parser itself is exercised.

Lists may be coded against a job's earlier lists (an IdHistory both ends grow identically), so every
decode here also checks the history contract: a refused container leaves the receiver's history exactly as
it was, and an accepted one appends exactly the decoded lists. The fuzz tests run both with a fresh history
and with one pre-filled with a few lists, so that the reference paths of the parser are fuzzed too.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from unittest import mock

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramedic.ship import idcodec
from paramedic.ship.idcodec import (
    MAX_IDS,
    MAX_QUERIES,
    MAX_RAW_BYTES,
    IdHistory,
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


def vs(*values: int) -> bytes:
    """Several varints back to back (one stream)."""
    return b"".join(varint(v) for v in values)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The (well-formed) varint at `pos`, and the position after it."""
    end = pos
    while data[end] >= 0x80:
        end += 1
    return unvarints(data[pos : end + 1])[0], end + 1


def unvarints(data: bytes) -> list[int]:
    """The values of a stream of (well-formed) varints."""
    values, value, shift = [], 0, 0
    for b in data:
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            values.append(value)
            value, shift = 0, 0
    assert shift == 0, "stream ends inside a varint"
    return values


def seal(payload: bytes) -> bytes:
    """Append a correct SHA-256 trailer, so the parser (not the checksum) has to reject what follows."""
    return payload + hashlib.sha256(payload).digest()


def reseal(container: bytes) -> bytes:
    """Recompute the trailer of a (mutated) container."""
    return seal(container[:-32])


def zframe(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def v2_body(
    refs: bytes = b"",
    runs: bytes = b"",
    counts: bytes = b"",
    deltas: bytes = b"",
    *,
    lengths: Sequence[int] | None = None,
) -> bytes:
    """A decompressed v2 body from its four streams; `lengths` overrides the three declared stream lengths."""
    declared = (len(refs), len(runs), len(counts)) if lengths is None else lengths
    return vs(*declared) + refs + runs + counts + deltas


EMPTY_BODY = v2_body()  # zero queries


def build(
    raw: bytes | None = None,
    *,
    first: int = 0,
    n_queries: int = 0,
    nseq: int = NSEQ,
    position: int = 0,
    raw_len: int | None = None,
    body: bytes | None = None,
    comp_len: int | None = None,
    magic: bytes = b"PMDS",
    version: int = 2,
) -> bytes:
    """A sealed container with every field under the test's control (defaults consistent with `raw`)."""
    raw = EMPTY_BODY if raw is None else raw
    body = zframe(raw) if body is None else body
    header = magic + bytes([version])
    for v in (first, n_queries, nseq, position, len(raw) if raw_len is None else raw_len):
        header += varint(v)
    header += varint(len(body) if comp_len is None else comp_len)
    return seal(header + body)


def header_of(data: bytes) -> tuple[list[int], int]:
    """The six header varints of a well-formed container, and the offset of its zstd body."""
    pos = 5
    fields = []
    for _ in range(6):
        value, pos = read_varint(data, pos)
        fields.append(value)
    return fields, pos


def streams_of(data: bytes) -> tuple[list[int], list[int], list[int], list[int]]:
    """The values in the refs, runs, counts and deltas streams of a well-formed container."""
    _, pos = header_of(data)
    raw = zstandard.ZstdDecompressor().decompress(data[pos:-32])
    lengths = []
    at = 0
    for _ in range(3):
        length, at = read_varint(raw, at)
        lengths.append(length)
    out = []
    for length in lengths:
        out.append(unvarints(raw[at : at + length]))
        at += length
    return out[0], out[1], out[2], unvarints(raw[at:])


def with_position(data: bytes, position: int) -> bytes:
    """The container with its history_position field rewritten (and re-sealed)."""
    fields, pos = header_of(data)
    fields[3] = position
    return seal(data[:5] + vs(*fields) + data[pos:-32])


def snapshot(history: IdHistory) -> tuple[int, int, int, list[list[int]]]:
    """Everything both ends must agree on, copied so later in-place changes would show."""
    return history.position, history.dropped, history.ids, [list(ids) for ids in history.lists]


def history_of(*lists: Sequence[int], dropped: int = 0) -> IdHistory:
    """A history holding `lists` (oldest first), after `dropped` lists that are no longer held."""
    history = IdHistory()
    history.dropped = dropped
    for ids in lists:
        history.add(sorted(ids))
    return history


# A few held lists for the tests that decode against a non-empty history: empty, dense, sparse, the
# largest id, a long list, and one that overlaps the dense one.
PRE_LISTS: tuple[tuple[int, ...], ...] = (
    (),
    tuple(range(8)),
    (2, 3, 5, 7, 11, 13, 17, 19, 23),
    (NSEQ - 1,),
    tuple(range(0, NSEQ, 97)),
    tuple(range(1, 40, 3)),
)
PRE_DROPPED = 7  # the job had lists before these that are no longer held, so position != len(lists)


def prefilled(nseq: int = NSEQ) -> IdHistory:
    """A history a receiver with database size `nseq` could hold (every id below nseq)."""
    return history_of(*([i for i in ids if i < nseq] for ids in PRE_LISTS), dropped=PRE_DROPPED)


def assert_sane(
    result: tuple[int, list[list[int]]],
    nseq: int,
    before: IdHistory | None = None,
    after: IdHistory | None = None,
) -> None:
    """What a decoder may return at all: in-bounds, strictly increasing ids that re-encode identically.

    `before` / `after` are the receiver's history around the decode: it must have gained exactly the
    decoded lists, and re-encoding them against `before` must decode to the same lists.
    """
    first, lists = result
    before = IdHistory() if before is None else before
    assert isinstance(first, int) and first >= 0
    assert len(lists) <= MAX_QUERIES
    assert sum(map(len, lists)) <= MAX_IDS
    for ids in lists:
        assert all(isinstance(i, int) for i in ids)
        assert all(0 <= i < nseq for i in ids)
        assert all(a < b for a, b in zip(ids, ids[1:], strict=False))
    if after is not None:
        expected = before.copy()
        for ids in lists:
            expected.add(list(ids))
        assert snapshot(after) == snapshot(expected)
    sender, receiver = before.copy(), before.copy()
    assert decode_subjects(encode_subjects(first, lists, nseq, sender), nseq, receiver) == (first, lists)
    assert snapshot(sender) == snapshot(receiver)
    assert decode_subjects(encode_subjects(first, lists, nseq), nseq) == (first, lists)


def decode_strict(data: object, nseq: int = NSEQ, history: IdHistory | None = None) -> None:
    """Decoding arbitrary input either raises MetadataFormatError (history untouched) or yields a sane result.

    Nothing else: no other exception, no partial change to the history.
    """
    history = IdHistory() if history is None else history
    before = history.copy()
    state = snapshot(history)
    try:
        result = decode_subjects(data, nseq, history)  # type: ignore[arg-type]
    except MetadataFormatError:
        assert snapshot(history) == state
        return
    assert_sane(result, nseq, before, history)


def sample_container(seed: int = 0, n: int = 12, k: int = 6) -> bytes:
    r = random.Random(seed)
    subjects = [r.sample(range(NSEQ), r.randint(0, k)) for _ in range(n)]
    subjects[0] = []
    subjects[1] = [0, NSEQ - 1]
    return encode_subjects(r.randint(0, 10**6), subjects, NSEQ)


def ref_container(seed: int = 0, n: int = 10) -> bytes:
    """A container coded against prefilled(): most lists keep part of a held or an earlier list."""
    r = random.Random(seed)
    pool = [list(ids) for ids in PRE_LISTS if ids]
    lists = []
    for _ in range(n):
        base = r.choice(pool)
        ids = sorted({i for i in base if r.random() < 0.75} | set(r.sample(range(NSEQ), r.randint(0, 3))))
        lists.append(ids)
        pool.append(ids)
    return encode_subjects(r.randint(0, 10**6), lists, NSEQ, prefilled())


VALID = sample_container()
REF_VALID = ref_container()


def similar_lists(r: random.Random, nseq: int, n: int, n_bases: int = 5, size: int = 30) -> list[list[int]]:
    """`n` lists (unsorted) that are mutations of a few base sets: part of a base plus a few other ids."""
    bases = [r.sample(range(nseq), min(nseq, size)) for _ in range(n_bases)]
    out = []
    for _ in range(n):
        keep = r.random()
        ids = {i for i in r.choice(bases) if r.random() < keep}
        ids |= set(r.sample(range(nseq), min(nseq, r.randint(0, 5))))
        lst = list(ids)
        r.shuffle(lst)
        out.append(lst)
    return out


def test_sample_containers_use_references() -> None:
    refs, runs, counts, deltas = streams_of(REF_VALID)
    assert len(refs) == 10 and any(refs) and runs and any(counts) and deltas
    assert max(refs) > 1  # also into the pre-filled history, not only the previous list
    assert header_of(REF_VALID)[0][3] == prefilled().position == PRE_DROPPED + len(PRE_LISTS)
    assert not any(streams_of(VALID)[0])  # random lists: nothing worth referencing


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
    if lists and draw(st.booleans()):  # repeat and mutate some lists, so references are used
        r = draw(st.randoms(use_true_random=False))
        for _ in range(draw(st.integers(1, 10))):
            base = r.choice(lists)
            lists.append(
                [i for i in base if r.random() < 0.8] + [i for i in r.choice(lists) if i not in base]
            )
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
    assert encode_subjects(first, lists, nseq, IdHistory()) == data  # None means a fresh history


@pytest.mark.parametrize(
    ("first", "lists", "nseq"),
    [
        (0, [], 0),
        (0, [[], [], []], 0),
        (5, [[0]], 1),
        (0, [[]], 1),
        (0, [[0], [0], [], [0]], 1),  # references to a one-id list
        (2**62, [[2**62 - 1, 0, 2**61]], 2**62),
        (0, [list(range(300))], 300),  # dense: every delta is 0
        (0, [list(range(300)), list(range(1, 300, 2)), list(range(0, 300, 2)), list(range(300))], 300),
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
    assert not any(streams_of(data)[0])  # independent lists: no reference is worth it


def test_size_correlated_lists_references_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """500 queries whose hits overlap (as similar queries do), shipped in four containers of one job."""
    r = random.Random(500)
    nseq = 20000
    bases = [r.sample(range(nseq), 60) for _ in range(40)]
    subjects = []
    for _ in range(500):
        ids = set(r.sample(r.choice(bases), 40)) | set(r.sample(range(nseq), 8))
        subjects.append(list(ids))
    chunks = [(k * 125, subjects[k * 125 : (k + 1) * 125]) for k in range(4)]

    sender, receiver = IdHistory(), IdHistory()
    job = 0
    for first, chunk in chunks:
        data = encode_subjects(first, chunk, nseq, sender)
        assert decode_subjects(data, nseq, receiver) == (first, [sorted(s) for s in chunk])
        job += len(data)
    fresh = sum(len(encode_subjects(first, chunk, nseq)) for first, chunk in chunks)
    with monkeypatch.context() as m:
        m.setattr(idcodec, "MIN_SHARED", 2.0)  # never code against an earlier list
        plain_chunks = [encode_subjects(first, chunk, nseq) for first, chunk in chunks]
        assert all(not any(streams_of(data)[0]) for data in plain_chunks)
        plain = sum(map(len, plain_chunks))
    assert job < fresh < plain
    assert job < 0.8 * plain, f"job history {job} B, per-container {fresh} B, no references {plain} B"


# -- the id history ----------------------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> tuple[int, list[list[list[int]]], bool]:
    """(nseq, containers of lists, small history bounds?): lists mutated from a few base sets."""
    nseq = draw(st.sampled_from([1, 40, 5000, 2**40]))
    r = draw(st.randoms(use_true_random=False))
    bases = [r.sample(range(nseq), min(nseq, r.randint(0, 40))) for _ in range(draw(st.integers(1, 4)))]
    containers = []
    for _ in range(draw(st.integers(1, 5))):
        lists = []
        for _ in range(draw(st.integers(0, 8))):
            keep = draw(st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]))
            ids = {i for i in r.choice(bases) if r.random() < keep}
            ids |= set(r.sample(range(nseq), min(nseq, draw(st.integers(0, 6)))))
            lst = list(ids)
            r.shuffle(lst)
            lists.append(lst)
        containers.append(lists)
    # A last container repeating a large list of the first one: with the job's history it costs a reference.
    if nseq >= 5000:
        big = sorted(set(bases[0]) | set(r.sample(range(nseq), 25)))
        containers[0].append(big)
        containers.append([big])
    return nseq, containers, draw(st.booleans())


@FUZZ
@given(jobs())
def test_history_round_trip(job: tuple[int, list[list[list[int]]], bool]) -> None:
    nseq, containers, small_bounds = job
    with (
        mock.patch.object(idcodec, "HISTORY_LISTS", 5 if small_bounds else idcodec.HISTORY_LISTS),
        mock.patch.object(idcodec, "HISTORY_IDS", 70 if small_bounds else idcodec.HISTORY_IDS),
    ):
        sender, receiver = IdHistory(), IdHistory()
        first = 0
        smaller = False
        for lists in containers:
            position = sender.position
            data = encode_subjects(first, lists, nseq, sender)
            assert header_of(data)[0][3] == position
            assert max(streams_of(data)[0], default=0) <= position + len(lists)
            assert decode_subjects(data, nseq, receiver) == (first, [sorted(ids) for ids in lists])
            assert snapshot(sender) == snapshot(receiver)
            assert receiver.position == position + len(lists)
            if small_bounds:
                assert len(receiver.lists) <= 5 and receiver.ids <= 70
            smaller |= len(data) < len(encode_subjects(first, lists, nseq))
            first += len(lists)
        if nseq >= 5000 and not small_bounds:
            assert smaller  # the repeated large list at least is coded against the job's history


def job_containers(nseq: int = 3000, n: int = 4, per: int = 15, seed: int = 1) -> list[bytes]:
    r = random.Random(seed)
    lists = similar_lists(r, nseq, n * per)
    sender = IdHistory()
    return [encode_subjects(k * per, lists[k * per : (k + 1) * per], nseq, sender) for k in range(n)]


def test_history_refuses_out_of_order_and_keeps_state() -> None:
    c0, c1, c2, c3 = job_containers()
    assert all(any(streams_of(c)[0]) for c in (c1, c2, c3))  # the later ones really use references
    receiver = IdHistory()
    decode_subjects(c0, 3000, receiver)
    state = snapshot(receiver)
    for wrong in (c2, c3, c0):  # skipping ahead, and replaying
        rejects(wrong, "order", nseq=3000, history=receiver)
        assert snapshot(receiver) == state
    rejects(c1, "order", nseq=3000)  # a later container never decodes alone
    rejects(c0, "order", nseq=3000, history=prefilled(3000))
    for c in (c1, c2, c3):
        decode_subjects(c, 3000, receiver)
    assert receiver.position == 60


def test_history_position_is_checked_not_trusted() -> None:
    """Claiming the receiver's position does not make a container coded against other lists decode right."""
    c0, c1, _, _ = job_containers()
    receiver = IdHistory()
    decode_subjects(c0, 3000, receiver)
    state = snapshot(receiver)
    rejects(with_position(c1, 14), "order", nseq=3000, history=receiver)
    rejects(with_position(c1, 16), "order", nseq=3000, history=receiver)
    rejects(with_position(c1, 2**62), "order", nseq=3000, history=receiver)
    assert snapshot(receiver) == state
    decode_strict(with_position(c1, 0), 3000)  # refused or in bounds: never a crash
    decode_subjects(c1, 3000, receiver)


def test_corrupt_container_never_changes_history() -> None:
    c0, c1, c2, _ = job_containers(n=4, per=6, seed=3)
    receiver = IdHistory()
    decode_subjects(c0, 3000, receiver)
    saved = receiver.copy()
    state = snapshot(receiver)
    refused = 0
    for i in range(len(c1)):
        for xor in (1, 0x80, 0xFF):
            mutated = c1[:i] + bytes([c1[i] ^ xor]) + c1[i + 1 :]
            rejects(mutated, nseq=3000, history=receiver)  # unsealed: the checksum catches it
            assert snapshot(receiver) == state
            try:
                result = decode_subjects(reseal(mutated), 3000, receiver)
            except MetadataFormatError:
                assert snapshot(receiver) == state
                refused += 1
                continue
            assert_sane(result, 3000, saved, receiver)  # a different but valid container (e.g. first_query)
            receiver = saved.copy()
    for cut in range(len(c1)):
        rejects(c1[:cut], nseq=3000, history=receiver)
        if cut >= 32:
            decode_strict(reseal(c1[:cut]), 3000, receiver)
        assert snapshot(receiver) == state
    assert refused > len(c1)  # most re-sealed mutations do reach a parser check
    decode_subjects(c1, 3000, receiver)  # the right container still decodes, and the next one after it
    decode_subjects(c2, 3000, receiver)


def test_failed_container_midway_keeps_history() -> None:
    """A body whose last query is bad: the lists before it were parsed, yet none may reach the history."""
    history = history_of([1, 2, 3])
    state = snapshot(history)
    raw = v2_body(vs(1, 1, 9), vs(1, 3, 1, 3), vs(0, 0, 0))
    rejects(build(raw, n_queries=3, nseq=10, position=1), "not held", nseq=10, history=history)
    assert snapshot(history) == state
    raw = v2_body(vs(1, 1, 0), vs(1, 3, 1, 3), vs(0, 0, 1), vs(10))
    rejects(build(raw, n_queries=3, nseq=10, position=1), "out of", nseq=10, history=history)
    assert snapshot(history) == state
    raw = v2_body(vs(1, 1, 0), vs(1, 3, 1, 3), vs(0, 0, 1), vs(4))
    assert decode_subjects(build(raw, n_queries=3, nseq=10, position=1), 10, history) == (
        0,
        [[1, 2, 3], [1, 2, 3], [4]],
    )
    assert snapshot(history) == (4, 0, 10, [[1, 2, 3], [1, 2, 3], [1, 2, 3], [4]])


def test_history_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idcodec, "HISTORY_LISTS", 3)
    monkeypatch.setattr(idcodec, "HISTORY_IDS", 10)
    sender, receiver = IdHistory(), IdHistory()
    states = []
    steps = [
        [list(range(6)), [6, 7, 8]],  # 9 ids
        [[9]],  # 10 ids: both limits still hold
        [list(range(6))],  # coded against the oldest list, which its own addition then drops (4 > 3)
        [list(range(20, 31))],  # 11 ids > 10 on its own: everything goes, itself too
        [[1], [1], [2], [1]],  # lists dropped within one container as well
    ]
    for k, lists in enumerate(steps):
        data = encode_subjects(k, lists, 100, sender)
        assert decode_subjects(data, 100, receiver) == (k, [sorted(x) for x in lists])
        assert snapshot(sender) == snapshot(receiver)
        states.append((snapshot(receiver), streams_of(data)[0]))
    assert states[0] == ((2, 0, 9, [list(range(6)), [6, 7, 8]]), [0, 0])
    assert states[1] == ((3, 0, 10, [list(range(6)), [6, 7, 8], [9]]), [0])
    assert states[2] == ((4, 1, 10, [[6, 7, 8], [9], list(range(6))]), [3])
    assert states[3] == ((5, 5, 0, []), [0])
    assert states[4] == ((9, 6, 3, [[1], [2], [1]]), [0, 1, 0, 2])

    # References past the bound are refused on decode, the same bound the encoder applied.
    receiver = history_of(range(6), [6, 7, 8], [9])
    assert snapshot(receiver) == (3, 0, 10, [list(range(6)), [6, 7, 8], [9]])
    state = snapshot(receiver)
    # range(6) is 3 back when this container starts; its first list pushes it out (4 lists > 3), so the
    # second query cannot reach it at distance 4, while distance 3 is now [6, 7, 8].
    raw = v2_body(vs(0, 4), vs(1, 6), vs(1, 0), vs(50))
    rejects(build(raw, n_queries=2, nseq=100, position=3), "not held", nseq=100, history=receiver)
    raw = v2_body(vs(0, 3), vs(1, 3), vs(1, 0), vs(50))
    assert decode_subjects(build(raw, n_queries=2, nseq=100, position=3), 100, receiver.copy()) == (
        0,
        [[50], [6, 7, 8]],
    )
    raw = v2_body(vs(4), vs(1, 6), vs(0))
    rejects(build(raw, n_queries=1, nseq=100, position=3), "not held", nseq=100, history=receiver)
    # The list too big to hold at all cannot be referenced by the query right after it.
    raw = v2_body(vs(0, 1), vs(1, 11), vs(11, 0), vs(20, *[0] * 10))
    rejects(build(raw, n_queries=2, nseq=100, position=3), "not held", nseq=100, history=receiver)
    assert snapshot(receiver) == state


def test_fresh_history_container_decodes_standalone() -> None:
    r = random.Random(5)
    lists = similar_lists(r, 3000, 40)
    data = encode_subjects(7, lists, 3000, IdHistory())
    assert data == encode_subjects(7, lists, 3000)
    assert header_of(data)[0][3] == 0
    assert any(streams_of(data)[0])  # lists coded against earlier lists of the same container
    expected = (7, [sorted(x) for x in lists])
    assert decode_subjects(data, 3000) == expected
    assert decode_subjects(data, 3000, IdHistory()) == expected
    rejects(data, "order", nseq=3000, history=history_of([1]))


def test_encoding_is_deterministic_given_equal_histories() -> None:
    r = random.Random(6)
    lists = similar_lists(r, 3000, 60)
    sender, receiver = IdHistory(), IdHistory()
    for k in range(3):
        decode_subjects(encode_subjects(k * 20, lists[k * 20 : (k + 1) * 20], 3000, sender), 3000, receiver)
    more = similar_lists(r, 3000, 20)
    # The sender's own history (with its index), the receiver's (built by decoding), and copies of both.
    histories = [sender, receiver, sender.copy(), receiver.copy(), history_of(*sender.lists)]
    outputs = [encode_subjects(60, more, 3000, h) for h in histories]
    assert len(set(outputs)) == 1
    assert len({repr(snapshot(h)) for h in histories}) == 1
    assert any(streams_of(outputs[0])[0])


def test_history_used_to_encode_then_decode() -> None:
    """A history whose encoder index is built, then grown by decoding, still encodes like a fresh copy."""
    r = random.Random(8)
    lists = similar_lists(r, 3000, 40, n_bases=3)
    mixed, peer = IdHistory(), IdHistory()
    encode_subjects(0, lists[:10], 3000, mixed)  # builds mixed's index
    encode_subjects(0, lists[:10], 3000, peer)
    decode_subjects(encode_subjects(10, lists[10:30], 3000, peer), 3000, mixed)  # lists the index lacks
    assert snapshot(mixed) == snapshot(peer)
    rebuilt = history_of(*mixed.lists, dropped=mixed.dropped)
    assert encode_subjects(30, lists[30:], 3000, mixed) == encode_subjects(30, lists[30:], 3000, rebuilt)


def test_id_history_basics(monkeypatch: pytest.MonkeyPatch) -> None:
    history = IdHistory()
    assert (history.position, history.get(0), history.get(1)) == (0, None, None)
    history.add([1, 2])
    history.add([3])
    assert history.position == 2 and history.ids == 3
    assert (history.get(1), history.get(2), history.get(0), history.get(3), history.get(-1)) == (
        (3,),
        (1, 2),
        None,
        None,
        None,
    )
    assert history.best_reference([3, 9]) == (1, 1)
    assert history.best_reference([1, 3]) == (1, 1)  # ties go to the latest list
    assert history.best_reference([1, 2, 3]) == (2, 2)
    assert history.best_reference([9]) == (0, 0)
    copy = history.copy()
    copy.add([4])
    assert snapshot(history) == (2, 0, 3, [[1, 2], [3]])  # the copy is independent
    monkeypatch.setattr(idcodec, "HISTORY_LISTS", 2)
    history.add([1, 2])
    assert snapshot(history) == (3, 1, 3, [[3], [1, 2]])
    assert history.best_reference([1, 2]) == (1, 2)  # only held lists count
    assert history.best_reference([3]) == (2, 1)
    history.add([5])
    assert history.best_reference([3]) == (0, 0)


def test_encoder_refusals_leave_history_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    history = prefilled()
    state = snapshot(history)
    for bad in ([[1, 2], [5, 5]], [[1], [NSEQ]], [[-1]]):
        with pytest.raises(ValueError):
            encode_subjects(0, bad, NSEQ, history)
        assert snapshot(history) == state
    monkeypatch.setattr(idcodec, "MAX_IDS", 10)
    with pytest.raises(ValueError, match="too many ids"):
        encode_subjects(0, [list(range(8)), list(range(3))], NSEQ, history)
    assert snapshot(history) == state
    encode_subjects(0, [list(range(8)), list(range(2))], NSEQ, history)  # exactly MAX_IDS is fine


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


def rejects(
    data: object, match: str | None = None, nseq: int = NSEQ, history: IdHistory | None = None
) -> None:
    history = IdHistory() if history is None else history
    state = snapshot(history)
    with pytest.raises(MetadataFormatError, match=match):
        decode_subjects(data, nseq, history)  # type: ignore[arg-type]
    assert snapshot(history) == state


def test_container_layout() -> None:
    data = encode_subjects(3, [[1, 4], []], NSEQ)
    assert data[:5] == b"PMDS\x02"
    assert data[5:10] == varint(3) + varint(2) + varint(NSEQ) + varint(0)
    raw = vs(2, 0, 2) + vs(0, 0) + b"" + vs(2, 0) + vs(1, 2)
    assert raw == v2_body(vs(0, 0), b"", vs(2, 0), vs(1, 2))
    assert data[10:12] == varint(len(raw)) + varint(len(data) - 12 - 32)
    assert zstandard.ZstdDecompressor().decompress(data[12:-32]) == raw
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    assert build(raw, first=3, n_queries=2, body=data[12:-32]) == data


def test_container_layout_with_history() -> None:
    sender = IdHistory()
    encode_subjects(0, [[1, 4, 7]], NSEQ, sender)
    data = encode_subjects(1, [[9, 4, 1], [100]], NSEQ, sender)
    fields, pos = header_of(data)
    assert fields[:4] == [1, 2, NSEQ, 1]  # one list in the history before this container
    # Query 1 keeps 1, 4 of the previous list (runs: 2 kept, 1 dropped) and adds 9; query 2 has no
    # list worth referencing: its one id is spelled out.
    raw = v2_body(vs(1, 0), vs(2, 2, 1), vs(1, 1), vs(9, 100))
    assert zstandard.ZstdDecompressor().decompress(data[pos:-32]) == raw
    assert build(raw, first=1, n_queries=2, position=1, body=data[pos:-32]) == data
    receiver = history_of([1, 4, 7])
    assert decode_subjects(data, NSEQ, receiver) == (1, [[1, 4, 9], [100]])
    assert snapshot(receiver) == (3, 0, 7, [[1, 4, 7], [1, 4, 9], [100]])


def test_header_rejections() -> None:
    rejects(b"", "truncated")
    rejects(VALID[:42], "truncated")
    rejects(reseal(b"XMDS" + VALID[4:]), "magic")
    rejects(reseal(VALID[:4] + b"\x01" + VALID[5:]), "version")  # version 1 is no longer read
    rejects(reseal(VALID[:4] + b"\x03" + VALID[5:]), "version")
    rejects(VALID[:-1] + bytes([VALID[-1] ^ 1]), "checksum")
    rejects(VALID + b"\0", "checksum")
    rejects(VALID, "expected 4999", nseq=NSEQ - 1)
    rejects(VALID, "expected 5001", nseq=NSEQ + 1)
    rejects(VALID, "order", history=history_of([1]))
    rejects(REF_VALID, "order")
    rejects(REF_VALID, "order", history=history_of(*PRE_LISTS))  # same lists, but position differs
    rejects(12345, "bytes")
    rejects("PMDS", "bytes")
    rejects(None, "bytes")
    rejects(12345, "bytes", history=prefilled())
    assert decode_subjects(REF_VALID, NSEQ, prefilled())  # the right history decodes it


def test_varint_rejections() -> None:
    rejects(build(first=2**63), "overflow")
    rejects(build(first=2**70), "overflow|longer")
    rejects(build(first=2**70 - 1), "overflow")
    rejects(build(position=2**63), "overflow")
    rejects(build(vs(1, 0, 1) + b"\0\0", first=2**63 - 1, n_queries=1), "overflow")  # ordinals overflow
    long_zero = b"PMDS\x02" + b"\x80" * 10 + b"\x00" + b"\x00\x00\x00\x00\x00"
    rejects(seal(long_zero + zframe(EMPTY_BODY)), "varint")
    nonminimal = b"PMDS\x02" + b"\x80\x00" + b"\x00\x00\x00\x00\x00"
    rejects(seal(nonminimal + zframe(EMPTY_BODY)), "non-minimal")
    nonminimal_position = b"PMDS\x02" + b"\x00\x00\x00" + b"\x80\x00" + b"\x00\x00"
    rejects(seal(nonminimal_position + zframe(EMPTY_BODY)), r"non-minimal varint \(history position\)")
    rejects(seal(b"PMDS\x02\x00\x00\x00\x00\x00" + b"\x80" * 3), "truncated varint")


def test_bounds_rejections() -> None:
    rejects(build(b"\0" * 3, n_queries=MAX_QUERIES + 1), "too many queries")
    one = v2_body(vs(0), b"", vs(0))  # the smallest body of one query: 2 * 1 + 3 bytes
    assert len(one) == 5 and decode_subjects(build(one, n_queries=1), NSEQ) == (0, [[]])
    rejects(build(one[:4], n_queries=1), "too small")
    rejects(build(one, n_queries=2), "too small")
    rejects(build(b"\0" * 6, n_queries=2), "too small")
    rejects(build(b"\0" * 7, n_queries=2), r"truncated varint \(refs\)")  # passes the size check
    rejects(build(b"\0\0", n_queries=0), "too small")
    rejects(build(raw_len=MAX_RAW_BYTES + 1), "exceeds the limit")
    rejects(build(raw_len=2**62), "exceeds the limit")
    body = zframe(one)
    rejects(build(one, n_queries=1, body=body, comp_len=len(body) + 1), "truncated body")
    rejects(build(one, n_queries=1, body=body, comp_len=len(body) - 1), "trailing bytes")


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
    raw = v2_body(vs(0), b"", vs(1), vs(7))
    assert decode_subjects(build(raw, n_queries=1), NSEQ) == (0, [[7]])
    rejects(build(raw, n_queries=1, body=zframe(raw) + zframe(b"")), "trailing bytes")
    rejects(build(raw, n_queries=1, body=zframe(raw)[:-1]), "truncated|corrupt")
    rejects(build(raw, n_queries=1, body=b"junk" * 3), "not a zstd frame")
    skippable = b"\x50\x2a\x4d\x18" + (0).to_bytes(4, "little")
    rejects(build(body=skippable), "not a zstd frame")
    rejects(build(body=b""), "not a zstd frame")


# Body checks against a small history, nseq 10: distance 1 is [2], 2 is [] and 3 is [1, 3, 5, 7].
H = ([1, 3, 5, 7], [], [2])


def body_case(raw: bytes, n_queries: int, nseq: int = 10, history: Sequence[Sequence[int]] = H) -> bytes:
    return build(raw, n_queries=n_queries, nseq=nseq, position=len(history))


def body_accepts(raw: bytes, n_queries: int, nseq: int = 10) -> list[list[int]]:
    history = history_of(*H)
    first, lists = decode_subjects(body_case(raw, n_queries, nseq), nseq, history)
    assert history.position == len(H) + n_queries
    return lists


def body_rejects(raw: bytes, n_queries: int, match: str, nseq: int = 10) -> None:
    rejects(body_case(raw, n_queries, nseq), match, nseq=nseq, history=history_of(*H))


def test_body_rejections_plain() -> None:
    assert body_accepts(v2_body(vs(0), b"", vs(2), vs(3, 5)), 1) == [[3, 9]]
    body_rejects(v2_body(vs(0), b"", vs(2), vs(3, 6)), 1, "out of")  # id 10
    body_rejects(v2_body(vs(0), b"", vs(1), vs(10)), 1, "out of")
    body_rejects(v2_body(vs(0), b"", vs(11), b"\0" * 11), 1, "exceeds nseq")
    assert body_accepts(v2_body(vs(0), b"", vs(10), b"\0" * 10), 1) == [list(range(10))]
    body_rejects(v2_body(vs(0), b"", vs(3), b"\0\0"), 1, "remaining")
    body_rejects(v2_body(vs(0, 0), b"", vs(1, 1), b"\0"), 2, "remaining")
    body_rejects(v2_body(vs(0), b"", vs(1), b"\x81"), 1, r"truncated varint \(deltas\)")
    body_rejects(v2_body(vs(0), b"", vs(1), b"\x80\x00"), 1, r"non-minimal varint \(deltas\)")
    body_rejects(v2_body(vs(0), b"", vs(1), varint(2**63)), 1, r"overflow \(deltas\)")
    body_rejects(v2_body(vs(0), b"", vs(1), varint(2**63 - 1)), 1, "out of")
    body_rejects(v2_body(vs(0), b"", vs(0), vs(0)), 1, "leftover bytes in the deltas")
    body_rejects(v2_body(vs(0, 0), b"", vs(0)), 1, "leftover bytes in the refs")
    body_rejects(v2_body(vs(0), b"", vs(0, 0)), 1, "leftover bytes in the counts")
    body_rejects(v2_body(vs(0), b"", vs(0)), 2, "too small")
    body_rejects(v2_body(vs(0), b"", vs(0)) + b"\0\0", 2, r"truncated varint \(refs\)")
    body_rejects(v2_body(vs(0, 0), b"", vs(0), b"\0\0"), 2, r"truncated varint \(counts\)")
    rejects(build(v2_body(vs(0), b"", vs(1), vs(0)), n_queries=1, nseq=0), "exceeds nseq", nseq=0)


def test_body_stream_framing() -> None:
    for lengths, name in [((100, 0, 1), "refs"), ((1, 100, 1), "runs"), ((1, 0, 100), "counts")]:
        body_rejects(v2_body(vs(0), b"", vs(0), lengths=lengths) + b"\0\0", 1, f"{name} stream runs past")
    body_rejects(v2_body(vs(0), b"", vs(0), lengths=(2**62, 0, 0)) + b"\0\0", 1, "refs stream runs past")
    body_rejects(v2_body(vs(0), b"", vs(0), lengths=(1, 0, 2)), 1, "counts stream runs past")  # by one byte
    assert body_accepts(v2_body(vs(0), b"", vs(0), lengths=(1, 0, 1)), 1) == [[]]
    body_rejects(b"\x80" * 5, 1, r"truncated varint \(refs length\)")
    body_rejects(b"\x80\x00" + vs(0, 1) + vs(0, 0), 1, r"non-minimal varint \(refs length\)")
    body_rejects(vs(1) + b"\x80\x00" + vs(1) + vs(0, 0), 1, r"non-minimal varint \(runs length\)")
    body_rejects(vs(1, 0) + b"\x81\x00" + vs(0, 0), 1, r"non-minimal varint \(counts length\)")
    body_rejects(varint(2**63) + b"\0\0\0\0", 1, r"overflow \(refs length\)")
    body_rejects(vs(0) + varint(2**63) + b"\0\0\0", 1, r"overflow \(runs length\)")
    # A varint may not continue into the next stream, even where the bytes would make one.
    body_rejects(v2_body(b"\x81", b"", vs(0)), 1, r"truncated varint \(refs\)")
    body_rejects(v2_body(vs(3), b"\x81", b"\x04", vs(0)), 1, r"truncated varint \(runs\)")
    body_rejects(v2_body(vs(0), b"", b"\x81", vs(0)), 1, r"truncated varint \(counts\)")
    body_rejects(v2_body(b"\x80\x00", b"", vs(0)), 1, r"non-minimal varint \(refs\)")
    body_rejects(v2_body(varint(2**63), b"", vs(0)), 1, r"overflow \(refs\)")
    body_rejects(v2_body(vs(0), b"", b"\x80\x00"), 1, r"non-minimal varint \(counts\)")
    body_rejects(v2_body(vs(0), b"", varint(2**63)), 1, r"overflow \(counts\)")
    body_rejects(v2_body(vs(0), b"", varint(2**63 - 1)), 1, "exceeds nseq")


def test_body_rejections_references() -> None:
    # distance 3 is [1, 3, 5, 7]: keep 1, 3; drop 5; keep 7; add 8.
    assert body_accepts(v2_body(vs(3), vs(3, 2, 1, 1), vs(1), vs(8)), 1) == [[1, 3, 7, 8]]
    assert body_accepts(v2_body(vs(3), vs(2, 0, 4), vs(1), vs(0)), 1) == [[0]]  # only the first run may be 0
    assert body_accepts(v2_body(vs(3), vs(1, 4), vs(0)), 1) == [[1, 3, 5, 7]]
    assert body_accepts(v2_body(vs(3), vs(4, 1, 1, 1, 1), vs(0)), 1) == [[1, 5]]
    assert body_accepts(v2_body(vs(3), vs(5, 0, 1, 1, 1, 1), vs(0)), 1) == [[3, 7]]  # len + 1 runs at most
    assert body_accepts(v2_body(vs(2), vs(0), vs(1), vs(4)), 1) == [[4]]  # the empty list: no runs
    assert body_accepts(v2_body(vs(2), vs(1, 0), vs(0)), 1) == [[]]
    assert body_accepts(v2_body(vs(1), vs(2, 0, 1), vs(1), vs(3)), 1) == [[3]]
    # References to a list of the same container, and past it to the held ones.
    assert body_accepts(v2_body(vs(0, 1), vs(2, 1, 1), vs(2, 0), vs(4, 0)), 2) == [[4, 5], [4]]
    assert body_accepts(v2_body(vs(3, 4), vs(1, 4, 2, 2, 2), vs(0, 0)), 2) == [[1, 3, 5, 7], [1, 3]]

    body_rejects(v2_body(vs(4), vs(1, 0), vs(0)), 1, "not held")
    body_rejects(v2_body(vs(2**62), vs(1, 0), vs(0)), 1, "not held")
    body_rejects(v2_body(vs(0, 5), vs(1, 0), vs(0, 0)), 2, "not held")
    rejects(build(v2_body(vs(1), vs(1, 0), vs(0)), n_queries=1, nseq=10), "not held", nseq=10)  # fresh
    body_rejects(v2_body(vs(3), vs(6, 1, 1, 1, 1, 1, 1), vs(0)), 1, "6 runs over a list of 4")
    body_rejects(v2_body(vs(2), vs(2, 0, 0), vs(0)), 1, "2 runs over a list of 0")
    body_rejects(v2_body(vs(3), vs(4, 4), vs(0)), 1, "4 runs over a list of 4")  # more runs than bytes
    body_rejects(v2_body(vs(3), vs(2**62), vs(0)), 1, "runs over a list")
    body_rejects(v2_body(vs(3), vs(3, 2, 0, 2), vs(0)), 1, "empty run after the first")
    body_rejects(v2_body(vs(3), vs(2, 0, 0), vs(0)), 1, "empty run after the first")
    body_rejects(v2_body(vs(3), vs(2, 2, 3), vs(0)), 1, "runs longer")
    body_rejects(v2_body(vs(3), vs(1, 5), vs(0)), 1, "runs longer")
    body_rejects(v2_body(vs(3), vs(1, 2**62), vs(0)), 1, "runs longer")
    body_rejects(v2_body(vs(3), vs(2, 1, 1), vs(0)), 1, "runs shorter")
    body_rejects(v2_body(vs(3), vs(0), vs(0)), 1, "runs shorter")
    body_rejects(v2_body(vs(3), vs(1, 4), vs(1), vs(5)), 1, "extra id 5 is in the reference")
    body_rejects(v2_body(vs(3), vs(2, 2, 2), vs(1), vs(5)), 1, "extra id 5 is in the reference")
    body_rejects(v2_body(vs(1), vs(1, 1), vs(2), vs(1, 0)), 1, "extra id 2 is in the reference")
    body_rejects(v2_body(vs(3), vs(1, 4), vs(7), b"\0" * 7), 1, "remaining|in the reference")
    body_rejects(v2_body(vs(3), vs(1, 4), vs(11), b"\0" * 11), 1, "exceeds nseq")
    body_rejects(v2_body(vs(3), vs(1, 4, 0), vs(0)), 1, "leftover bytes in the runs")
    body_rejects(v2_body(vs(3), vs(1, 4), vs(0), vs(0)), 1, "leftover bytes in the deltas")
    body_rejects(v2_body(vs(3), vs(1, 4) + b"\x81", vs(0)), 1, "leftover bytes in the runs")
    body_rejects(v2_body(vs(3), vs(1) + b"\x84\x00", vs(0)), 1, r"non-minimal varint \(runs\)")
    body_rejects(v2_body(vs(3), vs(1) + varint(2**63), vs(0)), 1, r"overflow \(runs\)")
    body_rejects(v2_body(vs(3), vs(1), vs(0)), 1, r"truncated varint \(runs\)|runs over")
    body_rejects(v2_body(vs(3), vs(1, 4), vs(1), vs(9), lengths=(1, 1, 1)), 1, "1 runs over a list of 4")


def test_body_position_mismatch() -> None:
    raw = v2_body(vs(3), vs(1, 4), vs(0))
    for position in (0, 2, 4, 2**62):
        data = build(raw, n_queries=1, nseq=10, position=position)
        rejects(data, "order", nseq=10, history=history_of(*H))
    history = history_of(*H, dropped=5)  # five older lists were dropped: the position counts them
    rejects(build(raw, n_queries=1, nseq=10, position=3), "order", nseq=10, history=history)
    assert decode_subjects(build(raw, n_queries=1, nseq=10, position=8), 10, history) == (0, [[1, 3, 5, 7]])


def test_max_ids_via_references(monkeypatch: pytest.MonkeyPatch) -> None:
    """References make ids cheap (a few bytes for a whole list), so MAX_IDS must count kept ids too."""
    monkeypatch.setattr(idcodec, "MAX_IDS", 20)
    big = list(range(8))
    # Each query keeps all of the previous list: 8 ids for 3 bytes.
    raw = v2_body(vs(1, 1), vs(1, 8, 1, 8), vs(0, 4), vs(8, 0, 0, 0))
    data = build(raw, n_queries=2, nseq=100, position=1)
    assert decode_subjects(data, 100, history_of(big)) == (0, [big, list(range(12))])  # 20 ids
    raw = v2_body(vs(1, 1), vs(1, 8, 1, 8), vs(0, 5), vs(8, 0, 0, 0, 0))
    rejects(
        build(raw, n_queries=2, nseq=100, position=1), "more than 20 ids", nseq=100, history=history_of(big)
    )
    raw = v2_body(vs(1, 1, 1), vs(1, 8, 1, 8, 1, 8), vs(0, 0, 0))
    rejects(
        build(raw, n_queries=3, nseq=100, position=1), "more than 20 ids", nseq=100, history=history_of(big)
    )
    raw = v2_body(vs(1, 2, 3), vs(1, 8, 1, 8, 1, 8), vs(0, 0, 0))  # all referencing the one held list
    rejects(
        build(raw, n_queries=3, nseq=100, position=1), "more than 20 ids", nseq=100, history=history_of(big)
    )
    raw = v2_body(vs(0, 0, 0), b"", vs(8, 8, 5), vs(*[0] * 21))  # plain ids count the same
    rejects(build(raw, n_queries=3, nseq=100), "more than 20 ids", nseq=100)


def test_max_ids_via_references_real_bounds() -> None:
    """At the real bounds: a history list of HISTORY_IDS ids, kept whole by query after query."""
    size = idcodec.HISTORY_IDS // 4
    held = history_of(range(size))
    n = MAX_IDS // size
    assert n * size == MAX_IDS
    raw = v2_body(vs(*[1] * (n + 1)), vs(1, size) * (n + 1), vs(*[0] * (n + 1)))
    data = build(raw, n_queries=n + 1, nseq=2 * size, position=1)
    assert len(data) < 200
    rejects(data, f"more than {MAX_IDS} ids", nseq=2 * size, history=held)
    raw = v2_body(vs(*[1] * n), vs(1, size) * n, vs(*[0] * (n - 1), 1), vs(size))
    rejects(build(raw, n_queries=n, nseq=2 * size, position=1), "more than", nseq=2 * size, history=held)


# -- fuzzing -----------------------------------------------------------------------------------------


HistoryFactory = Callable[[], IdHistory]
FRESH: HistoryFactory = IdHistory


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_fuzz_random_bytes(data: bytes, with_history: bool) -> None:
    decode_strict(data, NSEQ, prefilled() if with_history else None)


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 3), st.booleans())
def test_fuzz_random_sealed_after_magic(tail: bytes, version: int, with_history: bool) -> None:
    decode_strict(seal(b"PMDS" + bytes([version]) + tail), NSEQ, prefilled() if with_history else None)


def test_truncation_at_every_position() -> None:
    for base, factory in ((VALID, FRESH), (REF_VALID, prefilled)):
        for cut in range(len(base)):
            rejects(base[:cut], history=factory())
            decode_strict(reseal(base[:cut]) if cut >= 32 else base[:cut], NSEQ, factory())


MUTATION_BASES: list[tuple[bytes, bool]] = [
    (VALID, False),
    (sample_container(1, 3, 2), False),
    (encode_subjects(0, [], NSEQ), False),
    (REF_VALID, True),
    (ref_container(1, 4), True),
    (ref_container(2, 25), True),
]


@FUZZ
@given(st.data())
def test_fuzz_mutations(data: st.DataObject) -> None:
    """Unsealed mutations must all be caught; re-sealed ones reach the parser and must stay in bounds."""
    base, with_history = data.draw(st.sampled_from(MUTATION_BASES))
    factory = prefilled if with_history else FRESH
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
        rejects(mutated, history=factory())
    if len(mutated) >= 32:
        decode_strict(reseal(mutated), NSEQ, factory())


def my_runs(reference: Sequence[int], kept: Sequence[bool]) -> list[int]:
    """Alternating kept/dropped run lengths over `reference`, first run kept (possibly empty)."""
    lengths = [0]
    keeping = True
    for k in kept:
        if k != keeping:
            lengths.append(0)
            keeping = k
        lengths[-1] += 1
    return lengths


@st.composite
def mutated_bodies(draw: st.DrawFn) -> tuple[bytes, int, int, str | None]:
    """(body, n_queries, nseq, flaw): a body coded against prefilled(nseq) by an independent model of the
    format, then maybe one flaw: a bad value in one stream, a stream length or the query count off, junk,
    or an extra id that is in the query's reference list (which must be coded as kept instead)."""
    nseq = draw(st.sampled_from([1, 10, 50, NSEQ]))
    flaw = draw(
        st.sampled_from(["none", "value", "insert", "delete", "length", "n_queries", "junk", "shared extra"])
    )
    held = [list(ids) for ids in prefilled(nseq).lists]
    streams: dict[str, list[int]] = {"refs": [], "runs": [], "counts": [], "deltas": []}
    n = draw(st.integers(0, 6))
    shared_extra = False
    for _ in range(n):
        distance = draw(st.integers(0, len(held)))
        reference = held[-distance] if distance else []
        ids = []
        streams["refs"].append(distance)
        if distance:
            kept = draw(st.lists(st.booleans(), min_size=len(reference), max_size=len(reference)))
            lengths = my_runs(reference, kept)
            streams["runs"] += [len(lengths), *lengths]
            ids = [i for i, k in zip(reference, kept, strict=True) if k]
        extra = set(draw(st.sets(st.integers(0, nseq - 1), max_size=4))) - set(reference)
        if flaw == "shared extra" and reference and not shared_extra:
            extra.add(draw(st.sampled_from(reference)))  # kept or dropped, it may not be an extra id
            shared_extra = True
        streams["counts"].append(len(extra))
        prev = -1
        for i in sorted(extra):
            streams["deltas"].append(i - prev - 1)
            prev = i
        held.append(sorted(set(ids) | extra))
    if flaw == "shared extra" and not shared_extra:
        flaw = "none"
    lengths_override = None
    if flaw in ("value", "insert", "delete"):
        name = draw(st.sampled_from(sorted(streams)))
        values = streams[name]
        bad = draw(
            st.one_of(
                st.integers(0, 3),
                st.integers(0, 60),
                st.sampled_from([nseq - 1, nseq, 2**62, 2**63 - 1, 2**63, 2**64]),
            )
        )
        if flaw == "insert":
            values.insert(draw(st.integers(0, len(values))), bad)
        elif values:
            i = draw(st.integers(0, len(values) - 1))
            if flaw == "value":
                values[i] = bad
            else:
                del values[i]
    encoded = {name: vs(*values) for name, values in streams.items()}
    if flaw == "junk":
        name = draw(st.sampled_from(sorted(encoded)))
        encoded[name] += draw(st.binary(min_size=1, max_size=3))
    if flaw == "length":
        lengths_override = [len(encoded[name]) for name in ("refs", "runs", "counts")]
        which = draw(st.integers(0, 2))
        lengths_override[which] = max(0, lengths_override[which] + draw(st.sampled_from([-2, -1, 1, 2])))
    if flaw == "n_queries":
        n = max(0, n + draw(st.sampled_from([-1, 1, 2])))
    raw = v2_body(*(encoded[name] for name in ("refs", "runs", "counts", "deltas")), lengths=lengths_override)
    return raw, n, nseq, None if flaw == "none" else flaw


@FUZZ
@given(mutated_bodies(), st.sampled_from([None, 0, 5, 20]))
def test_fuzz_bodies_with_references(case: tuple[bytes, int, int, str | None], max_ids: int | None) -> None:
    """Against the model: a flawless body decodes to the model's lists (or exceeds a lowered MAX_IDS
    exactly when they do); a flawed one is refused or yields a sane result, never anything else."""
    raw, n_queries, nseq, flaw = case
    limit = MAX_IDS if max_ids is None else max_ids
    history = prefilled(nseq)
    before = history.copy()
    data = build(raw, n_queries=n_queries, nseq=nseq, position=history.position)
    with mock.patch.object(idcodec, "MAX_IDS", limit):
        if flaw is None:
            model = held_after(raw, n_queries, before)
            if sum(map(len, model)) > limit:
                rejects(data, f"more than {limit} ids", nseq=nseq, history=history)
            else:
                assert decode_subjects(data, nseq, history) == (0, model)
                assert_sane((0, model), nseq, before, history)
        elif flaw == "shared extra":
            rejects(data, "is in the reference list|more than", nseq=nseq, history=history)
        else:
            decode_strict(data, nseq, history)


def held_after(raw: bytes, n_queries: int, history: IdHistory) -> list[list[int]]:
    """The model's reading of a flawless body (no bounds, no checks): the lists it codes."""
    lengths = unvarints(raw)[:3]
    rest = raw[len(vs(*lengths)) :]
    refs = iter(unvarints(rest[: lengths[0]]))
    runs = iter(unvarints(rest[lengths[0] : lengths[0] + lengths[1]]))
    counts = iter(unvarints(rest[lengths[0] + lengths[1] : sum(lengths)]))
    deltas = iter(unvarints(rest[sum(lengths) :]))
    held = [list(ids) for ids in history.lists]
    out = []
    for _ in range(n_queries):
        distance = next(refs)
        ids = []
        if distance:
            reference = held[-distance]
            at = 0
            for r in range(next(runs)):
                length = next(runs)
                if r % 2 == 0:
                    ids += reference[at : at + length]
                at += length
        prev = -1
        for _ in range(next(counts)):
            prev += 1 + next(deltas)
            ids.append(prev)
        out.append(sorted(ids))
        held.append(sorted(ids))
    return out


HEADER_VALUE = st.one_of(
    st.integers(0, 2**65),
    st.integers(0, 20),
    st.sampled_from([MAX_QUERIES, MAX_QUERIES + 1, MAX_RAW_BYTES, MAX_RAW_BYTES + 1, 2**63 - 1, 2**63]),
)


@FUZZ
@given(
    st.lists(HEADER_VALUE, min_size=6, max_size=6),
    st.binary(max_size=60),
    st.booleans(),
    st.booleans(),
)
def test_fuzz_header_fields(fields: list[int], raw: bytes, honest_frame: bool, with_history: bool) -> None:
    first, n_queries, nseq, position, raw_len, comp_len = fields
    nseq_expected = nseq if nseq < 2**63 else NSEQ
    history = prefilled(nseq_expected) if with_history else IdHistory()
    body = zframe(raw)
    if honest_frame:  # keep the frame fields and position consistent so the body parser is reached more often
        raw_len, comp_len, position = len(raw), len(body), history.position
    data = build(
        raw,
        first=first,
        n_queries=n_queries,
        nseq=nseq,
        position=position,
        raw_len=raw_len,
        body=body,
        comp_len=comp_len,
    )
    decode_strict(data, nseq_expected, history)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Bodies made of plausible, boundary and overflowing varints, plus raw junk."""
    value = st.one_of(
        st.integers(0, 12), st.integers(0, 2**64), st.sampled_from([2**63 - 1, 2**63, 2**7, 2**14])
    )
    parts = draw(st.lists(st.one_of(value.map(varint), st.binary(max_size=3)), max_size=40))
    return b"".join(parts)


@FUZZ
@given(bodies(), st.integers(0, 12), st.sampled_from([0, 1, 2, 10, 2**40]), st.booleans())
def test_fuzz_body(raw: bytes, n_queries: int, nseq: int, with_history: bool) -> None:
    history = prefilled(nseq) if with_history else IdHistory()
    decode_strict(build(raw, n_queries=n_queries, nseq=nseq, position=history.position), nseq, history)


@st.composite
def stream_bodies(draw: st.DrawFn) -> bytes:
    """Four streams of small (mostly in-range) values, so each stream's checks are reached."""
    small = st.one_of(st.integers(0, 8), st.sampled_from([2**7, 2**63 - 1, 2**63]))
    streams = [vs(*draw(st.lists(small, max_size=12))) for _ in range(4)]
    if draw(st.booleans()):
        i = draw(st.integers(0, 3))
        streams[i] += draw(st.binary(min_size=1, max_size=2))
    return v2_body(*streams)


@FUZZ
@given(stream_bodies(), st.integers(0, 8), st.sampled_from([1, 10, NSEQ]))
def test_fuzz_streams(raw: bytes, n_queries: int, nseq: int) -> None:
    history = prefilled(nseq)
    decode_strict(build(raw, n_queries=n_queries, nseq=nseq, position=history.position), nseq, history)


class _Unscannable(tuple):
    """A held list that may be indexed and sliced but not iterated as a whole."""

    def __iter__(self):
        raise AssertionError("the decoder scanned a whole reference list")


def test_decoder_never_scans_a_whole_reference() -> None:
    """A query that keeps nothing of a long reference costs a few bytes to send; decoding it must not cost
    a pass over the reference (4095 such queries against a 2**20-id list took minutes before)."""
    nseq = 2**22
    history = IdHistory()
    history.add([])
    history.lists[-1] = _Unscannable(range(0, 2**21, 2))
    history.ids = 2**20
    body = v2_body(vs(*range(1, 51)), vs(*[2, 0, 2**20] * 50), vs(*[0] * 50))  # each keeps nothing
    first, lists = decode_subjects(build(body, n_queries=50, nseq=nseq, position=1), nseq, history)
    assert lists == [[]] * 50
    bad = v2_body(vs(51), vs(2, 0, 2**20), vs(2), vs(1, 0))  # extra ids 1 and 2: 2 is in the reference
    with pytest.raises(MetadataFormatError, match="2 is in the reference"):
        decode_subjects(build(bad, n_queries=1, nseq=nseq, position=51), nseq, history)
    assert history.position == 51
    good = v2_body(vs(51), vs(2, 0, 2**20), vs(2), vs(1, 1))  # extra ids 1 and 3 are not
    assert decode_subjects(build(good, n_queries=1, nseq=nseq, position=51), nseq, history) == (0, [[1, 3]])


def test_encoder_index_holds_only_held_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idcodec, "HISTORY_LISTS", 10)
    r = random.Random(7)
    history = IdHistory()
    for k in range(200):
        encode_subjects(k * 10, [r.sample(range(NSEQ), 50) for _ in range(10)], NSEQ, history)
    assert len(history.lists) == 10
    held = {i for ids in history.lists for i in ids}
    assert history._index is not None and set(history._index) == held
    assert sum(map(len, history._index.values())) == history.ids
