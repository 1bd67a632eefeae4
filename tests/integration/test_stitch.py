"""Stitched batch outputs must be byte-identical to one BLAST+ run over all the queries.

Every format `can_stitch` claims is checked here against real BLAST+ runs on real data: a small protein
database (the first 3000 UniProt proteins of the mmseqs2 benchmark) with 13 queries, one of them a random
peptide and several real ones without hits at -evalue 1e-3, split into batches of 1, 5 and 7 queries; and
a nucleotide database of two E. coli contigs with queries cut from them (reverse strand, mutations, small
indels, a contig not in the database, random sequence). Query 1 alone, without hits, is the first batch;
the last batch crosses Query_9 -> Query_10, which widens the query-anchored label column.

All runs use the same -db string and working directory, since outfmt 0/5/7 print the -db argument.
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from paramedic.output.stitch import Stitcher, can_stitch

pytestmark = pytest.mark.integration

# Under the data directory (conftest's `data_dir`: missing BLAST+ or data fails the run in CI).
PROT_DB = Path("mmseqs2", "DB.fasta")
PROT_QUERIES = Path("mmseqs2", "QUERY.fasta")
CONTIGS = Path("ragout", "E.Coli", "mg1655_contigs.fasta.gz")

STITCHED = ["0", "1", "2", "3", "4", "5", "6", "7", "10", "15", "16"]
CUSTOM_TABULAR = ["6 qseqid sseqid pident evalue bitscore staxid", "7 qseqid sseqid evalue", "10 std qlen"]
NOT_STITCHED = ["8", "9", "11", "12", "13", "14", "17", "18", "", "x"]
SIZES = (1, 5, 7)


def _records(lines) -> list[tuple[str, str]]:
    """(header line without '>', exactly as written; sequence) per FASTA record."""
    records: list[tuple[str, list[str]]] = []
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith(">"):
            records.append((line[1:], []))
        elif records:
            records[-1][1].append(line.strip())
    return [(header, "".join(parts)) for header, parts in records]


def _first_records(path: Path, count: int) -> list[tuple[str, str]]:
    lines = []
    with open(path) as handle:
        seen = 0
        for line in handle:
            if line.startswith(">"):
                seen += 1
                if seen > count:
                    break
            lines.append(line)
    return _records(lines)


def _write_fasta(path: Path, records: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f">{header}\n{seq}\n" for header, seq in records))
    return path


@dataclass
class Setup:
    program: str
    workdir: Path
    db: str  # as given to -db, relative to workdir
    queries: list[tuple[str, str]]
    options: list[str]

    def run(self, outfmt: str, records: list[tuple[str, str]], extra: tuple[str, ...] = ()) -> bytes:
        # A file per run (runs go two at a time); its name is not printed by the formats tested here.
        fd, name = tempfile.mkstemp(suffix=".fa", dir=self.workdir)
        os.close(fd)
        query = _write_fasta(Path(name), records)
        cmd = [self.program, "-query", query.name, "-db", self.db, "-outfmt", outfmt, *self.options, *extra]
        try:
            proc = subprocess.run(cmd, cwd=self.workdir, capture_output=True, timeout=120)
        finally:
            query.unlink()
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout

    def pieces(self, outfmt: str, sizes, extra: tuple[str, ...] = ()) -> list[tuple[bytes, int]]:
        """(output, query offset) of one run per consecutive batch."""
        return self._outputs(outfmt, sizes, extra)[1]

    def check(self, outfmt: str, sizes=SIZES, extra: tuple[str, ...] = ()) -> bytes:
        whole, pieces = self._outputs(outfmt, sizes, extra)
        stitched = _stitch(outfmt, pieces, len(self.queries))
        assert stitched == whole, _first_difference(stitched, whole)
        return whole

    def _outputs(self, outfmt: str, sizes, extra: tuple[str, ...]) -> tuple[bytes, list[tuple[bytes, int]]]:
        """One run over all the queries and one per consecutive batch of `sizes` queries, two at a time."""
        assert sum(sizes) == len(self.queries)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        batches = [self.queries[o : o + n] for o, n in zip(offsets, sizes, strict=True)]
        with ThreadPoolExecutor(max_workers=2) as pool:
            whole = pool.submit(self.run, outfmt, self.queries, extra)
            outputs = list(pool.map(lambda batch: self.run(outfmt, batch, extra), batches))
        return whole.result(), list(zip(outputs, offsets, strict=True))


def _stitch(outfmt: str, pieces: list[tuple[bytes, int]], total: int) -> bytes:
    stitcher = Stitcher(outfmt, len(pieces))
    return b"".join(stitcher.piece(i, data, offset, total) for i, (data, offset) in enumerate(pieces))


def _first_difference(got: bytes, want: bytes) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
    )
    line = want.count(b"\n", 0, at) + 1
    context = slice(max(0, at - 80), at + 80)
    return f"first difference at byte {at} (line {line}): got {got[context]!r}, want {want[context]!r}"


@pytest.fixture(scope="module")
def prot(data_dir: Path, tmp_path_factory) -> Setup:
    work = tmp_path_factory.mktemp("stitch_prot")
    _write_fasta(work / "db.fa", _first_records(data_dir / PROT_DB, 3000))
    subprocess.run(
        ["makeblastdb", "-in", "db.fa", "-dbtype", "prot", "-parse_seqids", "-out", "prot"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    queries = _first_records(data_dir / PROT_QUERIES, 12)
    rng = random.Random(11)
    queries.insert(
        1, ("nohit random peptide", "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(18)))
    )
    return Setup("blastp", work, "prot", queries, ["-evalue", "1e-3", "-max_target_seqs", "20"])


@pytest.fixture(scope="module")
def nucl(data_dir: Path, tmp_path_factory) -> Setup:
    work = tmp_path_factory.mktemp("stitch_nucl")
    with gzip.open(data_dir / CONTIGS, "rt") as handle:
        contigs = dict(_records(line for line in handle))
    seq1, seq2, seq3 = contigs["seq1"], contigs["seq2"], contigs["seq3"]
    _write_fasta(work / "db.fa", [("seq1", seq1), ("seq2", seq2)])
    subprocess.run(
        ["makeblastdb", "-in", "db.fa", "-dbtype", "nucl", "-parse_seqids", "-out", "nt"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    rng = random.Random(5)
    revcomp = seq2[50000:50800][::-1].translate(str.maketrans("ACGT", "TGCA"))
    mutated = "".join(c if rng.random() > 0.08 else rng.choice("ACGT") for c in seq1[120000:121000])
    queries = [
        ("nq1 seq1 fragment", seq1[1000:1600]),
        ("nq2 random", "".join(rng.choice("ACGT") for _ in range(300))),
        ("nq3 seq2 reverse strand", revcomp),
        ("nq4 seq1 mutated", mutated),
        ("nq5 seq3, not in the database", seq3[5000:5400]),
        ("nq6 seq2", seq2[100:400]),
    ]
    for i in range(6):  # small deletions and an insertion: gaps and insertion markers
        a = 20000 + 30000 * i
        frag = seq1[a : a + 100] + seq1[a + 103 + i : a + 250] + seq1[a + 260 : a + 400]
        frag = frag[:200] + "".join(rng.choice("ACGT") for _ in range(5)) + frag[200:]
        queries.append((f"indel{i} seq1 with indels", frag))
    return Setup("blastn", work, "nt", queries, ["-max_target_seqs", "20"])


def test_claimed_formats() -> None:
    for outfmt in STITCHED + CUSTOM_TABULAR + [" 6 std "]:
        assert can_stitch(outfmt), outfmt
    for outfmt in NOT_STITCHED:
        assert not can_stitch(outfmt), outfmt
        with pytest.raises(ValueError):
            Stitcher(outfmt, 2)
        # The engine regenerates such a job in one run: one piece passes through unchanged.
        assert Stitcher(outfmt, 1).piece(0, b"@HD\tVN:1.2\n\x00", 0, 3) == b"@HD\tVN:1.2\n\x00"


def test_data_has_the_cases(prot: Setup, nucl: Setup) -> None:
    """The query sets cover what the stitching must handle: no-hit queries (also as a batch of their own),
    a query with hits past Query_9, and insertion markers in the query-anchored view."""
    report = prot.run("0", prot.queries)
    sections = report.split(b"\nQuery= ")[1:]
    assert len(sections) == len(prot.queries)
    assert b"No hits found" in sections[0] and b"No hits found" in sections[1]
    assert b"No hits found" not in sections[-1]
    anchored = prot.run("1", prot.queries)
    assert b"\nQuery_12  " in anchored and b"\\" in anchored
    nucl_report = nucl.run("0", nucl.queries)
    assert nucl_report.count(b"No hits found") >= 2
    nucl_anchored = nucl.run("1", nucl.queries)
    assert b"\nQuery_12  " in nucl_anchored and b"\\" in nucl_anchored


@pytest.mark.parametrize("outfmt", STITCHED + CUSTOM_TABULAR)
def test_blastp(prot: Setup, outfmt: str) -> None:
    prot.check(outfmt)


@pytest.mark.parametrize("outfmt", ["0", "1", "3"])
def test_blastp_html(prot: Setup, outfmt: str) -> None:
    assert b"<HTML>" in prot.check(outfmt, extra=("-html",))


@pytest.mark.parametrize("outfmt", ["1", "5", "7", "15", "16"])
def test_blastp_parse_deflines(prot: Setup, outfmt: str) -> None:
    """With -parse_deflines the FASTA ids replace BLAST+'s positional Query_N and must be kept."""
    assert b"Query_" not in prot.check(outfmt, extra=("-parse_deflines",))


@pytest.mark.parametrize("outfmt", ["1", "5", "7", "15"])
def test_blastp_single_query_pieces(prot: Setup, outfmt: str) -> None:
    prot.check(outfmt, sizes=(1,) * len(prot.queries))


@pytest.mark.parametrize("outfmt", ["0", "1", "5", "7", "15", "16"])
def test_blastn(nucl: Setup, outfmt: str) -> None:
    nucl.check(outfmt, sizes=(2, 8, 2))


@pytest.mark.parametrize("outfmt", ["0", "5", "7", "15", "16"])
@pytest.mark.parametrize("extra", [(), ("-parse_deflines",)], ids=["positional", "parse_deflines"])
def test_a_query_blast_cannot_search_is_stitched(
    prot: Setup, outfmt: str, extra: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protein of X alone: XML, JSON and XML2 carry BLAST+'s warning in the query's message, naming it
    "Query_N id:", which moves with the query like its id (issue 23). BLAST+ reports such a query
    differently when its batch holds other queries, so here every query is a batch (as pieces follow
    BLAST+'s batches)."""
    monkeypatch.setenv("BATCH_SIZE", "1")
    queries = [*prot.queries[:2], ("allx nothing to search", "X" * 60)]
    whole = Setup(prot.program, prot.workdir, prot.db, queries, prot.options).check(outfmt, (2, 1), extra)
    if outfmt in ("5", "15", "16"):
        said = b"allx nothing to search: Could not"
        assert (
            b"allx nothing to search:  " if extra else b"Query_3 allx nothing to search:  Query_3 "
        ) + said in whole


def test_one_piece_is_the_run_itself(prot: Setup) -> None:
    data = prot.run("5", prot.queries)
    assert Stitcher("5", 1).piece(0, data, 0, len(prot.queries)) == data


@pytest.mark.parametrize("outfmt", ["0", "1", "5", "7", "15", "16"])
def test_refuses_wrong_pieces(prot: Setup, outfmt: str) -> None:
    pieces = prot.pieces(outfmt, SIZES)
    total = len(prot.queries)
    (first, _), (second, off2), _ = pieces

    with pytest.raises(ValueError, match="expected piece 0"):
        Stitcher(outfmt, 3).piece(1, second, off2, total)
    stitcher = Stitcher(outfmt, 3)
    stitcher.piece(0, first, 0, total)
    with pytest.raises(ValueError, match="query_offset"):
        stitcher.piece(1, second, off2 + 1, total)
    for broken in (second[: len(second) // 2], second[:-30], b"", b"garbage\n"):
        stitcher = Stitcher(outfmt, 3)
        stitcher.piece(0, first, 0, total)
        with pytest.raises(ValueError):
            stitcher.piece(1, broken, off2, total)
    stitcher = Stitcher(outfmt, 2)  # the last piece must complete the job's queries
    stitcher.piece(0, first, 0, total)
    with pytest.raises(ValueError, match="queries"):
        stitcher.piece(1, second, off2, total)


def test_refuses_pieces_of_other_runs(prot: Setup) -> None:
    """Pieces with another database or other options must not be joined."""
    first = prot.run("5", prot.queries[:1])
    other = prot.run("5", prot.queries[1:], extra=("-matrix", "BLOSUM80"))
    stitcher = Stitcher("5", 2)
    stitcher.piece(0, first, 0, len(prot.queries))
    with pytest.raises(ValueError, match="header"):
        stitcher.piece(1, other, 1, len(prot.queries))
