"""The local runner (paramedic.engine.runtime.local): started without an MPI launcher, the workers are threads of
one process, each driving real BLAST+ runs. Its output equals MPI's and BLAST+'s; an interrupt, a
SIGTERM or a failed BLAST+ run ends it with one line and a documented code, with no BLAST+ run left and
nothing left in $TMPDIR (real BLAST+, real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import blast, paramedic
from tests.integration.test_faults_compute import (
    alive,
    check_journal,
    children,
    left_behind,
    start_long_search,
)
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("local")
    databases.place(root, 2000, fragments=4, out="dbs/db")
    databases.queries(root / "q.fasta", 30)
    databases.queries(root / "q100.fasta", 100)
    blast("makeblastdb", "-in", "db.fasta", "-dbtype", "prot", "-parse_seqids", "-out", "ref/db", cwd=root)
    return root


def descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        out = subprocess.run(["pgrep", "-P", str(stack.pop())], capture_output=True, text=True).stdout
        kids = [int(x) for x in out.split()]
        found += kids
        stack += kids
    return found


@pytest.mark.parametrize("strategy", ["fragments", "queries"])
def test_threads_write_blasts_bytes_and_say_so(site: Path, tmp_path: Path, strategy: str) -> None:
    args = ["-query", str(site / "q.fasta"), "-outfmt", "6", "-evalue", "1e-5"]
    blast("blastp", *args, "-db", str(site / "ref/db"), "-out", str(tmp_path / "ref.tsv"), cwd=tmp_path)
    for runner in ("local", "mpi"):
        out = tmp_path / f"{runner}.tsv"
        paramedic(
            "search", "blastp", *args, "-db", str(site / "dbs/db"), "-out", str(out), "--np", "3",
            "--strategy", strategy, "--runner", runner, "--quiet", "--batch", "5",
        )  # fmt: skip
        assert out.read_bytes() == (tmp_path / "ref.tsv").read_bytes(), runner
        record = json.loads(Path(f"{out}.run.json").read_text())
        assert record["runner"] == runner and record["ranks"] == 4 and record["workers"] == 3
        workers = [r for r in record["ranks_stats"] if r["role"] == "worker"]
        assert len(workers) == 3
        searches = sum(r["tasks"]["search"] for r in workers)  # every task ran once, on some worker
        per_batch = record["fragment_groups"] or record["fragments"]  # fragments searched alone or in groups
        assert searches == (record["batches"] * per_batch if strategy == "fragments" else record["pieces"])
        if runner == "local":  # the memory rule counted the threads, not MPI's ranks
            reason = record["strategy_reason"]
            assert reason is None or "3 worker threads of one process" in json.dumps(reason)


def test_options_that_need_mpi_ranks_are_refused_with_runner_local(site: Path, tmp_path: Path) -> None:
    proc = paramedic(
        "search", "blastp", "-query", str(site / "q.fasta"), "-db", str(site / "dbs/db"), "-out", "o.tsv",
        "--runner", "local", "--partition-size", "2", cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--partition-size needs MPI ranks" in proc.stderr
    assert not (tmp_path / "o.tsv").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_local_job_stops_its_blast_runs_and_leaves_nothing(
    site: Path, tmp_path: Path, signum: int
) -> None:
    proc, out = start_long_search(site, tmp_path, runner="local", settle=0.0)
    runs = descendants(proc.pid)
    assert runs, "no BLAST+ run under the launcher: nothing to check"
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stdout == b""
    lines = stderr.decode().strip().splitlines()
    assert lines[0].startswith("paramedic: interrupted"), stderr
    check_journal(tmp_path, out, lines[1:])
    assert len(lines) <= 2, stderr
    assert not out.exists()
    assert left_behind(tmp_path, tmp_path / "tmp") == []
    assert not [pid for pid in runs if alive(pid)]  # no BLAST+ outlives the job


def test_a_killed_blast_run_ends_the_local_job_with_one_line(site: Path, tmp_path: Path) -> None:
    proc, out = start_long_search(site, tmp_path, runner="local")
    deadline = time.monotonic() + 30
    while True:  # a BLAST+ run forked by a worker thread's fork server (runs come and go: retry)
        servers = [p for p in children(proc.pid) if _command(p) == "blastp"]
        runs = [r for s in servers for r in children(s)]
        try:
            os.kill(runs[0], signal.SIGKILL)
            break
        except (IndexError, ProcessLookupError):
            assert proc.poll() is None and time.monotonic() < deadline, "no BLAST+ run to kill"
            time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=60)
    lines = stderr.decode().strip().splitlines()
    assert proc.returncode == 5, stderr
    assert lines[0].startswith("paramedic: error: blastp failed (exit 137)"), stderr
    check_journal(tmp_path, out, lines[1:])
    assert len(lines) <= 2, stderr
    assert not out.exists() and stdout == b""
    assert left_behind(tmp_path, tmp_path / "tmp") == []
    assert not [pid for pid in servers if alive(pid)]  # the other thread's BLAST+ was stopped too


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
