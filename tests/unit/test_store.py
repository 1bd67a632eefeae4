"""Search records (paramedic.engine.rank.store): exact keys, alignments read per query, damage detected."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from paramedic.blast.hits import Candidate, FragmentSearch, Hit, PrelimList
from paramedic.engine.rank.store import RecordError, Store, decode_record, encode_record, keys_only


def result(n_queries: int, gid: int, hits_per_query: int = 2) -> FragmentSearch:
    # e-values that differ in the last bits, as sum statistics give them: records must keep them exact
    evalue = 4.658239190000001e-3
    close = math.nextafter(evalue, 1)
    return FragmentSearch(
        hits=[
            [
                Hit(
                    evalue if h == 0 else close,
                    50 - h,
                    gid + 10 * q + h,
                    f"Seq-align {q}/{h} \xff\x00".encode("latin-1"),
                )
                for h in range(hits_per_query)
            ]
            for q in range(n_queries)
        ],
        prelim=[
            None
            if q == n_queries - 1
            else PrelimList(500, tuple(Candidate(close, 40, gid + 10 * q + h) for h in range(hits_per_query)))
            for q in range(n_queries)
        ],
    )


def alignments(found: FragmentSearch) -> list[list[bytes]]:
    return [[h.alignment for h in q] for q in found.hits]


def test_a_record_reads_back_exactly_with_and_without_alignments() -> None:
    original = result(3, 7)
    key = b"k" * 32
    back = decode_record(encode_record(original, key, "0-0"), key, "0-0")
    assert back == original and alignments(back) == alignments(original)
    assert back.hits[0][1].evalue == math.nextafter(back.hits[0][0].evalue, 1)
    keys = decode_record(encode_record(original, key, "0-0"), key, "0-0", alignments=False)
    assert keys == original and all(h.alignment == b"" for q in keys.hits for h in q)
    assert keys_only(original) == original and alignments(keys_only(original)) == [[b"", b""]] * 3


def test_a_piece_reads_its_merged_subjects_alignments_across_fragments(tmp_path: Path) -> None:
    store = Store(tmp_path, durable=False)
    batches = (range(0, 3), range(3, 5))
    # batch 1 (queries 3 and 4), fragments 0 and 1: subjects 100.. and 200..
    store.put(1, 0, result(2, 100))
    store.put(1, 1, result(2, 200))
    # query 3's merged subjects from both fragments, in merged order; query 4 one subject
    got = store.alignments(batches, 2, first_query=3, hits=[[201, 100], [111]])
    assert got == ((b"Seq-align 0/1 \xff\x00", b"Seq-align 0/0 \xff\x00"), (b"Seq-align 1/1 \xff\x00",))
    with pytest.raises(RecordError, match="subject 999"):
        store.alignments(batches, 2, first_query=3, hits=[[999], []])
    with pytest.raises(RecordError):  # batch 0's records were never written
        store.alignments(batches, 2, first_query=0, hits=[[1]])


@pytest.mark.parametrize("cut", [0, 5, 20, 40, -3])
def test_a_damaged_record_is_refused_not_misread(tmp_path: Path, cut: int) -> None:
    store = Store(tmp_path, durable=True)
    store.put(0, 0, result(2, 1))
    path = store.record(0, 0)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(RecordError):
        store.keys(0, 0, 2, alignments=True)
        store.alignments((range(0, 2),), 1, 0, [[1], [11]])


def test_a_record_of_another_store_or_place_or_with_a_section_changed_is_refused(tmp_path: Path) -> None:
    """Issue 23: records are bound to their store's key and name, and each section to its digest."""
    ours, theirs = Store(tmp_path / "a", durable=False), Store(tmp_path / "b", durable=False)
    ours.path.mkdir()
    theirs.path.mkdir()
    theirs.put(0, 0, result(2, 1))
    ours.record(0, 0).write_bytes(theirs.record(0, 0).read_bytes())
    with pytest.raises(RecordError, match="not a record this search wrote"):
        ours.keys(0, 0, 2)
    ours.put(0, 1, result(2, 1))
    ours.record(0, 0).write_bytes(ours.record(0, 1).read_bytes())  # moved to another batch-fragment
    with pytest.raises(RecordError, match="not a record this search wrote"):
        ours.keys(0, 0, 2)
    data = bytearray(ours.record(0, 1).read_bytes())
    data[-3] ^= 1  # in the last query's alignments
    ours.record(0, 1).write_bytes(bytes(data))
    assert ours.keys(0, 1, 2) == result(2, 1)  # the keys are intact
    with pytest.raises(RecordError, match="alignments of query 1 changed"):
        ours.keys(0, 1, 2, alignments=True)


def test_a_record_of_another_batch_size_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path, durable=False)
    store.put(0, 0, result(2, 1))
    assert store.keys(0, 0, 2) == result(2, 1)
    with pytest.raises(RecordError, match="expected 3"):
        store.keys(0, 0, 3)


def test_writing_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = Store(tmp_path, durable=True)
    store.put(2, 3, result(1, 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2-3"]


def test_a_searchs_whole_lists_come_back_only_from_its_own_store(tmp_path: Path) -> None:
    """The lists a piece aligns feed its report: tagged like the record, another store's or a changed
    copy is missing (the piece then scans), and rank 0's keys never carry them."""
    store = Store(tmp_path, durable=False)
    found = result(2, 100)
    lists = b"\x01\x02" * 50
    store.put(0, 1, FragmentSearch(found.hits, found.prelim, lists))
    assert store.lists(0, 1) == lists
    assert keys_only(FragmentSearch(found.hits, found.prelim, lists)).lists is None
    with pytest.raises(RecordError):
        Store(tmp_path, durable=False).lists(0, 1)  # another key
    path = tmp_path / "0-1.lists"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(RecordError):
        store.lists(0, 1)
    with pytest.raises(RecordError):
        store.lists(0, 2)  # never written
    store.put(1, 1, found)  # a search without lists writes none
    assert not (tmp_path / "1-1.lists").exists()
    store.put(1, 2, FragmentSearch(found.hits, found.prelim, b""))  # one that kept no list: empty ones
    assert store.lists(1, 2) == b""


def test_a_changed_preliminary_list_is_refused(tmp_path: Path) -> None:
    """The lists are a binary section of their own (issue 21: JSON cost 15 ms a search); a byte of it
    changed is caught by its digest, not read as another candidate."""
    store = Store(tmp_path, durable=False)
    original = result(3, 5, hits_per_query=40)
    store.put(0, 0, original)
    assert store.keys(0, 0, 3).prelim == original.prelim
    data = bytearray(store.record(0, 0).read_bytes())
    at = data.find((5 + 39).to_bytes(8, "little"))  # a global id in the lists' section
    assert at > 0
    data[at] ^= 1
    store.record(0, 0).write_bytes(bytes(data))
    with pytest.raises(RecordError, match="preliminary lists changed"):
        store.keys(0, 0, 3)
