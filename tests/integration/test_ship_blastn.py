"""Two sites with blastn on real genomes: the storage site's file equals a local search for every --ship mode.

The database: the H. pylori genomes and contigs of ragout-examples (5 complete genomes and a contig set,
~10 Mbp), formatted into 3 fragments and copied as the storage site's replica. Queries: 12 pieces of
300-3000 bp cut from the genomes at seeded random places, half reverse complemented, so each hits several
strains (many subjects per query, references between queries in the metadata codec). A real
`paramedic serve` (TLS 1.3, client certificates) regenerates the metadata runs with BLAST+.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.integration.equality import cut_dna_queries, read_gz_fasta
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration

N_QUERIES = 12


@pytest.fixture(scope="module")
def two_sites(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("ship-blastn")
    compute, replica, root = base / "compute", base / "replica", base / "root"
    for d in (compute, replica, root):
        d.mkdir()
    sources = sorted((data_dir / "ragout" / "H.Pylori").glob("**/*.fasta.gz"))
    records = [r for path in sources for r in read_gz_fasta(path)]
    with open(base / "hp.fasta", "w") as fh:
        fh.writelines(f">{header}\n{seq}\n" for header, seq in records)
    genomes = [r for r in records if len(r[1]) > 1_000_000]
    assert len(genomes) >= 4
    cut_dna_queries(genomes, N_QUERIES, 7700, compute / "q.fasta")
    paramedic(
        "format", "--in", str(base / "hp.fasta"), "--dbtype", "nucl", "--fragments", "3",
        "--out", "db/hp", "--quiet", cwd=compute,
    )  # fmt: skip
    subprocess.run(["cp", "-r", str(compute / "db"), str(replica / "db")], check=True)
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    server = StorageSite(replica / "db" / "hp", root, base / "keys" / "server", base / "serve.log")
    server.start()
    try:
        yield base, server
    finally:
        server.stop()


@pytest.mark.parametrize("outfmt", ["0", "6"])
def test_blastn_site_file_equals_local_output(two_sites, outfmt: str) -> None:
    base, server = two_sites
    compute = base / "compute"
    common = ["search", "blastn", "-query", "q.fasta", "-db", "db/hp", "-outfmt", outfmt, "--quiet"]
    paramedic(*common, "-out", f"local-{outfmt}.out", cwd=compute)
    expected = (compute / f"local-{outfmt}.out").read_bytes()
    assert expected.count(b"\n") > 50  # many hits: the queries come from genomes present several times
    for mode in ("metadata", "compressed", "direct"):
        out = f"blastn/{mode}-{outfmt}.out"
        record = base / f"{mode}-{outfmt}.run.json"
        paramedic(
            *common, "-out", out, "--site", server.url, "--keys", str(base / "keys" / "compute-a"),
            "--ship", mode, "--ship-timeout", "60", "--record", str(record), cwd=compute,
        )  # fmt: skip
        assert (server.root / out).read_bytes() == expected, mode
        ship = json.loads(record.read_text())["ship"]
        assert ship["site_sha256"] == hashlib.sha256(expected).hexdigest()
        if mode == "metadata":
            assert ship["shipped_payload_bytes"] * 10 < len(expected)
