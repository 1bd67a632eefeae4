"""The data sets of the conformance matrix, built from the project's own real data (scripts/fetch-data.sh).

- proteins: the 20,000 mmseqs2 proteins; protein queries (mmseqs2) and DNA queries (ragout pieces).
- genomes: the ragout genomes and contig sets (65 Mbp, 2,533 sequences); strains share regions, so
  equal alignments tie, and sum statistics give them e-values that differ from the eighth digit on.
- saturating: the mmseqs2 proteins plus three copies with 15% substitutions (80,000 proteins); its
  queries have more candidates than BLAST+'s preliminary list keeps (checked by the harness).

Each set has a reference database built by makeblastdb (`ref/<db>`) and paramedic databases of every
fragment count the matrix uses (`p<N>/<db>`), searched under the same -db string so that the reports
that print it agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import blast, paramedic
from tests.integration.equality import cut_dna_queries, read_gz_fasta

AMINO = "ACDEFGHIKLMNPQRSTVWY"
# mmseqs2 queries (0-based) that fill BLAST+'s preliminary list against the saturating database.
SATURATING_QUERIES = (6, 57, 71, 0, 1, 2)
# One codon per amino acid (standard code), to write protein queries as DNA for blastx.
CODON = dict(
    zip(
        "ACDEFGHIKLMNPQRSTVWYX",
        "GCT TGT GAT GAA TTT GGT CAT ATT AAA CTG ATG AAT CCG CAG CGT AGC ACC GTG TGG TAT NNN".split(),
        strict=True,
    )
)


@dataclass(frozen=True)
class DataSet:
    name: str
    root: Path
    db: str
    dbtype: str
    queries: dict[str, Path]  # query molecule ("prot"/"nucl") -> FASTA

    def reference_dir(self) -> Path:
        return self.root / "ref"

    def fragments_dir(self, fragments: int) -> Path:
        return self.root / f"p{fragments}"


def _fasta_records(path: Path) -> list[tuple[str, str]]:
    records = []
    for chunk in ("\n" + path.read_text()).split("\n>")[1:]:  # ">" also occurs inside headers
        header, _, body = chunk.partition("\n")
        records.append((header, body.replace("\n", "")))
    return records


def _write(path: Path, records: list[tuple[str, str]]) -> Path:
    with open(path, "w") as fh:
        for header, seq in records:
            fh.write(f">{header}\n{seq}\n")
    return path


def _format(root: Path, fasta: Path, db: str, dbtype: str, fragment_counts: tuple[int, ...]) -> None:
    """The reference database and the fragmented ones; those already in a reused work directory are kept
    (`paramedic format` writes its manifest last, so a database with one is complete)."""
    if not list((root / "ref").glob(f"{db}.?db")):
        (root / "ref").mkdir(parents=True, exist_ok=True)
        blast(
            "makeblastdb", "-in", str(fasta), "-dbtype", dbtype, "-parse_seqids", "-out", db, cwd=root / "ref"
        )
    for n in fragment_counts:
        if (root / f"p{n}" / db / "manifest.json").exists():
            continue
        paramedic(
            "format", "--in", str(fasta), "--dbtype", dbtype, "--fragments", str(n),
            "--out", str(root / f"p{n}" / db), "--quiet",
        )  # fmt: skip


def _protein_queries(data: Path, indices: tuple[int, ...] | range) -> list[tuple[str, str]]:
    records = _fasta_records(data / "mmseqs2" / "QUERY.fasta")
    return [records[i] for i in indices]


def _dna_queries(data: Path, root: Path, n: int, seed: int) -> Path:
    sources = sorted((data / "ragout").glob("*/*.fasta.gz")) + sorted(
        (data / "ragout").glob("*/references/*.fasta.gz")
    )
    genomes = [r for path in sources for r in read_gz_fasta(path) if len(r[1]) > 1_000_000]
    out = root / "dna-queries.fasta"
    cut_dna_queries(genomes, n, seed, out)
    return out


def proteins(data: Path, root: Path, fragment_counts: tuple[int, ...], n_queries: int) -> DataSet:
    root.mkdir(parents=True, exist_ok=True)
    _format(root, data / "mmseqs2" / "DB.fasta", "proteins", "prot", fragment_counts)
    prot = _write(root / "prot-queries.fasta", _protein_queries(data, range(n_queries)))
    nucl = _dna_queries(data, root, n_queries, seed=20261122)
    return DataSet("proteins", root, "proteins", "prot", {"prot": prot, "nucl": nucl})


def genomes(data: Path, root: Path, fragment_counts: tuple[int, ...], n_queries: int) -> DataSet:
    root.mkdir(parents=True, exist_ok=True)
    sources = sorted((data / "ragout").glob("*/*.fasta.gz")) + sorted(
        (data / "ragout").glob("*/references/*.fasta.gz")
    )
    fasta = _write(root / "genomes.fasta", [r for path in sources for r in read_gz_fasta(path)])
    _format(root, fasta, "genomes", "nucl", fragment_counts)
    prot = _write(root / "prot-queries.fasta", _protein_queries(data, range(n_queries)))
    nucl = _dna_queries(data, root, n_queries, seed=20261121)
    return DataSet("genomes", root, "genomes", "nucl", {"prot": prot, "nucl": nucl})


def saturating(data: Path, root: Path, fragment_counts: tuple[int, ...]) -> DataSet:
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(11)
    parsed = _fasta_records(data / "mmseqs2" / "DB.fasta")
    records = list(parsed)
    for c in range(3):
        for i, (_, seq) in enumerate(parsed):
            copy = "".join(rng.choice(AMINO) if rng.random() < 0.15 else x for x in seq)
            records.append((f"copy{c}_{i}", copy))
    fasta = _write(root / "saturating.fasta", records)
    _format(root, fasta, "saturating", "prot", fragment_counts)
    chosen = _protein_queries(data, SATURATING_QUERIES)
    prot = _write(root / "prot-queries.fasta", chosen)
    dna = [(h, "".join(CODON.get(a, "NNN") for a in seq)) for h, seq in chosen]
    nucl = _write(root / "dna-queries.fasta", dna)
    return DataSet("saturating", root, "saturating", "prot", {"prot": prot, "nucl": nucl})
