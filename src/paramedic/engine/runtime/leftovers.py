"""What launchers killed outright left behind, removed by the next run (issue 23 item 17).

A launcher killed with SIGKILL (a batch system after its grace period) cannot clean up: its
`paramedic-job-*` directory stays in the temporary directory, with MPICH's shared-memory segment in
/dev/shm that its ranks noted there, and hydra's `hydra_hwloc_xmlfile_*` stays in /tmp. The next launcher
removes them, and only them:

- a job directory is removed when the launcher that made it is gone: its `launcher` file names the pid and
  the pid's start time (a pid reused by another process does not count as alive); a directory of an older
  paramedic (no such file) when none of the ranks it lists is alive and it is older than ten minutes;
- with a job directory, the partial outputs its job named after itself (`.<out>.partial-<job id>`, noted
  in its `partials` file by paramedic.durable.note_partial): regular files of this user only;
- a hydra topology file of this user, older than a minute, only while no mpiexec or hydra proxy of this
  user runs (a proxy reads it only as it starts);
- a `paramedic trace` job whose launcher is gone (`paramedic-trace-*`): its processes, rank logs and
  shared memory (paramedic.trace.job.sweep).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from paramedic.durable import JOB_DIR_PREFIX, PARTIALS_NOTE
from paramedic.trace.job import sweep as sweep_traced_jobs

JOB_PREFIX = JOB_DIR_PREFIX
RANK_PREFIX = "paramedic-rank"
LAUNCHER_FILE = "launcher"
OWNER_FILE = "owner"  # in a rank's home (`rank_home`): the rank's pid and start time
HYDRA_TOPOLOGY = "hydra_hwloc_xmlfile_"
_OLD_JOB_SECONDS = 600.0
_OLD_HYDRA_SECONDS = 60.0
_MPI_PROGRAMS = ("mpiexec", "mpiexec.hydra", "hydra_pmi_proxy", "mpirun")


def note_launcher(job_dir: Path) -> None:
    """Say who made `job_dir` (this process), so that a later run can tell it is gone."""
    start = _start_time(os.getpid())
    (job_dir / LAUNCHER_FILE).write_text(f"{os.getpid()} {start}\n")


@contextmanager
def rank_home(rank: int) -> Iterator[Path]:
    """A directory for every temporary file of this rank (its work directory, each BLAST+ run's), for a
    rank started by the user's own mpiexec or srun: there no paramedic launcher removes what a rank
    killed outright (MPI_Abort of another rank, a kill -9) leaves, so the home says whose it is and which
    MPI shared memory its rank maps, and the next run on the node removes it once that rank is gone
    (`remove_leftovers`). TMPDIR points into it while the block runs, for BLAST+ runs too."""
    from paramedic.engine.runtime.stopped import mapped_shared_memory, step_tag

    home = Path(tempfile.mkdtemp(prefix=f"{RANK_PREFIX}{rank}-{step_tag()}"))
    before = (tempfile.tempdir, os.environ.get("TMPDIR"))
    try:
        (home / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        for name in mapped_shared_memory():
            (home / f"shm.{name}").touch()
        tempfile.tempdir, os.environ["TMPDIR"] = str(home), str(home)
        yield home
    finally:
        tempfile.tempdir = before[0]
        if before[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[1]
        shutil.rmtree(home, ignore_errors=True)


def remove_leftovers(tmp: Path, hydra_dir: Path = Path("/tmp")) -> int:
    """Remove what dead launchers and ranks of this user left; how many job directories went."""
    uid = os.getuid()
    _remove_dead_rank_homes(tmp, uid)
    removed = 0
    for job_dir in _named(tmp, JOB_PREFIX):
        try:
            info = job_dir.lstat()
        except OSError:
            continue
        if not job_dir.is_dir() or job_dir.is_symlink() or info.st_uid != uid or _in_use(job_dir, info):
            continue
        _remove_shared_memory(job_dir / "ranks")
        _remove_partials(job_dir / PARTIALS_NOTE, uid)
        shutil.rmtree(job_dir, ignore_errors=True)
        removed += 1
    removed += sweep_traced_jobs(tmp)  # `paramedic trace`'s (paramedic.trace.job)
    if not _mpi_running(uid):
        _remove_hydra_files(hydra_dir, uid)
    return removed


def _named(directory: Path, prefix: str) -> list[Path]:
    """The entries of `directory` whose names start with `prefix` (none when it cannot be listed)."""
    try:
        return [p for p in directory.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []


def _remove_dead_rank_homes(tmp: Path, uid: int) -> None:
    """Rank homes (`rank_home`) whose rank is gone, with the shared memory they noted. A home without an
    owner note (being made, or another paramedic's work directory) is left alone."""
    for home in _named(tmp, RANK_PREFIX):
        try:
            info = home.lstat()
            pid_text, _, start = (home / OWNER_FILE).read_text().strip().partition(" ")
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or not pid_text.isdigit():
            continue
        if _start_time(int(pid_text)) == start:
            continue  # its rank runs
        _remove_shared_memory(home)
        shutil.rmtree(home, ignore_errors=True)


def _in_use(job_dir: Path, info: os.stat_result) -> bool:
    try:
        pid_text, _, start = (job_dir / LAUNCHER_FILE).read_text().strip().partition(" ")
    except OSError:  # an older paramedic's, or one just made: its ranks and its age decide
        return time.time() - info.st_mtime < _OLD_JOB_SECONDS or any(_ranks_alive(job_dir / "ranks"))
    if not pid_text.isdigit():
        return False
    return _start_time(int(pid_text)) == start


def _ranks_alive(ranks: Path) -> list[int]:
    try:
        pids = [int(p.name) for p in ranks.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    return [pid for pid in pids if _start_time(pid) is not None]


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _remove_shared_memory(ranks: Path) -> None:
    try:
        notes = [p.name.removeprefix("shm.") for p in ranks.glob("shm.*")]
    except OSError:
        return
    for name in notes:
        if name and "/" not in name and name not in (".", ".."):
            try:
                Path("/dev/shm", name).unlink(missing_ok=True)
            except OSError:
                pass


def _remove_partials(note: Path, uid: int) -> None:
    try:
        lines = note.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for line in lines:
        path = Path(line)
        if not path.is_absolute() or not path.name.startswith(".") or ".partial-" not in path.name:
            continue
        try:
            info = path.lstat()
            if info.st_uid == uid and stat.S_ISREG(info.st_mode):
                path.unlink()
        except OSError:
            pass


def _mpi_running(uid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name in _MPI_PROGRAMS:
            return True
    return False


def _remove_hydra_files(hydra_dir: Path, uid: int) -> None:
    now = time.time()
    for path in _named(hydra_dir, HYDRA_TOPOLOGY):
        try:
            info = path.lstat()
            if info.st_uid == uid and path.is_file() and now - info.st_mtime > _OLD_HYDRA_SECONDS:
                path.unlink()
        except OSError:
            pass
