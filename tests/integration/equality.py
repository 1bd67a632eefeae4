"""What the blastp and blastn equality tests share: a site with a reference database built by makeblastdb
and paramedic databases of several fragment counts, BLAST+ reference runs, paramedic runs, the comparison.

Each (fragments, cap) pair is searched once, directly in one format (`direct` maps the pair to it, so every
format is searched directly at least once) with --metadata; its other formats are regenerated from that
metadata with --from-metadata: the same regeneration path, without searching again.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import blast, paramedic, without_posted_date

COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


def read_gz_fasta(path: Path) -> list[tuple[str, str]]:
    records = []
    for chunk in gzip.open(path, "rt").read().split(">")[1:]:
        header, _, seq = chunk.partition("\n")
        records.append((header, seq.replace("\n", "")))
    return records


def write_ragout_genomes(data_dir: Path, out: Path) -> list[tuple[str, str]]:
    """Every genome and contig set of ragout-examples (65 Mbp) into one FASTA file; returns the records."""
    sources = sorted((data_dir / "ragout").glob("*/*.fasta.gz")) + sorted(
        (data_dir / "ragout").glob("*/references/*.fasta.gz")
    )
    records = [r for path in sources for r in read_gz_fasta(path)]
    with open(out, "w") as fh:
        for header, seq in records:
            fh.write(f">{header}\n{seq}\n")
    return records


def cut_dna_queries(genomes: list[tuple[str, str]], n: int, seed: int, out: Path) -> None:
    """`n` pieces of 300-3000 bp cut from `genomes` at seeded random places, every other one reverse
    complemented: real sequence that hits each strain carrying it (many subjects, ties between strains)."""
    rng = random.Random(seed)
    with open(out, "w") as fh:
        for i in range(n):
            header, seq = rng.choice(genomes)
            length = rng.randint(300, 3000)
            start = rng.randrange(0, len(seq) - length)
            piece = seq[start : start + length]
            if i % 2:
                piece = piece.translate(COMPLEMENT)[::-1]
            fh.write(f">q{i + 1} {header.split()[0]}:{start + 1}-{start + length}\n{piece}\n")


def assert_report_path(out: Path, rendered: bool) -> None:
    """A direct search writes pieces from the search's alignments (blast_formatter), except those with a
    query whose hit list filled or whose queries are masked, which are searched again; a run from saved
    metadata (ids only) writes every piece by search."""
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    tasks = [rank["tasks"] for rank in record["ranks_stats"]]
    assert sum(t["render_fallbacks"] for t in tasks) == 0
    written = sum(t["rendered"] for t in tasks)
    assert written <= record["pieces"] if rendered else written == 0


@dataclass
class Site:
    root: Path  # holds queries.fasta, ref/<db>, p<N>/<db>
    program: str
    db: str  # the -db name, the same string for BLAST+ and paramedic (outfmt 5 and 7 print it)
    dbtype: str
    title: str
    direct: dict[tuple[int, str | None], str]
    _references: dict[tuple[str | None, str], bytes] = field(default_factory=dict)

    def build(self, fasta: Path, fragment_counts: tuple[int, ...] = (4, 7), layout: str = "blastdb") -> None:
        """BLAST+'s own database under ref/, and `paramedic format`'s of each fragment count under p<N>/
        (`layout` "fragments": the layout of earlier versions, for the tests of its mechanisms)."""
        (self.root / "ref").mkdir()
        blast(
            "makeblastdb", "-in", str(fasta), "-dbtype", self.dbtype, "-parse_seqids", "-out", self.db,
            "-title", self.title, cwd=self.root / "ref",
        )  # fmt: skip
        for n in fragment_counts:
            paramedic(
                "format", "--in", str(fasta), "--dbtype", self.dbtype, "--fragments", str(n),
                "--out", str(self.root / f"p{n}" / self.db), "--title", self.title, "--layout", layout, "--quiet",
            )  # fmt: skip

    def reference(self, max_target: str | None, outfmt: str, *flags: str) -> bytes:
        """One BLAST+ run on the unsplit database (cached per options)."""
        key = (max_target, " ".join([outfmt, *flags]))
        if key not in self._references:
            out = self.root / f"ref-{max_target}-{outfmt.replace(' ', '_')}{''.join(flags)}.out"
            extra = ["-max_target_seqs", max_target] if max_target else []
            blast(
                self.program, "-query", str(self.root / "queries.fasta"), "-db", self.db, "-outfmt", outfmt,
                *flags, *extra, "-num_threads", "2", "-out", str(out), cwd=self.root / "ref",
            )  # fmt: skip
            self._references[key] = out.read_bytes()
        return self._references[key]

    def metadata(self, fragments: int, max_target: str | None) -> Path:
        """The metadata of the (fragments, cap) search, searching directly first if needed."""
        path = self.root / f"p{fragments}-{max_target}.metadata.json"
        if not path.exists():
            self.search(fragments, max_target, self.direct[(fragments, max_target)])
        return path

    def search(self, fragments: int, max_target: str | None, outfmt: str, *flags: str) -> Path:
        """Output of `paramedic search --strategy fragments`: direct, or regenerated from its metadata."""
        direct = self.direct.get((fragments, max_target)) == outfmt and not flags
        metadata = self.root / f"p{fragments}-{max_target}.metadata.json"
        how = (
            ["--metadata", str(metadata)]
            if direct
            else ["--from-metadata", str(self.metadata(fragments, max_target))]
        )
        out = self.root / f"p{fragments}-{max_target}-{outfmt.replace(' ', '_')}{''.join(flags)}.out"
        extra = ["-max_target_seqs", max_target] if max_target else []
        paramedic(
            "search", self.program, "-query", str(self.root / "queries.fasta"), "-db", self.db, "-outfmt", outfmt,
            *flags, *extra, "-out", str(out), "--np", "2", "--strategy", "fragments", "--quiet", *how,
            cwd=self.root / f"p{fragments}",
        )  # fmt: skip
        assert_report_path(out, rendered=direct)
        return out

    def assert_matches(self, out: Path, max_target: str | None, outfmt: str) -> None:
        """Byte equality with the reference (the text reports' Posted date aside), or the cap rule."""
        expected = without_posted_date(self.reference(max_target, outfmt), outfmt)
        actual = without_posted_date(out.read_bytes(), outfmt)
        assert actual == expected, f"outfmt {outfmt}, -max_target_seqs {max_target}: differs from BLAST+"
