"""Restricted searches (issue 43): -taxids, -taxidlist, -seqidlist and their negatives, on databases made by
makeblastdb with -taxid_map, one and several volumes, blastp and blastn, both strategies, byte for byte
against one BLAST+ run with the same options. The taxonomy columns (staxid, staxids, sscinames, scomnames,
sblastnames, sskingdoms) are in every report: without taxdb BLAST+ prints the taxid and N/A.

A restriction changes the statistics (BLAST+ computes e-values from the subset's count and length), so a
fragment search that got the whole database's statistics, or the fragment's own, gives other e-values;
each fixture asserts that its subsets are a small part of the database, and the blastn one that the
approximate lengths BLAST+'s scan uses differ from the exact ones.
"""

from __future__ import annotations

import re
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import blast, paramedic, take_fasta
from tests.integration.test_in_place import _makeblastdb, _read_only, _writable

pytestmark = pytest.mark.integration

COLUMNS = "6 std staxid staxids sscinames scomnames sblastnames sskingdoms"


def _taxid_map(fasta: Path, out: Path, kinds: int) -> dict[str, int]:
    """Each record's first word -> a taxid by its species (UniProt's OS=, else the whole title): families
    of sequences share taxids, as in a real database."""
    taxids = {}
    for line in fasta.read_text().splitlines():
        if line.startswith(">"):
            accession = line[1:].split()[0]
            match = re.search(r"OS=(\S+)", line)
            species = match.group(1) if match else line[1:]
            taxids[accession] = 1000 + zlib.crc32(species.encode()) % kinds
    out.write_text("".join(f"{a} {t}\n" for a, t in taxids.items()))
    return taxids


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("restrict")
    fasta = take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "proteins.fasta", 2400)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", base / "q.fasta", 12)
    taxids = _taxid_map(fasta, base / "taxids.txt", 40)
    dbs = base / "dbs"
    for name, extra in {"one": [], "several": ["-max_file_sz", "300KB"]}.items():
        _makeblastdb(
            fasta, dbs / name / "db", "prot", "-parse_seqids", "-taxid_map", str(base / "taxids.txt"), *extra
        )
        assert len(list((dbs / name).glob("*.pin"))) == (1 if name == "one" else 4) or name == "several"
    assert len(list((dbs / "several").glob("*.pin"))) >= 3
    counts: dict[int, int] = {}
    for t in taxids.values():
        counts[t] = counts.get(t, 0) + 1
    common = sorted(counts, key=lambda t: -counts[t])[:2]
    assert 0 < sum(counts[t] for t in common) < len(taxids) / 5  # a small subset: statistics differ
    (base / "taxidlist.txt").write_text(f"{common[0]}\n")
    accessions = [a.split("|")[1] for a in taxids]  # as users list them: tr|W0FSK4|W0FSK4_9FLAV -> W0FSK4
    (base / "seqids.txt").write_text("\n".join([*accessions[::9], "NOT_IN_THE_DATABASE"]) + "\n")
    (base / "one-seqid.txt").write_text(accessions[1234] + "\n")
    (base / "none.txt").write_text("NOT_IN_THE_DATABASE\n")
    (base / "common").write_text(",".join(map(str, common)))
    (base / "all").write_text(",".join(map(str, sorted(counts))))
    _read_only(dbs)
    yield base
    _writable(dbs)


def _run(
    site: Path, tmp_path: Path, db: str, restriction: list[str], *engine: str, program: str = "blastp"
) -> tuple[str, str]:
    """BLAST+ and paramedic with the same options; e-values up to 10 (blastn: a word of 11 and up to 100),
    so that many hits are marginal and their e-values show the statistics."""
    search = ["-evalue", "10"] if program == "blastp" else ["-task", "blastn", "-evalue", "100"]
    common = ["-query", str(site / "q.fasta"), "-db", db, *search, "-outfmt", COLUMNS, *restriction]
    blast(program, *common, "-out", str(tmp_path / "ref.tsv"), cwd=site)
    proc = paramedic("search", program, *common, "-out", str(tmp_path / "out.tsv"), *engine, cwd=site)
    assert (tmp_path / "out.tsv").read_bytes() == (tmp_path / "ref.tsv").read_bytes(), proc.stderr
    return (tmp_path / "ref.tsv").read_text(), proc.stderr


ENGINES = {
    "fragments": ["--strategy", "fragments", "--traceback", "once"],  # ids kept: lists name the subjects
    "queries": ["--strategy", "queries"],
}


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("db", ["one/db", "several/db"])
@pytest.mark.parametrize("kind", ["taxids", "taxidlist", "seqidlist", "one sequence", "every taxid"])
def test_a_restricted_search_is_exact(site: Path, tmp_path: Path, db: str, kind: str, engine: str) -> None:
    restriction = {
        "taxids": ["-taxids", (site / "common").read_text()],
        "taxidlist": ["-taxidlist", "taxidlist.txt"],  # relative to the user's directory
        "seqidlist": ["-seqidlist", "seqids.txt"],  # with an id the database does not hold
        "one sequence": ["-seqidlist", "one-seqid.txt"],
        "every taxid": ["-taxids", (site / "all").read_text()],
    }[kind]
    report, err = _run(site, tmp_path, f"dbs/{db}", restriction, *ENGINES[engine])
    assert f"strategy: {engine}" in err
    lines = report.splitlines()
    if kind != "one sequence":
        assert len(lines) >= 10, "too few hits to compare statistics"
        assert sum(float(line.split("\t")[10]) > 1e-3 for line in lines) >= 5, "too few marginal e-values"
    assert all(line.endswith("\tN/A\tN/A\tN/A\tN/A") for line in lines)  # no taxdb: taxids, names N/A


def test_negative_lists_go_to_blast_whole(site: Path, tmp_path: Path) -> None:
    """A negative list keeps a sequence unless all of its ids are listed: BLAST+ runs it (queries), and
    the fragments strategy says why it cannot, in one line."""
    restriction = ["-negative_taxids", (site / "common").read_text()]
    _run(site, tmp_path, "dbs/several/db", restriction)  # auto: queries
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", "dbs/several/db", *restriction,
        "-out", str(tmp_path / "o.tsv"), "--strategy", "fragments", cwd=site, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "negative_taxids" in proc.stderr
    assert not (tmp_path / "o.tsv").exists()


def test_an_empty_subset_writes_what_blast_writes(site: Path, tmp_path: Path) -> None:
    """No sequence selected: BLAST+ warns once a query and writes an empty report, exit 0; so does the job
    (the fragments strategy has nothing to search, auto runs BLAST+ whole)."""
    report, err = _run(site, tmp_path, "dbs/several/db", ["-seqidlist", "none.txt"])
    assert report == "" and "Filtering resulted in an empty database" in err


def test_an_absent_taxid_is_blasts_own_message(site: Path, tmp_path: Path) -> None:
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", "dbs/several/db", "-taxids", "999999",
        "-out", str(tmp_path / "o.tsv"), cwd=site, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Taxonomy ID(s) not found" in proc.stderr
    assert not (tmp_path / "o.tsv").exists()


@pytest.fixture(scope="module")
def genomes(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    """H. pylori's contigs and genomes with 6 taxids, in several volumes, and DNA queries cut from them."""
    from tests.integration.equality import cut_dna_queries, read_gz_fasta

    base = tmp_path_factory.mktemp("restrict-dna")
    records = [
        r for p in sorted((data_dir / "ragout" / "H.Pylori").rglob("*.fasta.gz")) for r in read_gz_fasta(p)
    ]
    fasta = base / "genomes.fasta"
    fasta.write_text("".join(f">{h}\n{s}\n" for h, s in records))
    cut_dna_queries([r for r in records if len(r[1]) > 10_000], 6, seed=7, out=base / "q.fasta")
    taxids = _taxid_map(fasta, base / "taxids.txt", 6)
    dbs = base / "dbs"
    _makeblastdb(fasta, dbs / "dna", "nucl", "-parse_seqids", "-taxid_map", str(base / "taxids.txt"),
                 "-max_file_sz", "300KB")  # fmt: skip
    assert len(list(dbs.glob("*.nin"))) >= 3
    chosen = sorted(set(taxids.values()))[:2]
    (base / "common").write_text(",".join(map(str, chosen)))
    # the case: BLAST+'s scan counts nucleotide lengths approximately, and here that differs from exact
    exact = subprocess.run(
        ["blastdbcmd", "-db", str(dbs / "dna"), "-taxids", (base / "common").read_text(), "-outfmt", "%l"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    from paramedic.blast.options import BlastOptions
    from paramedic.db.locate import resolve_database
    from paramedic.db.subset import resolve_subset

    db, _ = resolve_database(str(dbs / "dna"), base, dbtype="nucl")
    options = BlastOptions.parse("blastn", ["-taxids", (base / "common").read_text()])
    subset = resolve_subset(db, options, base)
    assert subset.nseq == len(exact) and subset.length != sum(map(int, exact))
    _read_only(dbs)
    yield base
    _writable(dbs)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_blastn_restricted_to_taxids(genomes: Path, tmp_path: Path, engine: str) -> None:
    restriction = ["-taxids", (genomes / "common").read_text()]
    report, _ = _run(genomes, tmp_path, "dbs/dna", restriction, *ENGINES[engine], program="blastn")
    marginal = [line for line in report.splitlines() if float(line.split("\t")[10]) > 1e-3]
    assert len(marginal) >= 5, "too few marginal e-values to show the statistics"


def test_paramedic_format_keeps_taxids(site: Path, tmp_path: Path) -> None:
    """`paramedic format --taxid-map` (issue 43, item 2): staxids and -taxids as on the makeblastdb
    database made with the same map (before, every staxids value was 0)."""
    paramedic(
        "format", "--in", str(site / "proteins.fasta"), "--dbtype", "prot", "--fragments", "3",
        "--out", str(tmp_path / "fmt" / "db"), "--taxid-map", str(site / "taxids.txt"), "--quiet",
    )  # fmt: skip
    for restriction in ([], ["-taxids", (site / "common").read_text()]):
        common = [
            "-query",
            str(site / "q.fasta"),
            "-evalue",
            "1e-3",
            "-outfmt",
            "6 std staxids",
            *restriction,
        ]
        blast("blastp", *common, "-db", "dbs/several/db", "-out", str(tmp_path / "ref.tsv"), cwd=site)
        paramedic(
            "search", "blastp", *common, "-db", str(tmp_path / "fmt" / "db"), "-out", str(tmp_path / "o.tsv")
        )
        report = (tmp_path / "ref.tsv").read_text()
        assert report and "\t0\n" not in report
        assert (tmp_path / "o.tsv").read_text() == report


# Shipping a restricted search's metadata to a storage site: tests/integration/test_restricted_ship.py
