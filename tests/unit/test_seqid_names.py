"""Seq-ids as a fragment search's archive writes them, read back as the names BLAST+ looks them up by
(paramedic.blast.seqid): every kind makeblastdb -parse_seqids makes of common FASTA ids."""

from __future__ import annotations

import pytest

from paramedic.blast.seqid import lookup_name, subject_text

ALIGN = b"""      {
        type partial,
        dim 2,
        segs denseg {
          dim 2,
          numseg 1,
          ids {
            local str "Query_3",
            %s
          },
          starts {
            0,
            1
          }
        }
      }"""


@pytest.mark.parametrize(
    "seqid, name",
    [
        (b'swissprot {\n  name "A7TBS3_NEMVE",\n  accession "A7TBS3",\n  release "unreviewed"\n}', "A7TBS3"),
        (b'other {\n  accession "XP_012345",\n  version 2\n}', "XP_012345.2"),
        (b'genbank {\n  name "X",\n  accession "AB000001",\n  version 1\n}', "AB000001.1"),
        (b'prf {\n  name "1902224A"\n}', "1902224A"),
        (b"gi 123456", "gi|123456"),
        (b'local str "contig_1 ""quoted"""', 'lcl|contig_1 "quoted"'),
        (b"local id 42", "lcl|42"),
        (b'general {\n  db "ENA",\n  tag str "AB1234"\n}', "gnl|ENA|AB1234"),
        (b'general {\n  db "X",\n  tag id 7\n}', "gnl|X|7"),
        (b'pdb {\n  mol "1ABC",\n  chain-id "B"\n}', "pdb|1ABC|B"),
    ],
)
def test_a_subject_id_is_read_as_blast_looks_it_up(seqid: bytes, name: str) -> None:
    block = ALIGN % seqid
    assert subject_text(block) == seqid
    assert lookup_name(subject_text(block)) == name


def test_a_kind_that_cannot_be_looked_up_is_said() -> None:
    with pytest.raises(ValueError, match="patent"):
        lookup_name(b'patent {\n  seqid 1,\n  cit { country "US", id number "1" }\n}')
