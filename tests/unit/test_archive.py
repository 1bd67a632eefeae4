"""Reading fragment archives, filling a skeleton, splicing statistics, and the Seq-id table reader.

The archive text follows the layout BLAST+ 2.12 writes (checked against real archives; the integration
equality tests run the whole path on real BLAST+ output).
"""

from __future__ import annotations

import pytest

from paramedic.blast.archive import fill_archive, parse_fragment_archive
from paramedic.blast.stats import splice_stats
from paramedic.db.seqids import first_seqids


def seq_align(query: int, gid: int, score: int, evalue: str) -> str:
    return (
        "      {\n"
        "        type partial,\n"
        "        dim 2,\n"
        "        score {\n"
        "          {\n"
        '            id str "score",\n'
        f"            value int {score}\n"
        "          },\n"
        "          {\n"
        '            id str "e_value",\n'
        f"            value real {evalue}\n"
        "          }\n"
        "        },\n"
        "        segs denseg {\n"
        "          dim 2,\n"
        "          numseg 1,\n"
        "          ids {\n"
        f'            local str "Query_{query}",\n'
        f'            local str "g{gid}"\n'
        "          }\n"
        "        }\n"
        "      }"
    )


def document(queries: list[int], aligns: list[str]) -> str:
    seqs = ",\n".join(
        f'          seq {{\n            id {{\n              local str "Query_{q}"\n            }}\n          }}'
        for q in queries
    )
    body = ",\n".join(aligns) + "\n" if aligns else ""
    return (
        "Blast4-archive ::= {\n"
        "  request {\n"
        "    body queue-search {\n"
        "      queries bioseq-set {\n"
        "        seq-set {\n"
        f"{seqs}\n"
        "        }\n"
        "      }\n"
        "    }\n"
        "  },\n"
        "  results {\n"
        "    alignments {\n"
        f"{body}"
        "    },\n"
        "    search-stats {\n"
        '      "Effective search space used: 1"\n'
        "    }\n"
        "  }\n"
        "}\n"
    )


def test_keys_from_every_request_of_an_archive() -> None:
    first = document([1, 2], [
        seq_align(1, 7, 50, "{ 150958788695337, 10, -38 }"),
        seq_align(1, 7, 40, "{ 2, 10, -20 }"),  # a second HSP: worse e-value, its score not used
        seq_align(1, 3, 90, "{ 0, 10, 0 }"),
        seq_align(2, 3, 60, "0"),
    ])  # fmt: skip
    second = document([3], [seq_align(3, 9, 33, "{ 1, 10, -5 }")])
    hits = parse_fragment_archive((first + second).encode(), 3)
    assert [(h.gid, h.score, h.evalue) for h in hits[0]] == [(7, 50, 1.50958788695337e-24), (3, 90, 0.0)]
    assert [(h.gid, h.evalue) for h in hits[1]] == [(3, 0.0)]
    assert [(h.gid, h.evalue) for h in hits[2]] == [(9, 1e-5)]
    assert hits[0][0].alignment.count(b'local str "g7"') == 2
    assert parse_fragment_archive((first + second).encode(), 3, keep_alignments=False)[0][0].alignment == b""


def test_archive_without_hits() -> None:
    assert parse_fragment_archive(document([1], []).encode(), 1) == [[]]


@pytest.mark.parametrize(
    "text, message",
    [
        (document([1], [seq_align(2, 1, 5, "0")]), "query 2 of 1"),
        (
            document([1], [seq_align(1, 1, 5, "0"), seq_align(1, 2, 5, "0"), seq_align(1, 1, 5, "0")]),
            "consecutive",
        ),
        (document([1], [seq_align(1, 1, 5, "{ 1, 2, 3 }")]), "e-value"),
        ("<BlastOutput>", "not a BLAST archive"),
    ],
)
def test_malformed_archives_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fragment_archive(text.encode(), 1)


def test_fill_renumbers_queries_and_names_subjects_by_their_database_ids() -> None:
    searched = document(
        [4, 5], [seq_align(4, 12, 50, "0"), seq_align(5, 3, 40, "0"), seq_align(5, 12, 30, "0")]
    )
    hits = parse_fragment_archive(searched.encode(), 5)
    skeleton = document([1, 2], []).encode()
    ids = {3: b'swissprot { name "B_HUMAN", accession "P2" }', 12: b'local str "twelve"'}
    filled = fill_archive(
        skeleton, [[h.alignment for h in hits[4]], [h.alignment for h in hits[3]]], ids.__getitem__
    )
    assert filled.count(b"Blast4-archive") == 1
    reread = filled.replace(ids[3], b'local str "g3"').replace(ids[12], b'local str "g12"')
    again = parse_fragment_archive(reread, 2)
    assert [[h.gid for h in q] for q in again] == [[3, 12], [12]]
    assert filled.startswith(skeleton[: skeleton.index(b"    alignments {")])
    assert fill_archive(skeleton, [[], []], ids.__getitem__) == skeleton


def test_fill_refuses_a_skeleton_with_several_requests_or_alignments() -> None:
    with pytest.raises(ValueError, match="one BLAST archive request"):
        fill_archive((document([1], []) + document([2], [])).encode(), [[], []], lambda gid: b"")
    with pytest.raises(ValueError, match="already holds"):
        fill_archive(document([1], [seq_align(1, 1, 5, "0")]).encode(), [[]], lambda gid: b"")


REPORT = """Query= q{n}

Length=10
{body}

Lambda      K        H{extra}
   {value}

Gapped
Lambda      K        H{extra}
   {value}

Effective search space used: {space}


"""


def test_splice_puts_each_querys_own_statistics_back() -> None:
    formatted = "".join(
        REPORT.format(n=n, body="hits", extra="", value="0.3", space=100) for n in (1, 2)
    ).encode()
    empty = "".join(
        REPORT.format(n=n, body="***** No hits found *****", extra="        a", value=f"0.{n}", space=n * 7)
        for n in (1, 2)
    ).encode()
    spliced = splice_stats(0, formatted, empty, 2).decode()
    assert spliced.count("hits\n") == 2 and "No hits" not in spliced
    assert "Effective search space used: 7\n" in spliced and "Effective search space used: 14\n" in spliced
    assert "Lambda      K        H        a" in spliced and "100" not in spliced
    with pytest.raises(ValueError, match="statistics blocks for 3 queries"):
        splice_stats(0, formatted, empty, 3)
    assert splice_stats(6, b"q1\ts1\n", b"", 1) == b"q1\ts1\n"


def test_first_seqids_from_blastdbcmd_deflines() -> None:
    text = b"""Blast-def-line-set ::= {
  {
    title "Genome polyprotein {odd} OS=Dengue",
    seqid {
      swissprot {
        name "W0FSK4_9FLAV",
        accession "W0FSK4",
        release "unreviewed"
      }
    },
    taxid 0
  }
}
Blast-def-line-set ::= {
  {
    title "contig",
    seqid {
      local str "NODE_1}",
      general {
        db "x",
        tag id 5
      }
    },
    taxid 0
  }
}
"""
    assert list(first_seqids(text.splitlines(keepends=True))) == [
        b'swissprot { name "W0FSK4_9FLAV", accession "W0FSK4", release "unreviewed" }',
        b'local str "NODE_1}"',
    ]
    with pytest.raises(ValueError, match="without a Seq-id"):
        list(first_seqids(text.replace(b"seqid {", b"other {").splitlines(keepends=True)))
