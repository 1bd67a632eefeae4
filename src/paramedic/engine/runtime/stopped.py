"""A rank that the batch system stops: SIGTERM under srun (scancel, the time limit, or a node of the job
lost: Slurm signals every task of the step, then sends SIGKILL after its KillWait).

Python's default for SIGTERM ends the process at once: the rank's temporary directory
(`paramedic-rank<N>-<job>.<step>-*`), a BLAST+ run's (`paramedic-run-*`) and MPICH's shared-memory segment in /dev/shm
stay on the node, and nobody removes them (under srun there is no paramedic launcher to do it, and a
node's /tmp and /dev/shm outlive the job). Here the signal unwinds the rank instead, as an interrupt does:
its `finally` blocks remove its directories, then it unlinks the shared memory it maps, rank 0 says once
why the job ended (and that its finished work is kept in the journal), and every rank exits 130 without
MPI_Finalize (which would wait for ranks that are gone). Under paramedic's own launcher the launcher
stops the ranks (SIGINT) and cleans up: nothing changes there.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType

EXIT_CODE = 130  # docs/ERRORS.md "Exit codes": interrupted


class Stopped(BaseException):
    """Raised in a rank by SIGTERM; not an Exception, so that no `except Exception` takes it for a failure."""


def catch_stop(launched_by_paramedic: bool) -> None:
    """Make SIGTERM unwind this rank (raise Stopped), unless paramedic's own launcher started it."""
    if not launched_by_paramedic:
        signal.signal(signal.SIGTERM, _raise)


def _raise(signum: int, _frame: FrameType | None) -> None:
    # Once: srun forwards the step's SIGTERM as slurmstepd sends its own, and a second one must not cut
    # the clean-up short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    unlink_shared_memory()  # first: the batch system's SIGKILL may follow before the unwinding ends
    raise Stopped(signum)


def step_tag() -> str:
    """Names this job step in a rank's temporary directory (`paramedic-rank<N>-<job>.<step>-*`) under
    Slurm, so that the step's stopped ranks can find what a rank of theirs that died outright left."""
    job, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "")
    return f"{job}.{step}-" if job.isdigit() and step.isdigit() else ""


def remove_step_dirs(tmp: Path) -> None:
    """The directories of this job step's ranks on this node: Slurm stops the whole step at once, so
    none is still in use; one is left only by a rank that died outright (a segmentation fault in the MPI
    library when a peer's node is lost was seen)."""
    tag = step_tag()
    if not tag:
        return
    for path in tmp.glob(f"paramedic-rank*-{tag}*"):
        if path.is_dir() and not path.is_symlink() and path.lstat().st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)


def end_stopped(rank: int, say_journal: Callable[[], None]) -> None:
    """After the rank has unwound: its shared memory unlinked, what its step's dead ranks left on this
    node removed, rank 0's one line, exit 130 (never returns). `say_journal` is called on rank 0 to say
    whether finished work waits in a journal."""
    try:
        remove_step_dirs(Path(tempfile.gettempdir()))
    except OSError:
        pass
    unlink_shared_memory()
    if rank == 0:
        print(
            "paramedic: interrupted: the batch system stopped the job (SIGTERM: scancel, its time limit, "
            "or a lost node); each rank removes its temporary files",
            file=sys.stderr,
            flush=True,
        )
        say_journal()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODE)


def unlink_shared_memory() -> None:
    """Unlink the /dev/shm files this process maps, for a rank whose job is ending without MPI_Finalize
    (stopped, or about to call MPI_Abort): MPICH unlinks its segment only in MPI_Finalize, and an aborted
    job's segment stayed for good (3 MiB each, seen under the user's own mpiexec). The ranks that map it
    keep their mapping; only the name goes."""
    for name in mapped_shared_memory():
        try:
            Path("/dev/shm", name).unlink(missing_ok=True)
        except OSError:
            pass


def mapped_shared_memory(pid: int | str = "self") -> set[str]:
    """Names of the files in /dev/shm a process (this one by default) maps (MPICH's segment for the
    node's ranks): the other ranks of the node map it too, and keep it until they end; only its name goes."""
    try:
        with open(f"/proc/{pid}/maps") as fh:
            paths = {line.split(maxsplit=5)[-1].strip() for line in fh if " /dev/shm/" in line}
    except OSError:
        return set()
    names = {path.removeprefix("/dev/shm/") for path in paths if not path.endswith("(deleted)")}
    return {n for n in names if n and "/" not in n and n not in (".", "..")}
