"""Output strategies (issue 13 item 2): every `--output-strategy` writes BLAST+'s bytes, the same as
`master`, with real mpiexec ranks (3 ranks, and 4 ranks on 2 cores), several output formats, pieces
small enough that every worker writes several and (with a small PARAMEDIC_OUTPUT_BUFFER) worker-collective
runs rounds during the search and worker-merge gathers many segments; a failing or killed run leaves no
partial file; the refusals are one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic, take_fasta, without_posted_date
from tests.integration.equality import Site

pytestmark = pytest.mark.integration

WORKERS = ["worker-individual", "worker-collective", "worker-merge"]
# Small search batches and one query per piece: many pieces on every worker
ENGINE = ["--strategy", "fragments", "--batch", "4", "--regen-batch", "1", "--quiet", "--no-journal"]


@pytest.fixture(scope="module")
def site(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """BLAST+ batches blastp's queries by 10,000 residues and report pieces start only where a batch
    does; BLAST+'s BATCH_SIZE (which paramedic models too) makes batches small, so that a few queries
    give many pieces. Set for BLAST+'s reference runs and paramedic's alike, for this module only."""
    before = os.environ.get("BATCH_SIZE")
    os.environ["BATCH_SIZE"] = "800"
    try:
        root = tmp_path_factory.mktemp("outputs")
        take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "queries.fasta", 24)
        take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta", 3000)
        site = Site(root, "blastp", "uniprot", "prot", "mmseqs2-examples DB", {})
        site.build(root / "db.fasta", fragment_counts=(3,))
        yield site
    finally:
        if before is None:
            os.environ.pop("BATCH_SIZE", None)
        else:
            os.environ["BATCH_SIZE"] = before


def search(site: Site, strategy: str, outfmt: str, np: int = 2, env: dict[str, str] | None = None) -> Path:
    out = site.root / f"{strategy}-np{np}-{outfmt}.out"
    paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", site.db, "-outfmt", outfmt,
        "-evalue", "1e-5", "-out", str(out), "--np", str(np), "--output-strategy", strategy, *ENGINE,
        "--runner", "mpi", cwd=site.root / "p3", env=env,  # master too: rank 0's received bytes compared
    )  # fmt: skip
    assert not [p.name for p in out.parent.iterdir() if ".partial" in p.name]
    return out


_MASTERS: dict[tuple[Path, str], Path] = {}


def master_search(site: Site, outfmt: str) -> Path:
    """`search(site, "master", outfmt)`, run once per site and format: the same command on the same files
    writes the same bytes, so the partition tests compare with the run the strategy matrix made (and
    checked against BLAST+) instead of repeating it. Nothing writes to that file afterwards."""
    key = (site.root, outfmt)
    if key not in _MASTERS or not _MASTERS[key].exists():
        _MASTERS[key] = search(site, "master", outfmt)
    return _MASTERS[key]


def expected(site: Site, outfmt: str) -> bytes:
    return without_posted_date(site.reference(None, outfmt, "-evalue", "1e-5"), outfmt)


def written_by_workers(out: Path) -> None:
    """The workers wrote: rank 0 received none of the report's bytes, every worker spent time writing."""
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["output_bytes"] == out.stat().st_size
    assert record["output_strategy"] != "master" and out.name.startswith(record["output_strategy"])
    ranks = record["ranks_stats"]
    assert all(r["seconds"]["write"] > 0 for r in ranks[1:]), ranks
    assert record["pieces"] >= 6
    # what rank 0 received: the searches' merge keys and the pieces' sizes; the report's bytes went to
    # rank 0 under master, as the same run's record says
    master = json.loads(_master_record(out).read_text())
    assert (
        master["ranks_stats"][0]["received_bytes"] - ranks[0]["received_bytes"] > 0.8 * master["output_bytes"]
    )


def _master_record(out: Path) -> Path:
    strategy = next(s for s in WORKERS if out.name.startswith(s))
    master = out.with_name(out.name.replace(strategy, "master", 1))
    if not master.exists():
        raise AssertionError(f"no master run beside {out.name}")
    return master.with_name(master.name + ".run.json")


# every format with several strategies, every strategy with several formats (the whole matrix is slow)
MATRIX = {
    "0": WORKERS,
    "5": ["worker-collective", "worker-merge"],
    "6": ["worker-individual"],
    "7": ["worker-merge"],
    "15": ["worker-individual", "worker-collective"],
}


@pytest.mark.parametrize("outfmt", list(MATRIX))
def test_every_strategy_writes_blast_bytes(site: Site, outfmt: str) -> None:
    master = master_search(site, outfmt)
    assert without_posted_date(master.read_bytes(), outfmt) == expected(site, outfmt)
    # a third of the output: rounds during the search, segments of a few pieces from several workers
    bound = str(max(1, master.stat().st_size // 3))
    for strategy in MATRIX[outfmt]:
        out = search(site, strategy, outfmt, env={"PARAMEDIC_OUTPUT_BUFFER": bound})
        assert out.read_bytes() == master.read_bytes(), f"{strategy}, outfmt {outfmt}"
        written_by_workers(out)


@pytest.mark.parametrize("strategy", WORKERS)
def test_more_ranks_than_cores(site: Site, strategy: str) -> None:
    """4 ranks on 2 cores, default bounds (one round at the end, one segment)."""
    out = search(site, strategy, "7", np=3)
    assert out.read_bytes() == expected(site, "7")


@pytest.mark.parametrize("strategy", WORKERS)
def test_partitions_workers_write(site: Site, strategy: str) -> None:
    """The issue's combination: partitions under a supermaster, the workers writing the file. 7 ranks: rank 0 and
    two partitions of a master and two workers (rank 0 places the pieces, the partition masters relay),
    and a small buffer: worker-collective runs rounds across the partitions during the search, and
    worker-merge's segments gather pieces of workers in both partitions."""
    out = site.root / f"{strategy}-partitions.out"
    master = master_search(site, "0")
    bound = str(max(1, master.stat().st_size // 4))
    paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", site.db, "-outfmt", "0",
        "-evalue", "1e-5", "-out", str(out), "--np", "6", "--partition-size", "3", "--output-strategy",
        strategy, *ENGINE, cwd=site.root / "p3", env={"PARAMEDIC_OUTPUT_BUFFER": bound},
    )  # fmt: skip
    assert out.read_bytes() == master.read_bytes()
    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["partitions"] == 2 and record["output_strategy"] == strategy
    ranks = record["ranks_stats"]
    workers = [r for r in ranks if r["role"] == "worker"]
    assert len(workers) == 4 and all(r["seconds"]["write"] > 0 for r in workers), ranks
    # every worker wrote pieces: both partitions searched and wrote
    assert all(r["tasks"]["regenerate"] + r["tasks"]["rendered"] > 0 for r in workers), ranks
    # rank 0 received sizes, not the report
    assert ranks[0]["received_bytes"] < master.stat().st_size
    writes = record["output_writes"]
    if strategy == "worker-collective":
        assert writes["rounds"] >= 2, writes  # at least one during the search, and the last
    if strategy == "worker-merge":
        assert writes["gathered"] >= 1 and writes["segments"] >= 2, writes


def test_one_rank_writes_alone(site: Site) -> None:
    """Under `mpiexec -n 1` rank 0 does every task and writes the file itself."""
    out = site.root / "one-rank.out"
    proc = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "1", str(BIN / "paramedic"), "search", "blastp", "-query",
         str(site.root / "queries.fasta"), "-db", site.db, "-outfmt", "6", "-evalue", "1e-5", "-out", str(out),
         "--output-strategy", "worker-collective", *ENGINE],
        cwd=site.root / "p3", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == expected(site, "6")


def test_failing_run_leaves_no_partial_file(site: Site, tmp_path: Path) -> None:
    """A worker's BLAST+ fails writing a piece (the whole-database volume is cut short) under our own
    mpiexec: rank 0 ends the job, and the file the ranks had opened is gone."""
    db = tmp_path / "db"
    subprocess.run(["cp", "-r", str(site.root / "p3" / site.db), str(tmp_path / site.db)], check=True)
    subprocess.run(["cp", str(site.root / "p3" / f"{site.db}.pal"), str(tmp_path / "db.pal")], check=True)
    volumes = list((tmp_path / site.db).glob("*.psq"))
    assert len(volumes) == 1  # the case: the database's sequences cut short (its index intact)
    for volume in volumes:
        os.truncate(volume, volume.stat().st_size // 3)
    for strategy in WORKERS:
        out = tmp_path / f"{strategy}.out"
        proc = subprocess.run(
            [str(BIN / "mpiexec"), "-n", "3", str(BIN / "paramedic"), "search", "blastp", "-query",
             str(site.root / "queries.fasta"), "-db", str(db), "-out", str(out), "--output-strategy",
             strategy, *ENGINE],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode != 0, proc.stderr
        assert "paramedic: error:" in proc.stderr and "Traceback" not in proc.stderr
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == []


@pytest.mark.alone  # removes the MPICH segments /dev/shm gained meanwhile
def test_full_output_disk_leaves_no_partial_file(site: Site, tmp_path: Path) -> None:
    """The output's filesystem fills while the workers write (a 64 KiB tmpfs): exit 6, no partial file
    left filling the disk, and one line that says why. Under our own mpiexec no launcher cleans up after
    the job, and a worker whose MPI-IO write fails ends it (MPI_Abort), which kills rank 0 before it can
    remove the file: the failing rank removes it. The reason is the innermost line of MPI's error stack
    (No space left on device), not its first ("Other I/O error , error stack:"): said alone by the
    launcher; under our own mpiexec each rank whose collective write failed says the same line (MPICH
    forwards them interleaved, or drops them when the abort outruns its forwarding: checked when said)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    query = ["search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", site.db]
    # the ranks MPI_Abort kills keep their temporary directories (no launcher there to remove them):
    # in this test's own directory, not the machine's /tmp
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    shared_before = set(os.listdir("/dev/shm"))  # and their MPICH shared-memory segments: removed below
    try:
        for strategy, ranks in [
            ("worker-individual", "3"),
            ("worker-collective", "4"),
            ("worker-merge", "3"),
        ]:
            out = disk / f"{strategy}.out"
            proc = subprocess.run(
                [str(BIN / "mpiexec"), "-n", ranks, str(BIN / "paramedic"), *query, "-out", str(out),
                 "--output-strategy", strategy, *ENGINE],
                cwd=site.root / "p3", capture_output=True, text=True, timeout=300, env=env,
            )  # fmt: skip
            assert proc.returncode == 6, (strategy, proc.stderr)
            said = [line for line in proc.stderr.splitlines() if "paramedic:" in line]
            assert all("No space left on device" in line for line in said), proc.stderr
            assert "error stack" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert sorted(p.name for p in disk.iterdir()) == [], strategy
        out = disk / "launched.out"
        proc = paramedic(
            *query, "-out", str(out), "--np", "2", "--output-strategy", "worker-individual", *ENGINE,
            "--runner", "mpi", cwd=site.root / "p3", check=False,
        )  # fmt: skip
        assert proc.returncode == 6, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], proc.stderr
        assert sorted(p.name for p in disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)])
        for name in set(os.listdir("/dev/shm")) - shared_before:
            if name.startswith("mpich"):
                Path("/dev/shm", name).unlink(missing_ok=True)


def test_killed_worker_leaves_no_partial_file(site: Site, tmp_path: Path) -> None:
    """SIGKILL of a worker rank once the ranks have opened the file: the launcher removes it."""
    queries = take_fasta(site.root / "db.fasta", tmp_path / "q.fasta", 200)
    out = tmp_path / "hits.txt"
    proc = subprocess.Popen(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(queries), "-db", site.db, "-out", str(out),
         "--np", "2", "--output-strategy", "worker-individual", *ENGINE],
        cwd=site.root / "p3", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not [p for p in tmp_path.iterdir() if ".partial" in p.name]:
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never opened the file"
        time.sleep(0.05)
    (mpiexec,) = _children(proc.pid)
    ranks = _children(_children(mpiexec)[0])
    assert len(ranks) == 3
    os.kill(ranks[-1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 7, stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if ".partial" in p.name] == []


def _children(pid: int) -> list[int]:
    listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in listed.split()]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["-out", "-"], "standard output"),
        ([], "standard output"),
        (["-out", "x.txt", "--site", "file:///tmp/inbox"], "--site"),
        (["-out", "x.txt", "--output-strategy", "worker-everything"], "invalid choice"),
    ],
)
def test_refusals(site: Site, extra: list[str], says: str) -> None:
    args = ["--output-strategy", "worker-merge", *extra] if "--output-strategy" not in extra else extra
    proc = paramedic(
        "search", "blastp", "-query", str(site.root / "queries.fasta"), "-db", site.db, *args, "--quiet",
        cwd=site.root / "p3", check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
