"""paramedic search == one BLAST+ run on the unsplit database (blastp, real data, real MPI ranks).

100 mmseqs2-examples queries against its 20,000 UniProt proteins formatted into 4 and 7 fragments, for
outfmt 6, 7, 0 and 5, with the default -max_target_seqs and with 10. The reference database is built
independently with makeblastdb; the only normalised bytes are the text reports' "Posted date" line (the
build time of two different databases). With -max_target_seqs 10 most queries fill their hit lists: the
engine then searches them again against their whole preliminary list, and the output must still be equal.

Each (fragments, cap) pair is searched once directly and regenerated for the other formats (equality.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import paramedic, take_fasta
from tests.integration.equality import Site

pytestmark = pytest.mark.integration

FORMATS = ["6", "7", "0", "5"]
MAX_TARGET = [None, "10"]


@pytest.fixture(scope="module")
def site(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("blastp")
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "queries.fasta", 100)
    direct = {(4, None): "0", (4, "10"): "5", (7, None): "7", (7, "10"): "6"}
    site = Site(root, "blastp", "uniprot", "prot", "mmseqs2-examples DB", direct)
    site.build(data_dir / "mmseqs2" / "DB.fasta")
    return site


@pytest.mark.parametrize("outfmt", FORMATS)
@pytest.mark.parametrize("max_target", MAX_TARGET, ids=["default", "mts10"])
@pytest.mark.parametrize("fragments", [4, 7])
def test_blastp_matches_blast(site: Site, fragments: int, max_target: str | None, outfmt: str) -> None:
    site.assert_matches(site.search(fragments, max_target, outfmt), max_target, outfmt)


def test_blastp_query_segmentation_with_shrinking_pieces_matches_blast(site: Site) -> None:
    """--strategy queries with its own plan: pieces shrink (factoring), the report is still BLAST+'s."""
    out = site.root / "queries-0.out"
    paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", "0",
        "-out", str(out), "--np", "2", "--strategy", "queries", "--quiet", cwd=site.root / "p4",
    )  # fmt: skip
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["strategy"] == "queries" and record["pieces"] >= 4
    assert record["search_batch_queries"] > 100 / record["pieces"]  # the first piece is the largest
    site.assert_matches(out, None, "0")
