"""Reading the preliminary-list shim's records (paramedic.blast.prelim): pure logic on built records."""

from __future__ import annotations

import struct

import pytest

from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import query_batches, read_dump, split_query
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
    [batch(2, {}), batch(2, {}) + batch(2, {}), batch(3, {0: [(999, 1, 1.0)]}), batch(3, {})[:-1] + b"x"],
    ids=["too-few", "too-many", "foreign-oid", "garbage"],
)
def test_records_that_do_not_fit_are_refused(data: bytes) -> None:
    with pytest.raises(BlastError):
        read_dump(data, [10, 10, 10], None, GIDS)


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
