"""The Slurm example, examples/slurm/search.sbatch, under a real Slurm on this machine.

munged, slurmctld and slurmd (Debian's slurm-wlm, `make slurm`) run from a temporary configuration: their
own munge key and socket, free ports, state, spool and log directories under one temporary directory; one
node with 2 CPUs (fewer if the machine has fewer), 4 ranks by --overcommit. The script is submitted with sbatch as a user would, after
changing its two marked lines, with the virtual environment's `paramedic` on PATH (an activated venv).
Its output must be one plain BLAST+ run's bytes and its run record must be there. Then the same script on a
database that does not exist (one line, exit 4, nothing written), and srun without an MPI plugin
(refused, exit 2). Every daemon is stopped and the directory removed.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, blast, paramedic, take_fasta, without_posted_date

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "search.sbatch"
# The BLAST+ options the example passes; the reference run uses the same.
OPTIONS = ("-outfmt", "0", "-evalue", "1e-5")
# 4 ranks (rank 0, one partition: its master and 2 workers) on the node's 2 CPUs; --exclusive gives the
# job both CPUs.
SBATCH_OPTIONS = ("--ntasks=4", "--overcommit", "--exclusive", "--time=10")
# The engine options the example passes: the (partitions, copies of the database, workers write)
ENGINE = "--partition-size 128 --replica-group-size 64 --output-strategy worker-merge"
DAEMONS = ("munged", "slurmctld", "slurmd")
TITLE = "slurm test proteins"


def require_slurm() -> None:
    missing = [d for d in (*DAEMONS, "sbatch", "srun") if shutil.which(d) is None]
    if missing:
        message = f"missing: {', '.join(missing)} (run `make slurm`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if os.getuid() != 0:
        pytest.skip("slurmd runs jobs as root here (SlurmUser=root): run as root")


def free_ports(n: int) -> list[int]:
    """`n` ports free now and below the kernel's ephemeral range: a port the kernel handed out (bind to
    0) was taken by an outgoing connection before slurmd bound it ("Address already in use", seen)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    for port in random.sample(range(min(20000, low // 2), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise AssertionError(f"not {n} free ports below the ephemeral range")


class Cluster:
    """One Slurm controller and one node on this machine, everything under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.logs = root / "log"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The clients' environment: our configuration, none of an enclosing Slurm job's or MPI's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_"))}
        return {**env, "SLURM_CONF": str(self.conf), "PATH": f"{BIN}:{env.get('PATH', '')}"}

    def start(self) -> None:
        for name in ("munge", "state", "spool", "log"):
            (self.root / name).mkdir()
        munge = self.root / "munge"
        munge.chmod(0o755)  # munged: its socket's directory must be searchable by all
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket_path = munge / "socket"
        self._spawn(
            "munged", "munged", "-F", f"--socket={socket_path}", f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
            f"--log-file={self.logs / 'munged.log'}",
        )  # fmt: skip
        self._wait(lambda: socket_path.exists(), "munged's socket")
        controller_port, node_port = free_ports(2)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=paramedic-test",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={controller_port}",
                    f"SlurmdPort={node_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={socket_path}",
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.logs / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "SchedulerType=sched/builtin",
                    "ReturnToService=2",
                    "MailProg=/bin/true",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "KillWait=5",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={min(2, os.cpu_count() or 1)} State=UNKNOWN",
                    f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
                    "",
                ]
            )
        )
        self._spawn("slurmctld", "slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "slurmd", "-D", "-f", str(self.conf), "-N", self.host)
        self._wait(
            lambda: self.slurm("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle",
            "an idle node",
        )

    def _spawn(self, name: str, *command: str) -> None:
        with open(self.logs / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def _wait(self, ready: Callable[[], bool], what: str, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited {proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {seconds} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.logs.iterdir())
        )

    def slurm(
        self, *command: str, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(command, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        line = self.slurm("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def run_batch(self, script: Path, cwd: Path, seconds: float = 120) -> dict[str, str]:
        """sbatch the script from `cwd` and wait for the job to end: its scontrol fields."""
        job_id = self.slurm("sbatch", "--parsable", *SBATCH_OPTIONS, str(script), cwd=cwd).stdout.strip()
        deadline = time.monotonic() + seconds
        while (info := self.job(job_id))["JobState"] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                self.slurm("scancel", job_id, check=False)
                raise AssertionError(
                    f"job {job_id} still {info['JobState']} after {seconds} s:\n{self.log_tail()}"
                )
            time.sleep(0.3)
        return info

    def stop(self) -> None:
        """Cancel what is left, wait for the job steps to end, then stop each daemon we started."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            jobs = self.slurm("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.slurm("scancel", *jobs, check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                self.slurm("squeue", "-h", "-o", "%i", check=False).stdout.strip()
                or any(p.is_socket() for p in (self.root / "spool").iterdir())  # a slurmstepd's socket
            ):
                time.sleep(0.3)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="pm-slurm-", dir="/tmp"))  # short: munge's socket path
    root.chmod(0o755)
    running = Cluster(root)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def data(cluster: Cluster, data_dir: Path) -> Path:
    """A paramedic database (3 fragments), a BLAST+ reference database of the same proteins, 30 queries."""
    root = cluster.root / "data"
    (root / "ref").mkdir(parents=True)
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta", 2000)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "q.fasta", 30)
    blast("makeblastdb", "-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-out", "proteins",
          "-title", TITLE, cwd=root / "ref")  # fmt: skip
    paramedic("format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "3", "--out", "p/proteins",
              "--title", TITLE, "--quiet", cwd=root)  # fmt: skip
    return root


def adapt(db: Path, query: Path, dest: Path) -> Path:
    """The user's two changes: the lines marked CHANGE."""
    text, changed = re.subn(r"^DB=\S+(\s+# CHANGE)", rf"DB={db}\1", SCRIPT.read_text(), flags=re.M)
    text, changed_query = re.subn(r"^QUERY=\S+(\s+# CHANGE)", rf"QUERY={query}\1", text, flags=re.M)
    assert changed == changed_query == 1 and text.count("# CHANGE") == 2, "the example's two lines moved"
    dest.write_text(text)
    return dest


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("paramedic: error:")]


def test_example_script_gives_blast_output_and_run_record(cluster: Cluster, data: Path) -> None:
    assert " ".join(OPTIONS) in SCRIPT.read_text() and f"ENGINE=({ENGINE})" in SCRIPT.read_text()
    run = cluster.root / "run"
    run.mkdir()
    script = adapt(data / "p" / "proteins", data / "q.fasta", run / "search.sbatch")
    started = time.monotonic()
    info = cluster.run_batch(script, cwd=run)
    job = info["JobId"]
    log = (run / f"paramedic-{job}.log").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert not error_lines(log) and "Traceback" not in log, log

    out = run / "hits.txt"
    blast("blastp", "-query", "../q.fasta", "-db", "proteins", *OPTIONS, "-out", "ref.txt", cwd=data / "ref")
    expected = without_posted_date((data / "ref" / "ref.txt").read_bytes(), "0")
    assert without_posted_date(out.read_bytes(), "0") == expected, "differs from BLAST+"

    record = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert (record["ranks"], record["workers"], record["queries"]) == (4, 2, 30)
    assert record["output"] == str(out) and record["output_bytes"] == out.stat().st_size
    roles = [r["role"] for r in record["ranks_stats"]]
    assert roles == ["supermaster", "partition master", "worker", "worker"]
    assert (record["partitions"], record["output_strategy"]) == (1, "worker-merge")
    assert all(r["seconds"]["write"] > 0 for r in record["ranks_stats"][2:])  # the workers wrote
    assert sum(r["tasks"]["search"] for r in record["ranks_stats"]) >= 1
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["search.sbatch", f"paramedic-{job}.log", out.name, f"{out.name}.run.json"]
    )  # no journal, no partial file
    print(f"slurm job {job}: {time.monotonic() - started:.1f} s from sbatch to the end")


def test_example_script_on_missing_database_says_why(cluster: Cluster, data: Path) -> None:
    run = cluster.root / "run-missing"
    run.mkdir()
    script = adapt(data / "p" / "nothing-here", data / "q.fasta", run / "search.sbatch")
    info = cluster.run_batch(script, cwd=run)
    log = (run / f"paramedic-{info['JobId']}.log").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "4:0"), log
    assert len(error_lines(log)) == 1 and "not found" in error_lines(log)[0], log
    assert "Traceback" not in log
    assert [p.name for p in run.iterdir() if p.name.startswith(("hits", ".hits"))] == [], "output left behind"


def test_srun_without_mpi_plugin_is_refused(cluster: Cluster, data: Path) -> None:
    """srun's default here (MpiDefault=none) gives no PMI: each task would start an mpiexec of its own
    that waits for CPUs the step holds. paramedic refuses it with one line."""
    run = cluster.root / "run-nompi"
    run.mkdir()
    proc = cluster.slurm(
        "srun", "--mpi=none", "--ntasks=3", "--overcommit",
        "paramedic", "search", "blastp", "-query", str(data / "q.fasta"), "-db", str(data / "p" / "proteins"),
        "-out", "hits.txt",
        cwd=run, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "srun --mpi=pmi2" in proc.stderr, proc.stderr
    assert list(run.iterdir()) == []
