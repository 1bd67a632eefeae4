"""The traced job's processes, and what they leave when stopped or killed (issue 41, item 8).

`paramedic trace` starts mpiexec in a session of its own (a terminal's Ctrl-C reaches the launcher alone,
which stops the job) and asks the kernel to kill it when the launcher dies (the ranks end with their
mpiexec). Every process of the job carries the job's id in its environment (`JOB_VARIABLE`, passed on by
the launcher's options), so each is found wherever it runs: a rank hung in MPI_Init, one that outlived its
hydra proxy.

A job's marker, `paramedic-trace-*` in the temporary directory, names what it may leave: `launcher` (this
process's pid and start time), `job` (the id), `logs` (the rank logs' directory, hundreds of MB), `mpiexec`
(its pid and start time: Open MPI's session directory is named after it) and `shm.<name>` for each /dev/shm
file the job's processes map (MPI's shared memory: a killed MPI job leaves it for ever). A run stopped by a
signal ends its job and removes all of it (`TracedJob.stop`, `TracedJob.remove`); a run killed outright
cannot, and the next launcher's `sweep` does once the launcher that made the marker is gone.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

JOB_PREFIX = "paramedic-trace-"
JOB_VARIABLE = "PARAMEDIC_TRACE_JOB"
LOGS_NAME = re.compile(r"\..+\.ranks-[A-Za-z0-9_]+")  # run.mkdtemp's name beside -out (or in the temp dir)
HYDRA_TOPOLOGY = "hydra_hwloc_xmlfile_"  # MPICH's hydra writes it in /tmp; a killed mpiexec leaves it
STOP_SECONDS = 10.0  # how long killed processes get to be gone before the files they map are removed
_OLD_MARKER_SECONDS = 600.0  # a marker with no launcher noted yet is being made, unless this old


class Interrupted(KeyboardInterrupt):
    """The launcher was stopped by a signal: the job is ended and its files removed."""


@dataclass
class TracedJob:
    """One traced job: its marker directory, its id, its rank logs, its mpiexec once started."""

    directory: Path
    job_id: str
    logs: Path
    mpiexec: int | None = None
    noted: set[str] = field(default_factory=set)
    hydra_before: set[str] = field(default_factory=set)
    shm_before: set[str] = field(default_factory=set)
    started: float = 0.0

    @classmethod
    def create(cls, logs: Path, tmp: Path | None = None) -> TracedJob:
        """The marker for a job whose ranks log to `logs`, made before the job starts."""
        directory = Path(tempfile.mkdtemp(prefix=JOB_PREFIX, dir=tmp))
        job = cls(directory, secrets.token_hex(8), logs.absolute())
        try:
            _write(directory / "launcher", _identity(os.getpid()))  # first: alive from here on
            _write(directory / "job", job.job_id)
            _write(directory / "logs", str(job.logs))
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return job

    @classmethod
    def load(cls, directory: Path) -> TracedJob | None:
        """A marker left by another launcher; None when it names no job."""
        job_id, logs = _read(directory / "job"), _read(directory / "logs")
        if not re.fullmatch(r"[0-9a-f]{16}", job_id):
            return None
        job = cls(directory, job_id, Path(logs))
        pid, _, start = _read(directory / "mpiexec").partition(" ")
        if pid.isdigit() and _start_time(int(pid)) in (None, start):
            job.mpiexec = int(pid)  # its session directory is removed once it is gone
        job.noted = _notes(directory)
        return job

    def environment(self) -> dict[str, str]:
        """What every process of the job carries, so that it can be found."""
        return {JOB_VARIABLE: self.job_id}

    def started_as(self, pid: int) -> None:
        """mpiexec runs as `pid` (noted for its session directory)."""
        self.mpiexec = pid
        _write(self.directory / "mpiexec", _identity(pid))

    def before_start(self) -> None:
        """What was there before the job: only files that arrive while it runs can be its own (a program
        may map a segment another program made, and keeps, in /dev/shm; hydra writes its topology to
        /tmp, not to the temporary directory)."""
        self.hydra_before = _hydra_files()
        self.shm_before = _listing(Path("/dev/shm"))
        self.started = time.time()

    def note_memory(self, root: int) -> None:
        """Note the /dev/shm files `root` and its descendants map (MPI makes them in MPI_Init)."""
        for pid in _descendants(root):
            self._note(_mapped_shared_memory(pid))

    def _note(self, names: set[str]) -> None:
        for name in names - self.noted - self.shm_before:
            try:
                (self.directory / f"shm.{name}").touch()
            except OSError:
                continue
            self.noted.add(name)

    def stop(self, mpiexec_group: int | None = None) -> None:
        """End every process of the job: mpiexec's process group, then whatever carries the job's id,
        at once (SIGKILL: hydra and Open MPI print nothing then, and a rank in MPI_Init answers no other
        signal); returns once they are gone or after STOP_SECONDS."""
        if mpiexec_group is not None:
            self.note_memory(mpiexec_group)
            try:
                os.killpg(mpiexec_group, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_SECONDS
        while (pids := self._processes()) and time.monotonic() < deadline:
            for pid in pids:
                self._note(_mapped_shared_memory(pid))
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)

    def _processes(self) -> list[int]:
        """The live processes of this user that carry the job's id."""
        mark = f"{JOB_VARIABLE}={self.job_id}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if entry.stat().st_uid != os.getuid():
                    continue
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return [pid for pid in found if _start_time(pid) is not None]

    def remove(self) -> None:
        """Once the job's processes are gone: the shared memory they mapped, Open MPI's session directory,
        the hydra topology files that arrived meanwhile, the rank logs, and the marker last."""
        for name in self.noted | _notes(self.directory):
            try:
                Path("/dev/shm", name).unlink(missing_ok=True)
            except OSError:
                pass
        if self.mpiexec is not None and _start_time(self.mpiexec) is None:
            _remove_session_directory(Path(tempfile.gettempdir()), self.mpiexec)
        if self.started:
            _remove_hydra_files(self.hydra_before, self.started)
        _remove_logs(self.logs)
        shutil.rmtree(self.directory, ignore_errors=True)


def sweep(tmp: Path) -> int:
    """End and remove the jobs of launchers of this user that were killed outright; how many."""
    removed = 0
    for directory in _markers(tmp):
        if _launcher_alive(directory):
            continue
        job = TracedJob.load(directory)
        if job is None:
            shutil.rmtree(directory, ignore_errors=True)
            continue
        job.stop()
        job.remove()
        removed += 1
    return removed


def _markers(tmp: Path) -> list[Path]:
    """This user's marker directories in `tmp` (none when it cannot be listed)."""
    try:
        entries = [p for p in tmp.iterdir() if p.name.startswith(JOB_PREFIX)]
    except OSError:
        return []
    found = []
    for path in entries:
        try:
            info = path.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            found.append(path)
    return found


def _launcher_alive(directory: Path) -> bool:
    """Whether the launcher that made the marker runs (a pid reused by another process does not count);
    a marker with no launcher noted is being made, unless it is old."""
    pid, _, start = _read(directory / "launcher").partition(" ")
    if not pid.isdigit():
        try:
            return time.time() - directory.lstat().st_mtime < _OLD_MARKER_SECONDS
        except OSError:
            return True
    return _start_time(int(pid)) == start


def _remove_logs(logs: Path) -> None:
    """The rank logs' directory, if it is what the marker says: a directory of this user, named as
    `paramedic trace` names it (the marker is a file anyone of this user could have written)."""
    if not logs.is_absolute() or not LOGS_NAME.fullmatch(logs.name):
        return
    try:
        info = logs.lstat()
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
        shutil.rmtree(logs, ignore_errors=True)


def _remove_session_directory(tmp: Path, pid: int) -> None:
    """Open MPI's session directory of the mpiexec that ran as `pid` (`<tmp>/ompi.<node>.<uid>/pid.<pid>`,
    which a killed mpiexec leaves), and its parent if that is left empty, as mpiexec does on its way out."""
    uid = os.getuid()
    for top in tmp.glob(f"ompi.*.{uid}"):
        session = top / f"pid.{pid}"
        try:
            info = session.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            shutil.rmtree(session, ignore_errors=True)
            try:
                top.rmdir()
            except OSError:
                pass  # another mpiexec's session is in it


def _hydra_files() -> set[str]:
    return {n for n in _listing(Path("/tmp")) if n.startswith(HYDRA_TOPOLOGY)}


def _listing(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def _remove_hydra_files(before: set[str], started: float) -> None:
    """The topology files that appeared while the job ran and are this user's: a killed hydra leaves its
    own (another mpiexec started meanwhile reads its file only as its proxies start)."""
    for name in _hydra_files() - before:
        path = Path("/tmp", name)
        try:
            info = path.lstat()
            if info.st_uid == os.getuid() and stat.S_ISREG(info.st_mode) and info.st_mtime >= started - 1:
                path.unlink()
        except OSError:
            pass


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (/proc's children lists)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return found


def _mapped_shared_memory(pid: int) -> set[str]:
    """Names of the /dev/shm files a process maps (MPI's shared-memory segments)."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            paths = {line.split(maxsplit=5)[-1].strip() for line in fh if " /dev/shm/" in line}
    except OSError:
        return set()
    names = {p.removeprefix("/dev/shm/") for p in paths if not p.endswith("(deleted)")}
    return {n for n in names if _plain_name(n)}


def _notes(directory: Path) -> set[str]:
    try:
        names = [p.name.removeprefix("shm.") for p in directory.glob("shm.*")]
    except OSError:
        return set()
    return {n for n in names if _plain_name(n)}


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


def _identity(pid: int) -> str:
    return f"{pid} {_start_time(pid)}"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None when there is no such live process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n")


def _read(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return ""
