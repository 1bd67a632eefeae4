"""`paramedic trace` and `paramedic ship` stopped by a signal (issue 41, item 8): real mpiexec ranks of a
real MPI program (examples/trace/random_comm.c), real signals, a real `paramedic serve` over real TLS.

Stopped with SIGTERM, SIGHUP or SIGINT, `trace` ends its traced job (mpiexec and every rank), removes the
rank logs and what MPI made in /dev/shm and in the temporary directory, says one line and exits 130.
Killed outright (SIGKILL), it cannot; its mpiexec dies with it, and the next `paramedic trace` removes what
is left. `ship` stopped by SIGTERM cancels the job it opened at the site."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.integration.test_trace import OMPI_ENV, RANDOM_COMM, need
from tests.support.processes import alive
from tests.support.site import CuttingProxy, StorageSite

pytestmark = pytest.mark.integration

FLAVOURS = {
    "openmpi": ("mpicc.openmpi", "mpiexec.openmpi"),
    "mpich": (str(BIN / "mpicc"), str(BIN / "mpiexec")),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """random_comm built against each MPI."""
    base = tmp_path_factory.mktemp("signals")
    built = {}
    for flavour, (mpicc, mpiexec) in FLAVOURS.items():
        need(mpicc, mpiexec)
        built[flavour] = base / f"random_comm-{flavour}"
        subprocess.run([mpicc, "-O2", "-o", str(built[flavour]), str(RANDOM_COMM)], check=True)
    return built


def started(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def survivors(processes: dict[int, str | None]) -> list[str]:
    """The processes (pid: start time) still alive, by their command lines (a pid reused is another)."""
    left = [pid for pid, start in processes.items() if alive(pid) and started(pid) == start]
    return [f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()!r}" for pid in left]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (mpiexec, hydra's proxies, the ranks)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    found = [int(x) for x in out.split()]
    return found + [d for child in found for d in descendants(child)]


def mapped_shm(pids: list[int]) -> set[Path]:
    found = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            path = line.split(maxsplit=5)[-1]
            if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                found.add(Path(path))
    return found


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell's `cmd &` starts us with SIGINT ignored


class Traced:
    """A long `paramedic trace` of random_comm on 2 ranks, in `cwd`, with a temporary directory of its
    own; `running()` returns once every rank is out of MPI_Init and has written part of its log."""

    def __init__(self, cwd: Path, program: Path, flavour: str, steps: int = 10**9):
        self.cwd = cwd
        self.tmp = cwd / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.run = cwd / "run"
        self.run.mkdir(exist_ok=True)
        self.env = {**os.environ, **OMPI_ENV, "TMPDIR": str(self.tmp)}
        mpiexec = FLAVOURS[flavour][1]
        self.proc = subprocess.Popen(
            [str(BIN / "paramedic"), "trace", "-out", str(self.run / "run.clog2"), "--buffer", "65536", "--",
             mpiexec, "-n", "2", str(program), str(steps), "5"],
            cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_interruptible,
        )  # fmt: skip
        self.pids: dict[int, str | None] = {}
        self.segments: set[Path] = set()

    def running(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the traced ranks did not start"
            self.pids = {pid: started(pid) for pid in descendants(self.proc.pid)}
            self.segments = mapped_shm(list(self.pids))
            logs = [p for p in self.run.iterdir() if ".ranks-" in p.name]
            if self.segments and logs and any(f.name.startswith("rank-") for f in logs[0].iterdir()):
                return
            time.sleep(0.05)

    def left_behind(self) -> list[str]:
        """What the run left in its directory and its temporary directory."""
        return sorted(p.name for p in self.run.iterdir()) + sorted(p.name for p in self.tmp.iterdir())

    def end(self) -> None:
        for pid, start in [(self.proc.pid, None), *self.pids.items()]:
            if alive(pid) and start in (None, started(pid)):
                os.kill(pid, signal.SIGKILL)
        self.proc.communicate()


@pytest.fixture
def traced(tmp_path: Path, programs: dict[str, Path]) -> Iterator[list[Traced]]:
    """The runs a test started, ended (every process of them killed) at its teardown whatever happened."""
    runs: list[Traced] = []
    yield runs
    for run in runs:
        run.end()


def new_segments(before: set[Path]) -> list[Path]:
    """Files that arrived in /dev/shm since `before`, that no live process maps and that are still there
    two seconds on: left behind. (`make test` runs this file's tests alone; run beside others, another
    test's MPI job maps its own segment, and removes it as it ends.)"""
    deadline = time.monotonic() + 2
    while True:
        mapped = mapped_shm([int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()])
        left = sorted(set(Path("/dev/shm").iterdir()) - before - mapped)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def new_hydra_files(before: set[str]) -> set[str]:
    """hydra's topology files that arrived since `before` and are still there two seconds on, while no
    other hydra runs (a running hydra keeps its own until it ends)."""
    deadline = time.monotonic() + 2
    while (left := hydra_files() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return set() if hydra_running() else left


def hydra_running() -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() in (
                "mpiexec",
                "hydra_pmi_proxy",
            ):
                return True
        except OSError:
            continue
    return False


def hydra_files() -> set[str]:
    return {p.name for p in Path("/tmp").iterdir() if p.name.startswith("hydra_hwloc_xmlfile_")}


@pytest.mark.alone  # looks at all of /dev/shm and /tmp's hydra files before and after
@pytest.mark.parametrize(
    "flavour,signum",
    [
        ("openmpi", signal.SIGTERM),
        ("openmpi", signal.SIGHUP),
        ("openmpi", signal.SIGINT),
        ("mpich", signal.SIGTERM),
    ],
)
def test_a_stopped_trace_ends_its_job_and_leaves_nothing(
    tmp_path: Path, programs: dict[str, Path], traced: list[Traced], flavour: str, signum: int
) -> None:
    """Found by the attacker's probe (issue 41, item 8): SIGTERM of `paramedic trace` killed the launcher
    alone (exit -15, no message); mpiexec and the ranks ran on, writing their logs (289 MB seen), and
    their /dev/shm segments stayed."""
    shm, hydra = set(Path("/dev/shm").iterdir()), hydra_files()
    run = Traced(tmp_path, programs[flavour], flavour)
    traced.append(run)
    run.running()
    started = time.monotonic()
    run.proc.send_signal(signum)
    stdout, stderr = run.proc.communicate(timeout=60)
    took = time.monotonic() - started
    lines = stderr.decode().strip().splitlines()
    assert run.proc.returncode == 130, stderr
    assert len(lines) == 1 and lines[0].startswith("paramedic: interrupted"), stderr
    assert took < 15, took
    assert survivors(run.pids) == []
    assert sorted(s for s in run.segments if s.exists()) == []
    assert run.left_behind() == []  # no rank logs, no trace, nothing in the temporary directory
    assert new_segments(shm) == []
    if flavour == "mpich":  # hydra's mpiexec writes one as it starts
        assert new_hydra_files(hydra) == set()


@pytest.mark.alone  # looks at all of /dev/shm before and after
def test_a_killed_trace_is_swept_by_the_next_one(
    tmp_path: Path, programs: dict[str, Path], traced: list[Traced]
) -> None:
    """SIGKILL of the launcher: its mpiexec dies with it (and the ranks with mpiexec), and the next
    `paramedic trace` removes the rank logs and the segments the killed one left. Before: mpiexec and
    the ranks ran on, and nothing removed their logs or segments."""
    shm = set(Path("/dev/shm").iterdir())
    first = Traced(tmp_path / "first", programs["openmpi"], "openmpi")
    traced.append(first)
    first.running()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while survivors(first.pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors(first.pids) == [], "the traced job outlived its launcher"

    second = tmp_path / "second"
    second.mkdir()
    proc = paramedic(
        "trace", "-out", str(second / "short.clog2"), "--",
        "mpiexec.openmpi", "-n", "2", str(programs["openmpi"]), "20", "5",
        cwd=second, env={**OMPI_ENV, "TMPDIR": str(first.tmp)},
    )  # fmt: skip
    assert "trace written" in proc.stderr
    assert sorted(s for s in first.segments if s.exists()) == []
    assert first.left_behind() == []
    assert new_segments(shm) == []


class SlowUplink(CuttingProxy):
    """A link whose compute-to-site direction carries `rate` bytes a second per connection (a WAN): a
    shipment stays in flight for seconds, its job open at the site."""

    def __init__(self, target: int, rate: float):
        super().__init__(target)
        self.rate = rate

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, ...], up: bool
    ) -> None:
        try:
            while data := src.recv(4096):
                dst.sendall(data)
                if up:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        for sock in pair:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("signal-keys")
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    return base / "keys"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_ship_cancels_its_site_job(
    tmp_path: Path, programs: dict[str, Path], keys: Path, signum: int
) -> None:
    """`paramedic ship` stopped while its file crosses a slow link: its site job is cancelled (the site
    drops the job and its data at once) and the command says so in one line, exit 130. Before: the
    process died of the signal (exit -15) and the job stayed open at the site, holding its output path
    and its chunks for up to an hour."""
    trace = tmp_path / "big.clog2"
    paramedic("trace", "-out", str(trace), "--", "mpiexec.openmpi", "-n", "2", str(programs["openmpi"]),
              "3000", "5", env=OMPI_ENV)  # fmt: skip
    assert trace.stat().st_size > 300_000
    root = tmp_path / "root"
    root.mkdir()
    site = StorageSite(None, root, keys / "server", tmp_path / "serve.log")
    site.start()
    try:
        with SlowUplink(site.port, rate=100_000) as link:
            proc = subprocess.Popen(
                [str(BIN / "paramedic"), "ship", str(trace), "-out", "big.clog2", "--ship", "direct",
                 "--site", f"tls://localhost:{link.port}", "--keys", str(keys / "compute-a")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_interruptible,
            )  # fmt: skip
            try:
                job = site.wait_log(r"job ([0-9a-f]{32}): opened by", timeout=60).group(1)
                time.sleep(0.3)  # chunks on their way
                assert proc.poll() is None, "the shipment ended before it could be stopped"
                proc.send_signal(signum)
                stdout, stderr = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
            assert proc.returncode == 130, stderr
            lines = stderr.decode().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("paramedic: interrupted"), stderr
            site.wait_log(rf"job {job}: failed: cancelled by the compute site", timeout=10)
        assert (site.state / job / "failed.json").exists()
        assert sorted(p.name for p in root.iterdir()) == [".paramedic-state"]  # no partial output
    finally:
        site.stop()
