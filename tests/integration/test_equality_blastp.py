"""paramedic search == one BLAST+ run on the unsplit database (blastp, real data, real MPI ranks).

72 mmseqs2-examples queries against its 20,000 UniProt proteins formatted into 4 and 7 fragments, for
outfmt 6, 7, 0 and 5, with the default -max_target_seqs and with 10. (100 queries took 9 of `make test`'s 22
minutes and reached no case that 72 do not; each test asserts the case it exists for.) The reference database is built
independently with makeblastdb; the only normalised bytes are the text reports' "Posted date" line (the
build time of two different databases). With -max_target_seqs 10 most queries fill their hit lists: the
engine then searches them again against their whole preliminary list, and the output must still be equal.

Each (fragments, cap) pair is searched once directly and regenerated for the other formats (equality.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic, take_fasta
from tests.integration.equality import Site

pytestmark = pytest.mark.integration

FORMATS = ["6", "7", "0", "5"]
MAX_TARGET = [None, "10"]
# 32,920 residues: four of BLAST+'s own query batches (paramedic.blast.prelim), which the partition and query
# segmentation tests need (64 queries are three)
QUERIES = 72
LEGACY = "legacy4"  # the same database in 4 fragments, in the layout of earlier versions (--layout fragments)


@pytest.fixture(scope="module")
def site(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("blastp")
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "queries.fasta", QUERIES)
    direct = {(4, None): "0", (4, "10"): "5", (7, None): "7", (7, "10"): "6"}
    site = Site(root, "blastp", "uniprot", "prot", "mmseqs2-examples DB", direct)
    site.build(data_dir / "mmseqs2" / "DB.fasta")
    return site


@pytest.mark.parametrize("outfmt", FORMATS)
@pytest.mark.parametrize("max_target", MAX_TARGET, ids=["default", "mts10"])
@pytest.mark.parametrize("fragments", [4, 7])
def test_blastp_matches_blast(site: Site, fragments: int, max_target: str | None, outfmt: str) -> None:
    out = site.search(fragments, max_target, outfmt)
    site.assert_matches(out, max_target, outfmt)
    if max_target and site.direct[(fragments, max_target)] == outfmt:
        record = json.loads(out.with_name(out.name + ".run.json").read_text())
        # the case the cap exists for: queries whose 10-subject lists filled, searched again
        assert record["searched_again"] >= QUERIES // 2, record["searched_again"]


def test_blastp_query_segmentation_with_shrinking_pieces_matches_blast(site: Site) -> None:
    """--strategy queries with its own plan: pieces shrink (factoring), the report is still BLAST+'s."""
    out = site.root / "queries-0.out"
    paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", "0",
        "-out", str(out), "--np", "2", "--strategy", "queries", "--quiet", cwd=site.root / "p4",
    )  # fmt: skip
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["strategy"] == "queries" and record["pieces"] >= 4
    assert record["search_batch_queries"] > QUERIES / record["pieces"]  # the first piece is the largest
    site.assert_matches(out, None, "0")


def _hidden_store_search(site: Site, out: Path, tmp: Path) -> None:
    """`mpiexec` with rank 0 as usual and two worker ranks that cannot see rank 0's temporary directory
    (each in a mount namespace of its own with an empty tmpfs over it), as on a cluster whose nodes each
    have their own /tmp."""
    args = [
        str(BIN / "paramedic"), "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot",
        "-outfmt", "0", "-out", str(out), "--strategy", "fragments", "--no-journal", "--quiet",
    ]  # fmt: skip
    hide = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"',
    ]
    proc = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "1", "-env", "TMPDIR", str(tmp), *args,
         ":", "-n", "2", "-env", "TMPDIR", str(tmp), *hide, str(tmp), *args],
        cwd=site.root / LEGACY, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_alignments_stay_with_the_workers_unless_a_worker_cannot_see_the_store(
    site: Site, data_dir: Path, tmp_path: Path
) -> None:
    """Issue 12 item 4: a fragment search's alignments stay in the search store (the journal's, or one in
    rank 0's temporary directory) and rank 0 receives keys only; when a worker cannot see the store they
    travel through rank 0 as before. The three runs write BLAST+'s report."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("hiding rank 0's temporary directory from the workers needs root and unshare")
    # reports are written from alignments where each subject's Seq-id is at hand: the layout of earlier
    # versions keeps a table of them (a database in place regenerates its reports by search)
    paramedic(
        "format", "--in", str(data_dir / "mmseqs2" / "DB.fasta"), "--dbtype", "prot", "--fragments", "4",
        "--out", str(site.root / LEGACY / site.db), "--title", site.title, "--layout", "fragments", "--quiet",
    )  # fmt: skip
    runs = {}
    for name, flags in (("journal", []), ("scratch", ["--no-journal"])):
        out = site.root / f"store-{name}.out"
        paramedic(
            "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", "0",
            "-out", str(out), "--np", "2", "--strategy", "fragments", "--quiet", *flags, cwd=site.root / LEGACY,
        )  # fmt: skip
        runs[name] = out
    tmp = tmp_path / "rank0-tmp"
    tmp.mkdir()
    runs["hidden"] = site.root / "store-hidden.out"
    _hidden_store_search(site, runs["hidden"], tmp)
    assert not any(tmp.iterdir())  # rank 0's temporary directory, store included, is gone
    received = {}
    for name, out in runs.items():
        site.assert_matches(out, None, "0")
        record = json.loads(out.with_name(out.name + ".run.json").read_text())
        tasks = [rank["tasks"] for rank in record["ranks_stats"]]
        # the case this test exists for: reports written from the searches' alignments, none by search
        assert sum(t["rendered"] for t in tasks) == record["pieces"] >= 2
        assert record["alignments"] == ("tasks" if name == "hidden" else "store"), name
        received[name] = record["ranks_stats"][0]["received_bytes"]
    # rank 0 received the reports and the keys; with the alignments as well, several times more
    assert 2 * max(received["journal"], received["scratch"]) < received["hidden"], received


@pytest.mark.parametrize("strategy", ["fragments", "queries"])
def test_partitions_write_blast_output(site: Site, strategy: str) -> None:
    """Issue 13: rank 0 hands query segments to 2 partition masters with their own workers (5 ranks on 2
    cores); both partitions work, and the report is still BLAST+'s, in every format's stitching."""
    for outfmt in ("0", "7"):
        out = site.root / f"partitions-{strategy}-{outfmt}.out"
        paramedic(
            "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", "uniprot", "-outfmt", outfmt,
            "-out", str(out), "--np", "4", "--partition-size", "2", "--batch", "20", "--strategy", strategy,
            "--quiet", cwd=site.root / "p4",
        )  # fmt: skip
        site.assert_matches(out, None, outfmt)
        record = json.loads(out.with_name(out.name + ".run.json").read_text())
        assert record["partitions"] == 2 and record["batches"] >= 4
        workers = [rank for rank in record["ranks_stats"] if rank["role"] == "worker"]
        # the case this test exists for: both partitions got segments
        assert len(workers) == 2 and all(w["tasks"]["search"] > 0 for w in workers), workers


def test_partitions_refuse_what_they_cannot_do(site: Site) -> None:
    common = [
        "search",
        "blastp",
        "-query",
        str(site.root / "queries.fasta"),
        "-db",
        "uniprot",
        "-outfmt",
        "6",
    ]
    proc = paramedic(*common, "-out", str(site.root / "x.out"), "--np", "1", "--partition-size", "3",
                     "--quiet", cwd=site.root / "p4", check=False)  # fmt: skip
    assert proc.returncode == 2 and "too few for partitions" in proc.stderr, proc.stderr
    assert not (site.root / "x.out").exists()
    proc = paramedic(*common, "-out", str(site.root / "x.out"), "--partition-size", "1", cwd=site.root / "p4",
                     check=False)  # fmt: skip
    assert proc.returncode == 2 and "--partition-size must be at least 2" in proc.stderr
