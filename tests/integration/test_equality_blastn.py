"""paramedic search == one BLAST+ run on the unsplit database (blastn, real genomes, real MPI ranks).

The database: every genome and contig set of ragout-examples (E. coli, H. pylori, S. aureus, V. cholerae),
65 Mbp. Queries: 60 pieces of 300-3000 bp cut from those genomes at seeded random places, half reverse
complemented, so many queries hit several strains with equal scores: the tie rule (ordinal id descending)
is exercised. Same matrix and rules as the blastp test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import paramedic, without_posted_date
from tests.integration.equality import Site, cut_dna_queries, write_ragout_genomes

pytestmark = pytest.mark.integration

TITLE = "ragout-examples genomes and contigs"
FORMATS = ["6", "7", "0", "5"]
MAX_TARGET = [None, "10"]
DIRECT = {(4, None): "5", (4, "10"): "0", (7, None): "6", (7, "10"): "7"}


@pytest.fixture(scope="module")
def site(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("blastn")
    records = write_ragout_genomes(data_dir, root / "genomes.fasta")
    genomes = [r for r in records if len(r[1]) > 1_000_000]
    cut_dna_queries(genomes, 60, 20261121, root / "queries.fasta")
    site = Site(root, "blastn", "genomes", "nucl", TITLE, DIRECT)
    site.build(root / "genomes.fasta")
    return site


@pytest.mark.parametrize("outfmt", FORMATS)
@pytest.mark.parametrize("max_target", MAX_TARGET, ids=["default", "mts10"])
@pytest.mark.parametrize("fragments", [4, 7])
def test_blastn_matches_blast(site: Site, fragments: int, max_target: str | None, outfmt: str) -> None:
    site.assert_matches(site.search(fragments, max_target, outfmt), max_target, outfmt)


@pytest.mark.parametrize("fragments", [4, 7])
def test_blastn_ties_at_a_tight_cap(site: Site, fragments: int) -> None:
    """-max_target_seqs 1: strains share identical regions, so equal e-values and scores compete for the
    last place and BLAST+'s tie rule (higher ordinal id first) decides which subject is kept.
    --regen-batch 1 gives each query a mask of exactly its merged subjects, so the merge's choice shows.
    Strict equality here: a wrong tie rule keeps an equally good but different subject.
    The 4-fragment run starts BLAST+ normally (no fork server), the 7-fragment one through the fork server."""
    out = site.root / f"p{fragments}-tight.out"
    env = {"PARAMEDIC_FORKSERVER": "0"} if fragments == 4 else None
    paramedic(
        "search", "blastn", "-query", str(site.root / "queries.fasta"), "-db", "genomes", "-outfmt", "6",
        "-max_target_seqs", "1", "-out", str(out), "--np", "2", "--regen-batch", "1", "--strategy", "fragments",
        "--quiet", cwd=site.root / f"p{fragments}", env=env,
    )  # fmt: skip
    assert out.read_bytes() == site.reference("1", "6")


@pytest.mark.parametrize(
    "outfmt",
    [
        "10",
        "15",
        "16",
        "17",
        "11",
        "1",
        "3",
        "6 qseqid sseqid evalue bitscore score nident staxid",
        "0 -html",
    ],
)
def test_blastn_other_formats_match_blast(site: Site, outfmt: str) -> None:
    """Every format is written by BLAST+ itself: stitched formats (10, 15, 16, 1, 3, custom tabular, HTML)
    and formats regenerated as one piece (17 SAM, 11 archive), from the metadata of the 7-fragment search."""
    fmt, *flags = outfmt.split(" -")
    flags = [f"-{f}" for f in flags]
    out = site.search(7, None, fmt, *flags)
    expected = without_posted_date(site.reference(None, fmt, *flags), fmt)
    actual = without_posted_date(out.read_bytes(), fmt)
    if fmt == "17":  # SAM's @PG line holds the command line, which names the query file
        expected = b"\n".join(ln for ln in expected.split(b"\n") if not ln.startswith(b"@PG"))
        actual = b"\n".join(ln for ln in actual.split(b"\n") if not ln.startswith(b"@PG"))
    assert actual == expected


@pytest.mark.parametrize("outfmt", ["0", "5", "7"])
def test_blastn_query_segmentation_matches_blast(site: Site, outfmt: str) -> None:
    """--strategy queries (whole database per task, no merge, no regeneration) gives the same bytes."""
    out = site.root / f"queries-{outfmt}.out"
    paramedic(
        "search", "blastn", "-query", str(site.root / "queries.fasta"), "-db", "genomes", "-outfmt", outfmt,
        "-out", str(out), "--np", "2", "--strategy", "queries", "--batch", "7", "--quiet", cwd=site.root / "p4",
    )  # fmt: skip
    site.assert_matches(out, None, outfmt)
