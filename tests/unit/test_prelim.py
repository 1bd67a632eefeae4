"""Reading the preliminary-list shim's records (paramedic.blast.prelim): pure logic on built records."""

from __future__ import annotations

import struct

import pytest

from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import (
    environment,
    inject_environment,
    injected,
    injection,
    query_batches,
    read_dump,
    split_query,
    whole_lists,
)
from paramedic.blast.render import masks_queries
from paramedic.errors import BlastError

GIDS = list(range(100, 200))


def batch(n_queries: int, lists: dict[int, list[tuple[int, int, float]]], limit: int = 10) -> bytes:
    out = struct.pack("=Iii", 0x50524C31, n_queries, len(lists))
    for q, entries in lists.items():
        out += struct.pack("=iii", q, limit, len(entries))
        out += b"".join(struct.pack("=iid", *e) for e in entries)
    return out


SPLIT = struct.pack("=Iii", 0x50524C53, 0, 0)


def test_records_cover_queries_in_order_without_a_batch_model() -> None:
    data = batch(2, {1: [(3, 50, 1e-5)]}) + batch(3, {0: [(4, 40, 0.5), (5, 30, 2.0)]})
    lists = read_dump(data, [10, 10, 10, 10, 10], None, GIDS)
    assert lists[0] is None and lists[3] is None and lists[4] is None
    assert [c.gid for c in lists[1].candidates] == [103]
    assert [c.gid for c in lists[2].candidates] == [104, 105]  # the second batch starts at query 2


def test_records_must_match_the_fixed_batches_when_modelled() -> None:
    lengths = [6000, 6000, 6000]  # blastp: 10,000 residues a batch -> [0, 1], [2]
    assert query_batches(lengths, 10000) == [range(0, 2), range(2, 3)]
    good = batch(2, {}) + batch(1, {})
    assert read_dump(good, lengths, 10000, GIDS) == [None, None, None]
    with pytest.raises(BlastError, match="another"):
        read_dump(batch(1, {}) + batch(2, {}), lengths, 10000, GIDS)


@pytest.mark.parametrize(
    "data",
    [
        batch(2, {}),
        batch(2, {}) + batch(2, {}),
        batch(3, {0: [(999, 1, 1.0)]}),
        batch(3, {})[:-1] + b"x",
        batch(3, {0: [(1, 1, 1.0)]})[:-20],  # bench/fuzz.py's prelim target: struct.error, exit 1
        batch(3, {0: [(1, 1, 1.0)]})[:14],
    ],
    ids=["too-few", "too-many", "foreign-oid", "garbage", "truncated-entries", "truncated-list"],
)
def test_records_that_do_not_fit_are_refused(data: bytes) -> None:
    with pytest.raises(BlastError):
        read_dump(data, [10, 10, 10], None, GIDS)


def skipped(n_queries: int, lists: int = 0) -> bytes:
    return struct.pack("=Iii", 0x50524C4B, n_queries, lists)


def test_a_batch_blast_skipped_has_no_candidates_and_keeps_the_batches_in_step() -> None:
    """A batch of queries BLAST+ cannot search (60 X) gets no preliminary stage: the shim writes a
    skipped record, read as lists of no candidate (before: "lists for 0 of 1 queries", exit 5)."""
    lengths = [6000, 6000, 60, 6000]  # blastp batches: [0, 1], [2, 3]
    data = batch(2, {0: [(3, 50, 1e-5)]}) + skipped(2)
    lists = read_dump(data, lengths, 10000, GIDS)
    assert lists[1:] == [None, None, None] and [c.gid for c in lists[0].candidates] == [103]
    with pytest.raises(BlastError, match="another"):  # a skipped record is held to the batch model too
        read_dump(batch(2, {}) + skipped(1) + batch(1, {}), lengths, 10000, GIDS)
    with pytest.raises(BlastError):  # a skipped batch names no list
        read_dump(batch(2, {}) + skipped(2, 1), lengths, 10000, GIDS)


def test_a_split_query_is_refused() -> None:
    with pytest.raises(BlastError, match="split"):
        read_dump(SPLIT + batch(1, {}), [10], None, GIDS)


def test_split_prediction() -> None:
    blastp = BlastOptions.parse("blastp", [])
    assert split_query("blastp", blastp, [300] * 100) is None
    assert split_query("blastp", blastp, [300, 25000, 300]) == 1
    blastx = BlastOptions.parse("blastx", [])
    assert split_query("blastx", blastx, [30000]) == 0  # alone in its batch
    assert split_query("tblastx", BlastOptions.parse("tblastx", []), [300000]) is None  # ungapped
    assert split_query("blastn", BlastOptions.parse("blastn", []), [3_000_000]) == 0  # megablast chunk 5 Mbp
    assert split_query("blastn", BlastOptions.parse("blastn", []), [1_000_000]) is None


@pytest.mark.parametrize(
    ("program", "args", "masked"),
    [
        ("blastp", [], False),
        ("blastp", ["-seg", "yes"], True),
        ("blastx", [], True),
        ("tblastn", [], True),
        ("tblastn", ["-seg", "no"], False),
        ("tblastx", [], True),
        ("blastn", [], True),
        ("blastn", ["-dust", "no"], False),
    ],
)
def test_default_query_filters(program: str, args: list[str], masked: bool) -> None:
    assert masks_queries(program, BlastOptions.parse(program, args)) is masked


# -- whole lists and the lists a piece aligns (PARAMEDIC_HSPS=1, PARAMEDIC_PRELIM=3) -----------------
def hsp(score: int, context: int = 0) -> bytes:
    """One HspRecord (72 bytes): the score tells HSPs apart; the context is its query's in its batch."""
    return struct.pack("=dd14i", 1.0, 1e-5, score, 0, context, *range(11))


def lists_batch(
    n_queries: int, lists: list[tuple[int, int, list[int]]], flags: int = 0, per: int = 1
) -> bytes:
    """A batch's lists as the shim writes them; the i-th HSP of a list is on its query's context i % per
    (a strand or frame), written relative to the query's first context (PARAMEDIC_CONTEXTS)."""
    out = struct.pack("=Iiii", 0x50524C52, n_queries, len(lists), flags)
    for query, oid, scores in lists:
        out += struct.pack("=iiii", query, oid, 500, len(scores))
        out += b"".join(hsp(s, i % per) for i, s in enumerate(scores))
    return out


def contexts(data: bytes, at: int = 0) -> list[list[int]]:
    """Each list's HSPs' contexts, in a run of list records."""
    found = []
    while at < len(data):
        n = struct.unpack_from("=i", data, at + 12)[0]
        found.append([struct.unpack_from("=i", data, at + 16 + 72 * h + 24)[0] for h in range(n)])
        at += 16 + 72 * n
    return found


def heads(data: bytes, at: int = 0) -> list[tuple[int, int, int]]:
    """(query, oid, first HSP's score) of each list in a run of list records."""
    found = []
    while at < len(data):
        query, oid, _, n = struct.unpack_from("=iiii", data, at)
        found.append((query, oid, struct.unpack_from("=i", data, at + 16 + 16)[0]))
        at += 16 + 72 * n
    return found


def test_whole_lists_are_keyed_by_the_query_in_the_search_and_the_global_id() -> None:
    data = lists_batch(2, [(1, 3, [70, 60])]) + lists_batch(1, [(0, 4, [50])])
    lists = whole_lists(data, 3, GIDS, "blastp")
    assert heads(lists) == [(1, 103, 70), (2, 104, 50)]


def test_a_batch_with_an_edit_script_gives_no_lists() -> None:
    """An HSP that holds a pointer cannot be written back: its pieces scan for their lists."""
    assert whole_lists(lists_batch(1, [(0, 3, [70])], flags=1), 1, GIDS, "blastp") is None
    assert (
        whole_lists(lists_batch(2, []), 2, GIDS, "blastp") == b""
    )  # no list kept: nothing to align, not missing


@pytest.mark.parametrize(
    "data",
    [
        lists_batch(1, [(0, 3, [70])])[:-1],  # truncated HSP
        lists_batch(1, [(1, 3, [70])]),  # query outside its batch
        lists_batch(1, [(0, 100, [70])]),  # subject outside the fragment
        lists_batch(2, [(0, 3, [70])]),  # more queries than searched
        struct.pack("=Iiii", 0x50524C31, 1, 0, 0),  # another record's magic
        struct.pack("=Iiii", 0x50524C48, 1, 0, 0),  # an older shim's lists (contexts of the batch)
    ],
)
def test_malformed_whole_lists_are_refused(data: bytes) -> None:
    with pytest.raises(BlastError, match="preliminary hit list could not be read"):
        whole_lists(data, 1, GIDS, "blastp")


def test_a_piece_gets_exactly_its_queries_subjects_per_blast_batch() -> None:
    """Two fragments' lists of a search batch starting at global query 10; the piece holds queries 11-13
    in two BLAST+ batches ([0, 1] and [2] of the piece). Each query gets its own subjects only, the
    query index is the one in its BLAST+ batch, lists in subject order."""
    frag0 = whole_lists(
        lists_batch(4, [(1, 5, [90]), (1, 2, [80]), (2, 5, [70]), (3, 7, [60])]), 4, GIDS, "blastp"
    )
    frag1 = whole_lists(
        lists_batch(4, [(1, 50, [55]), (0, 51, [40]), (3, 52, [30])]), 4, range(1000, 1100), "blastp"
    )
    given = injection(
        [(10, frag0), (10, frag1)], 11, [[1050, 105], [105], [1052]], [range(0, 2), range(2, 3)], "blastp"
    )
    assert given is not None
    magic, batches = struct.unpack_from("=Ii", given)
    assert (magic, batches) == (0x50524C51, 2)
    queries, n = struct.unpack_from("=ii", given, 8)
    assert (queries, n) == (2, 3)
    first = heads(given, 16)[:3]
    assert first == [(0, 105, 90), (1, 105, 70), (0, 1050, 55)]  # query 102 (oid 2) not wanted
    at = 16 + 3 * (16 + 72)
    assert struct.unpack_from("=ii", given, at) == (1, 1)
    assert heads(given, at + 8) == [(0, 1052, 30)]


def test_a_subject_missing_from_every_fragment_gives_no_injection() -> None:
    frag0 = whole_lists(lists_batch(1, [(0, 5, [90])]), 1, GIDS, "blastp")
    assert injection([(0, frag0)], 0, [[105, 106]], [range(0, 1)], "blastp") is None


@pytest.mark.parametrize(("program", "per"), [("blastn", 2), ("blastx", 6), ("tblastx", 6), ("tblastn", 1)])
def test_contexts_follow_their_query_into_the_pieces_batch(program: str, per: int) -> None:
    """A search batched queries 0-2 as [0, 1] and [2] (blastn's app batches as it goes); the piece of
    queries 1-2 batches them together. An HSP keeps its strand or frame, relative to its query's first
    context (the shim places it at the query's in the piece's batch: PARAMEDIC_CONTEXTS), and its list
    moves to the query's position in that batch."""
    searched = lists_batch(2, [(1, 5, [90, 80])], per=per) + lists_batch(1, [(0, 6, [70, 60])], per=per)
    whole = whole_lists(searched, 3, GIDS, program)
    assert whole is not None
    assert contexts(whole) == [[0, 1 % per], [0, 1 % per]]
    assert [q for q, _, _ in heads(whole)] == [1, 2]
    given = injection([(0, whole)], 1, [[105], [106]], [range(0, 2)], program)
    assert given is not None
    assert contexts(given, 16) == [[0, 1 % per], [0, 1 % per]]
    assert [q for q, _, _ in heads(given, 16)] == [0, 1]
    assert inject_environment(program, BlastOptions({}))["PARAMEDIC_CONTEXTS"] == str(per)
    assert environment(True, True, program)["PARAMEDIC_CONTEXTS"] == str(per)


def test_the_note_counts_injected_batches() -> None:
    assert injected("injected 12 4000\nscanned 8\ninjected 3 12\n") == 2
