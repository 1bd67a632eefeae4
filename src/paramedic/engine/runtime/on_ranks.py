"""What each rank runs under MPI: the job prepared by rank 0 and shared, run by every rank under the
abort handler, so that any failure on any rank ends every rank with one message."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.runtime.ending import failure, say_journal_kept
from paramedic.engine.runtime.jobvars import ERROR_FILE_VARIABLE, LAUNCHED_VARIABLE, RANKS_DIR_VARIABLE
from paramedic.errors import InternalError, ParamedicError


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


def run_under_mpi(settings: SearchSettings, argv: list[str], np_ignored: bool = False) -> int:
    """Every rank runs this, all of it under the abort handler (as `mpi4py.run` does): any failure on
    any rank ends every rank with one message, never a rank left waiting."""
    from paramedic.engine.runtime.stopped import mapped_shared_memory

    ranks_dir = os.environ.get(RANKS_DIR_VARIABLE)
    try:
        from mpi4py import MPI  # MPI_Init: an interrupt in it is raised once it returns
    finally:
        if ranks_dir:  # for the launcher: this rank's process id, and MPI's shared memory
            try:
                Path(ranks_dir, str(os.getpid())).touch()
                for name in mapped_shared_memory():
                    Path(ranks_dir, f"shm.{name}").touch()
            except OSError:
                pass

    comm = MPI.COMM_WORLD
    from paramedic.engine.runtime.stopped import Stopped, catch_stop, end_stopped, unlink_shared_memory

    catch_stop(LAUNCHED_VARIABLE in os.environ)  # under srun: SIGTERM unwinds the rank (its files go)
    try:
        return _run_rank(settings, argv, comm, np_ignored)
    except _Refused as refused:  # every rank knows already: no abort, the usual one-line error
        raise refused.args[0] from None
    except Stopped:
        end_stopped(comm.Get_rank(), lambda: say_journal_kept(settings))
        raise
    except BaseException as exc:  # end every rank with the message, never hang
        text, code = failure(exc)
        report_failure(f"paramedic: {text}")
        if comm.Get_rank() == 0 and LAUNCHED_VARIABLE not in os.environ:
            say_journal_kept(settings)  # under the user's own mpiexec; else the launcher says it
        if os.environ.get("PARAMEDIC_DEBUG"):
            import traceback

            traceback.print_exc()
        unlink_shared_memory()  # MPI_Abort leaves MPICH's segment; the job ends here
        comm.Abort(code)
        return code


class _Refused(Exception):
    """The job was refused while rank 0 prepared it: every rank knows, and exits with its code."""


def _run_rank(settings: SearchSettings, argv: list[str], comm: Any, np_ignored: bool) -> int:
    if LAUNCHED_VARIABLE in os.environ:  # paramedic's launcher: TMPDIR is its job directory, which it removes
        return _run_rank_here(settings, argv, comm, np_ignored)
    from paramedic.engine.runtime.leftovers import rank_home, remove_leftovers

    if comm.Get_rank() == 0:
        remove_leftovers(Path(tempfile.gettempdir()))  # what dead ranks of earlier jobs left on this node
    with rank_home(comm.Get_rank()):  # every temporary file of this rank, removable by the next run
        return _run_rank_here(settings, argv, comm, np_ignored)


def _run_rank_here(settings: SearchSettings, argv: list[str], comm: Any, np_ignored: bool) -> int:
    from paramedic.blast.tools import warm_up
    from paramedic.engine.core.strategy import node_memory
    from paramedic.engine.job.shell import conclude
    from paramedic.engine.runtime.roles import run_job

    rank = comm.Get_rank()
    job = failure = None
    if rank != 0:
        warm_up(settings.program)  # this worker's BLAST+ fork server starts while rank 0 checks the job
    measured = comm.gather(node_memory(), root=0)  # each node's own memory and cgroup count (auto)
    spread = _spread_first_digest(settings, comm, measured)
    if rank == 0:
        job, failure = _prepare_on_rank_0(settings, comm, measured, np_ignored)
    if job is not None and spread is not None:
        job = dataclasses.replace(job, first_digest=spread)
    # the workers' job holds no queries: each task brings its own (rank 0 keeps the whole job)
    shared = comm.bcast((job.for_workers() if job is not None else None, failure), root=0)
    if rank != 0:
        job, failure = shared
    if failure is not None:
        if rank == 0:
            raise _Refused(failure)
        return failure.exit_code
    assert job is not None  # prepared, or the failure was said
    if job.strategy is not None and job.strategy.whole_blast:  # one BLAST+ run on this node (issue 44)
        return _run_whole_on_ranks(job, settings, argv, comm)
    record = run_job(job, comm, ["paramedic", *argv])
    if record is not None:
        conclude(record, job, settings.report)
    return 0


def _prepare_on_rank_0(
    settings: SearchSettings, comm: Any, measured: list[tuple[str, Any]], np_ignored: bool
) -> tuple[Any, ParamedicError | None]:
    """Rank 0's preparation of the job: the job, or the failure every rank is to learn of."""
    from paramedic.engine.core.strategy import job_memory
    from paramedic.engine.job.job import prepare_job

    job = failure = None
    if np_ignored and LAUNCHED_VARIABLE not in os.environ and not settings.quiet:
        print(
            f"paramedic: --np ignored under mpiexec: using the {comm.Get_size()} ranks given",
            file=sys.stderr,
        )
    try:
        job = prepare_job(
            settings,
            workers=max(1, comm.Get_size() - 1),
            memory=job_memory(measured),
            one_node=len({host for host, _ in measured}) == 1,
        )
    except ParamedicError as exc:
        failure = exc
    except Exception as exc:  # a bug while preparing: every rank still learns of it (no hang)
        if os.environ.get("PARAMEDIC_DEBUG"):
            import traceback

            traceback.print_exc()
        failure = InternalError(f"internal error: {type(exc).__name__}: {exc} (PARAMEDIC_DEBUG=1 shows more)")
    return job, failure


def _spread_first_digest(
    settings: SearchSettings, comm: Any, measured: list[tuple[str, Any]] | None
) -> dict[str, object] | None:
    """A database in place whose files this user has not digested yet, on ranks of several nodes: one
    rank per node digests a share (paramedic.db.spread), rank 0 takes the digests, then opens the
    database without reading those files again. None (nothing done) on one node (rank 0 digests with
    every core there) or when every stamp is known; else, on rank 0, the run record's figures."""
    from paramedic.blast.options import BlastOptions
    from paramedic.blast.programs import PROGRAMS
    from paramedic.db.locate import files_to_digest
    from paramedic.db.spread import accept, assign, digest_share, leaders
    from paramedic.db.trust import DigestStore

    shares: dict[int, list[str]] | None = None
    if comm.Get_rank() == 0 and measured is not None:
        hosts = [host for host, _ in measured]
        program = PROGRAMS.get(settings.program)
        if len(set(hosts)) > 1 and program is not None:
            try:
                arg = BlastOptions.parse(program.name, settings.blast_args).get("db")
            except (ParamedicError, ValueError):
                arg = None  # prepare_job says why
            files = files_to_digest(arg, settings.cwd, program.db_type) if arg else []
            shares = assign(files, leaders(hosts)) or None
    shares = comm.bcast(shares, root=0)
    if shares is None:
        return None
    started = time.perf_counter()
    mine = digest_share(shares.get(comm.Get_rank(), []))
    seconds = time.perf_counter() - started
    gathered = comm.gather((mine, round(seconds, 3)), root=0)
    if comm.Get_rank() != 0:
        return None
    taken, size = accept([d for results, _ in gathered for d in results], DigestStore())
    per_rank = {str(r): {"files": len(shares[r]), "seconds": gathered[r][1]} for r in sorted(shares)}
    return {"nodes": len(shares), "files": taken, "bytes": size, "per_rank": per_rank}


def _run_whole_on_ranks(job: Any, settings: SearchSettings, argv: list[str], comm: Any) -> int:
    """The blast plan on MPI ranks of one node: rank 0 runs BLAST+ with a thread per worker rank, the
    others wait for it without spinning (a blocking MPI wait busy-polls a core BLAST+ needs)."""
    from paramedic.blast.forkserver import close_fork_servers
    from paramedic.engine.job.shell import conclude

    close_fork_servers()  # started while rank 0 prepared the job: no task will use them
    if comm.Get_rank() == 0:
        from paramedic.engine.job.whole import run_whole

        record = run_whole(job, ["paramedic", *argv], settings.cwd, ranks=comm.Get_size())
        record.runner = "mpi"
        conclude(record, job, settings.report)
    done = comm.Ibarrier()
    while not done.Test():
        time.sleep(0.05)
    return 0
