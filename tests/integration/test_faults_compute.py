"""Faults at the compute site: unexpected errors, killed ranks, an interrupted launcher, corrupt databases
and bad option values end the job with one line and a documented exit code, leaving nothing behind
(real mpiexec ranks, real BLAST+, real signals)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, paramedic
from tests.support.databases import Databases
from tests.support.processes import alive

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    databases.place(root, 2000, fragments=2, out="dbs/db", layout="fragments")
    databases.queries(root / "q.fasta", 3)
    databases.queries(root / "q100.fasta", 100)
    return root


def env_with_tmp(tmp: Path) -> dict[str, str]:
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def left_behind(cwd: Path, tmp: Path) -> list[str]:
    hidden = [p.name for p in cwd.iterdir() if ".partial" in p.name]
    return hidden + [p.name for p in tmp.iterdir()]


def check_journal(cwd: Path, out: Path, lines: list[str]) -> None:
    """A stopped search keeps its journal (finished work, for the next run: test_resume.py) exactly when
    it says so in one more line; the journal holds no partial output."""
    journal = cwd / f".{out.name}.journal"
    kept = [line for line in lines if line.startswith("paramedic: finished work is kept in")]
    assert journal.exists() == bool(kept), lines
    if kept:
        assert str(journal) in kept[0]
        assert not (journal / "output.partial").exists()
        assert any((journal / "search").iterdir()) or any((journal / "piece").iterdir())


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _interruptible() -> None:
    """In the search's process before it starts: SIGINT at its default, so that Python turns it into an
    interrupt. A test run started in the background by a shell (`cmd &`, as a CI script may) inherits
    SIGINT ignored, and Python then keeps ignoring it: the stop tests' SIGINT was lost and the job ran
    to its end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (ranks run in process groups of their own), leaves first."""
    for child in children(pid):
        kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


_LAUNCHED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_search_outlives_its_test():
    """A test that fails while its search runs (an assertion before it stops it) left the launcher, its
    mpiexec and ranks running after the test: seen with ranks stuck in MPI_Init, spinning for minutes
    (issue 23). Whatever this module's tests started and did not end is killed at their teardown."""
    yield
    while _LAUNCHED:
        proc = _LAUNCHED.pop()
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


def start_long_search(
    site: Path, tmp_path: Path, runner: str = "mpi", settle: float = 0.5
) -> tuple[subprocess.Popen, Path]:
    """A search that runs for several seconds; returns once its partial output exists. Its queries are
    the 100 test queries three times over (ids made unique): the engine got fast enough that 100 could
    end before the test stopped them."""
    out = tmp_path / "o.txt"
    queries = tmp_path / "q300.fasta"
    records = (site / "q100.fasta").read_text().split(">")[1:]
    queries.write_text("".join(f">r{copy}_{record}" for copy in range(3) for record in records))
    proc = subprocess.Popen(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(queries), "-db",
         str(site / "dbs/db"), "-out", str(out), "--np", "2", "--strategy", "fragments", "--runner", runner,
         "--fragment-groups", "off"],  # many tasks: long enough to stop in the middle
        cwd=tmp_path, env=env_with_tmp(tmp_path / "tmp"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_interruptible,
    )  # fmt: skip
    _LAUNCHED.append(proc)
    deadline = time.monotonic() + 60
    while not (tmp_path / ".o.txt.journal" / "output.partial").exists():
        assert proc.poll() is None, proc.communicate()
        if time.monotonic() > deadline:  # seen: every rank stuck in MPICH's MPI_Init, spinning
            kill_tree(proc.pid)
            raise AssertionError(f"no output after 60 s: {proc.communicate()}")
        time.sleep(0.05)
    time.sleep(settle)  # the local runner's job can end within half a second of its first piece
    return proc, out


def mapped_shared_memory(pids: list[int]) -> set[Path]:
    """The files in /dev/shm these processes map (MPICH's segment for the node's ranks), not yet unlinked."""
    found = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                found.add(Path(path))
    return found


def assert_no_shared_memory_left(segments: set[Path]) -> None:
    """Found by the fault soak (bench/faults.py, each job with a /dev/shm of its own): MPICH unlinks its
    shared-memory segment only in MPI_Finalize, so every job that failed after MPI started (exit 5, 7, 8,
    130) left a few MiB of memory in /dev/shm for ever. Checked by the two stop tests below, on the
    segments their ranks mapped before the stop (a test of its own repeated their whole search)."""
    assert [s for s in segments if s.exists()] == []


def test_unexpected_error_while_preparing_ends_every_rank(site: Path, tmp_path: Path) -> None:
    """Issue 11 item 11: a non-paramedic exception on rank 0 before the job starts left the other ranks
    waiting in bcast for ever under `mpiexec -n 3`."""
    db = tmp_path / "db"
    subprocess.run(["cp", "-r", str(site / "dbs" / "db"), str(db)], check=True)
    subprocess.run(["cp", str(site / "dbs" / "db.pal"), str(tmp_path / "db.pal")], check=True)
    manifest = json.loads((db / "manifest.json").read_text())
    manifest["whole"] = 5  # not a name: a TypeError deep in the checks, not one of paramedic's errors
    (db / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "3", str(BIN / "paramedic"), "search", "blastp", "-query",
         str(site / "q.fasta"), "-db", str(db), "-out", "o.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode in (1, 4), proc.stderr
    assert "paramedic: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.txt").exists()


def test_killed_rank_exits_7_with_one_message_and_nothing_left(site: Path, tmp_path: Path) -> None:
    """Item 12: SIGKILL of one worker rank exited 9 with MPICH's banner on stdout and left the partial
    output and the ranks' directories in $TMPDIR."""
    proc, out = start_long_search(site, tmp_path)
    (mpiexec,) = children(proc.pid)
    proxy = children(mpiexec)[0]
    ranks = children(proxy)
    assert len(ranks) == 3
    segments = mapped_shared_memory(ranks)
    assert segments, "the ranks map no shared memory: nothing to check"
    os.kill(ranks[-1], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 7, stderr
    assert stdout == b""
    lines = stderr.decode().strip().splitlines()
    assert lines[0].startswith("paramedic: error:") and "signal 9" in lines[0], stderr
    check_journal(tmp_path, out, lines[1:])
    assert len(lines) <= 2, stderr
    assert not out.exists()
    assert left_behind(tmp_path, tmp_path / "tmp") == []
    assert_no_shared_memory_left(segments)


@pytest.mark.alone  # looks at all of /tmp's hydra files before and after
def test_interrupted_launcher_exits_130_and_leaves_nothing(site: Path, tmp_path: Path) -> None:
    """Item 12: SIGINT of the launcher exited 130 with nothing printed and left files behind."""
    hydra = set(Path("/tmp").glob("hydra_hwloc_xmlfile_*"))  # MPICH's, in /tmp whatever $TMPDIR says
    proc, out = start_long_search(site, tmp_path)
    ranks = children(children(children(proc.pid)[0])[0])
    segments = mapped_shared_memory(ranks)
    assert segments, "the ranks map no shared memory: nothing to check"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stdout == b""
    lines = stderr.decode().strip().splitlines()
    assert lines[0].startswith("paramedic: interrupted"), stderr
    check_journal(tmp_path, out, lines[1:])
    assert len(lines) <= 2, stderr
    assert not out.exists()
    assert left_behind(tmp_path, tmp_path / "tmp") == []
    assert not [pid for pid in ranks if alive(pid)]  # no rank outlives the launcher
    assert set(Path("/tmp").glob("hydra_hwloc_xmlfile_*")) <= hydra
    assert_no_shared_memory_left(segments)


def test_truncated_volume_is_a_database_error(site: Path, tmp_path: Path) -> None:
    """Item 13: a truncated .pin gave exit 5 "blastp failed (exit 139)" after MPI had started."""
    subprocess.run(["cp", "-r", str(site / "dbs" / "db"), str(tmp_path / "db")], check=True)
    (tmp_path / "db.pal").write_text((site / "dbs" / "db.pal").read_text())
    search = ["search", "blastp", "-query", str(site / "q.fasta"), "-db", "db", "-out", "o.txt", "--np", "2"]
    paramedic(*search, cwd=tmp_path)  # verified once (digests), then cached
    (tmp_path / "o.txt").unlink()
    pin = tmp_path / "db" / "f001.pin"
    pin.write_bytes(pin.read_bytes()[:100])
    proc = paramedic(*search, cwd=tmp_path, check=False, env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"paramedic: error: {tmp_path / 'db'}: corrupt database: volume f001 does not match the manifest's "
        "checksum (changed or damaged since `paramedic format`; format it again)"
    ]
    assert not (tmp_path / "o.txt").exists()


@pytest.mark.parametrize(
    "option,message",
    [
        (["-evalue", "abc"], "-evalue abc: Argument cannot be converted"),
        (["-word_size", "1"], "-word_size 1: Illegal value, expected >=2"),
        (["-sorthits", "7"], "-sorthits 7: Illegal value"),
        (["-matrix", "FOO"], "FOO is not a supported matrix"),
    ],
)
def test_bad_option_value_is_refused_before_mpi(
    site: Path, tmp_path: Path, option: list[str], message: str
) -> None:
    """Item 14: option values were checked only on the workers (exit 5 with MPICH's Abort line)."""
    tmp = tmp_path / "tmp"
    proc = subprocess.run(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(site / "q.fasta"), "-db",
         str(site / "dbs/db"), "-out", "o.txt", "--np", "2", *option],
        cwd=tmp_path, env=env_with_tmp(tmp), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paramedic: error: blastp refuses the options: ")
    assert message in lines[0]
    assert proc.stdout == ""
    assert left_behind(tmp_path, tmp) == []


def test_help_and_version_and_np_and_plurals(site: Path, tmp_path: Path) -> None:
    """Item 15: `search --help` exited 2, the top-level help was a developer docstring, `search X
    -version` ran program X, --np was silently ignored under mpiexec, the summary said "1 workers"."""
    text = " ".join(paramedic("search", "--help").stdout.split())
    assert "--np" in text and "ignored under mpiexec" in text
    assert "half a search batch" in text  # --regen-batch's real default
    top = paramedic("--help").stdout
    assert top.startswith("paramedic: parallel NCBI BLAST+") and "typed settings" not in top
    proc = paramedic("search", "touch", "-version", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "unknown program 'touch'" in proc.stderr
    assert not (tmp_path / "-version").exists()
    proc = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "2", str(BIN / "paramedic"), "search", "blastp", "-query",
         str(site / "q.fasta"), "-db", str(site / "dbs/db"), "-out", "o.txt", "--np", "4",
         "--strategy", "queries"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "paramedic: --np ignored under mpiexec: using the 2 ranks given" in proc.stderr
    assert " on 1 worker in " in proc.stderr and "1 whole-database search of 3 queries" in proc.stderr


def test_progress_bar_is_drawn_by_the_launcher_on_a_terminal(site: Path, tmp_path: Path) -> None:
    """Item 15: the bar never appeared (a rank's stderr is not a terminal under mpiexec): the launching
    process draws it from rank 0's count when its own stderr is a terminal (the engine's tasks: on one
    node `auto` would run one BLAST+, which has no count to draw)."""
    import fcntl
    import pty
    import struct
    import termios

    controller, terminal = pty.openpty()
    fcntl.ioctl(
        terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0)
    )  # 100 columns, as a terminal
    proc = subprocess.Popen(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(site / "q100.fasta"), "-db",
         str(site / "dbs/db"), "-out", "o.txt", "--np", "2", "--strategy", "fragments"],
        cwd=tmp_path, env=env_with_tmp(tmp_path / "tmp"), stdout=subprocess.DEVNULL, stderr=terminal,
    )  # fmt: skip
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed: the search ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.wait(timeout=120) == 0, shown
    # complete: queries with query segmentation, tasks (searches, then pieces) with fragments
    assert b"paramedic: 100%" in shown and re.search(rb" (\d+)/\1 \[", shown), shown
    assert b"paramedic: blastp 100 queries" in shown  # then the summary


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for the signal (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.alone  # looks at all of /dev/shm before and after
@pytest.mark.parametrize("when", ["while loading", "as the ranks start"])
def test_terminated_launcher_exits_130_with_one_line(site: Path, tmp_path: Path, when: str) -> None:
    """Found by the fault soak (bench/faults.py): SIGTERM of the launcher while it loaded and checked the
    job killed it with no message (exit -15); an interrupt as the ranks started made every rank print its
    own "paramedic: interrupted" besides the launcher's line. And a rank still in MPI_Init answers no
    signal: the launcher kills the job after STOP_SECONDS, and that kill left the segment the rank had
    made in /dev/shm (session 25: under load, 8 segments in 25 runs)."""
    shm = set(Path("/dev/shm").iterdir())
    tmp = tmp_path / "tmp"
    proc = subprocess.Popen(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(site / "q100.fasta"), "-db",
         str(site / "dbs/db"), "-out", "o.txt", "--np", "2", "--quiet", "--runner", "mpi"],
        cwd=tmp_path, env=env_with_tmp(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    if when == "while loading":  # as soon as the launcher takes SIGTERM: before MPI starts
        while not catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.002)
        assert not list(tmp.iterdir()), "SIGTERM was taken over only once the job had started"
    else:  # as soon as the ranks exist (they are loading their modules and MPI)
        ranks: list[int] = []
        while not ranks:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            ranks = [r for m in children(proc.pid) for p in children(m) for r in children(p)]
            time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paramedic: interrupted"), stderr
    assert stdout == b""
    assert left_behind(tmp_path, tmp) == []
    assert sorted(set(Path("/dev/shm").iterdir()) - shm) == []
