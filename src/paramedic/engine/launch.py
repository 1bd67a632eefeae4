"""Starting the job: under a given mpiexec/srun, or by starting ourselves under the embedded mpiexec.

Without an MPI launcher, `paramedic search` runs on all local cores: it starts `mpiexec -n <cores + 1>`
(one master, one worker per core) from the project's own MPI (the `mpich` wheel in the virtual
environment), falling back to an mpiexec on PATH. Under a launcher it uses the ranks it is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from paramedic.cli import MPI_RANK_VARIABLES
from paramedic.engine.settings import SearchSettings
from paramedic.errors import JobError, ParamedicError

LAUNCHED_VARIABLE = "PARAMEDIC_LAUNCHED"
# Where a failing rank leaves its one-line message for the launching process: mpiexec may tear the job
# down before it forwards the rank's stderr, and the user must still see why the job failed.
ERROR_FILE_VARIABLE = "PARAMEDIC_ERROR_FILE"


def under_mpi() -> bool:
    return any(name in os.environ for name in (*MPI_RANK_VARIABLES, LAUNCHED_VARIABLE))


def local_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def find_mpiexec() -> str | None:
    beside_python = Path(sys.executable).parent / "mpiexec"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which("mpiexec")


def launch_or_run(settings: SearchSettings, workers: int | None, argv: list[str]) -> int:
    if under_mpi():
        return run_under_mpi(settings, argv)
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise JobError("mpiexec not found: run `make setup` (installs MPICH in .venv) or install an MPI")
    ranks = (workers or local_cores()) + 1
    with tempfile.NamedTemporaryFile(prefix="paramedic-error-", suffix=".txt") as error_file:
        env = dict(os.environ, **{LAUNCHED_VARIABLE: "1", ERROR_FILE_VARIABLE: error_file.name})
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "paramedic", *argv]
        try:
            code = subprocess.call(command, env=env)
        except KeyboardInterrupt:
            return 130
        message = Path(error_file.name).read_text(errors="replace").strip()
        if code != 0 and message:
            print(message.splitlines()[0], file=sys.stderr, flush=True)
        return code


def report_failure(line: str) -> None:
    """The failing rank's message: to the launching process when there is one, else to stderr."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if path:
        try:
            with open(path, "a") as fh:
                fh.write(line + "\n")
            return
        except OSError:
            pass
    print(line, file=sys.stderr, flush=True)


def run_under_mpi(settings: SearchSettings, argv: list[str]) -> int:
    """Every rank runs this. Rank 0 prepares and checks the job; any failure ends all ranks."""
    from mpi4py import MPI

    from paramedic.blast.tools import warm_up
    from paramedic.engine.job import prepare_job
    from paramedic.engine.roles import run_job

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    job = failure = None
    if rank != 0:
        warm_up(settings.program)  # this worker's BLAST+ fork server starts while rank 0 checks the job
    if rank == 0:
        try:
            job = prepare_job(settings)
        except ParamedicError as exc:
            failure = exc
    job, failure = comm.bcast((job, failure), root=0)
    if failure is not None:
        if rank == 0:
            raise failure
        return failure.exit_code
    try:
        record = run_job(job, comm, ["paramedic", *argv])
    except BaseException as exc:  # end every rank with the message, never hang (as mpi4py.run does)
        code = (
            exc.exit_code
            if isinstance(exc, ParamedicError)
            else 130
            if isinstance(exc, KeyboardInterrupt)
            else 1
        )
        text = str(exc) if isinstance(exc, ParamedicError) else f"internal error: {type(exc).__name__}: {exc}"
        report_failure(f"paramedic: error: {text}")
        if os.environ.get("PARAMEDIC_DEBUG"):
            import traceback

            traceback.print_exc()
        comm.Abort(code)
        return code
    if record is not None:
        if job.record is not None:
            record.write(job.record)
        if not job.quiet:
            print(record.summary(), file=sys.stderr)
    return 0
