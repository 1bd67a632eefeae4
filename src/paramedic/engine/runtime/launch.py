"""Starting the job: under a given mpiexec/srun, as threads of this process, or under the embedded mpiexec.

Without an MPI launcher, `paramedic search` runs on all local cores: as worker threads of this process
(paramedic.engine.runtime.local, `--runner local`, the default unless an option needs ranks), or by starting
`mpiexec -n <cores + 1>` (one master, one worker per core; `--runner mpi`) from the project's own MPI
(the `mpich` wheel in the virtual environment), falling back to an mpiexec on PATH. Under a launcher it uses the ranks it is given (a
process with PMI variables is a rank); a task of `srun` without them (no `--mpi=pmi2`) is refused.

The launching process owns the terminal and the clean-up (paramedic.engine.runtime.supervise, with the
ranks' output and the progress bar in paramedic.engine.runtime.relay): it draws the progress bar (rank 0
writes its count to a file; a rank's stderr is not a terminal under mpiexec), passes the ranks' output
through without MPICH's own abort lines and banner, prints one message when the job fails, and removes
what a killed job leaves behind: every rank's temporary files live in one directory of its own (TMPDIR),
and the hidden partial output is named after the job. What each rank runs is
paramedic.engine.runtime.on_ranks.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.runtime.ending import failure, say_journal_kept
from paramedic.engine.runtime.jobvars import (
    ERROR_FILE_VARIABLE,
    JOB_ID_VARIABLE,
    LAUNCHED_VARIABLE,
    PROGRESS_FILE_VARIABLE,
    RANKS_DIR_VARIABLE,
)
from paramedic.engine.runtime.on_ranks import run_under_mpi
from paramedic.engine.runtime.supervise import (
    MPI_START_VARIABLE,
    hydra_files,
    mpi_start_seconds,
    remove_hydra_files,
    remove_partial,
    supervise,
)
from paramedic.errors import JobError, ParamedicError, UsageError

if TYPE_CHECKING:
    from paramedic.db.manifest import Verification

# Environment variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's srun) set in each rank.
MPI_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")


def under_mpi() -> bool:
    return any(name in os.environ for name in (*MPI_RANK_VARIABLES, LAUNCHED_VARIABLE))


# A rank's number as its launcher sets it (MPICH/Hydra and Slurm's PMI-2, Open MPI, PMIx).
RANK_NUMBER_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def another_rank() -> bool:
    """A rank of an MPI job other than rank 0, by its launcher's word: every rank parses the same command
    line, so a refusal found there is said by rank 0 alone (under `srun -n 6`, once, not six times)."""
    for name in RANK_NUMBER_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value) != 0
    return False


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
        return run_under_mpi(settings, argv, np_ignored=workers is not None)
    if "SLURM_STEP_ID" in os.environ and "SLURM_STEP_NUM_TASKS" in os.environ:
        return refuse_srun_without_pmi()
    workers = workers or local_cores()
    if settings.runner == "local" or (settings.runner == "auto" and settings.needs_mpi is None):
        return run_local(settings, workers, argv)
    check_before_launch(settings)
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise JobError("mpiexec not found: run `make setup` (installs MPICH in .venv) or install an MPI")
    ranks = workers + 1
    from paramedic.engine.runtime.leftovers import JOB_PREFIX, note_launcher, remove_leftovers

    remove_leftovers(Path(tempfile.gettempdir()))  # what launchers killed outright left
    job_dir = Path(tempfile.mkdtemp(prefix=JOB_PREFIX))
    job_id = secrets.token_hex(6)
    try:
        note_launcher(job_dir)
        (job_dir / "tmp").mkdir()
        (job_dir / "ranks").mkdir()
        env = dict(
            os.environ,
            **{
                LAUNCHED_VARIABLE: "1",
                ERROR_FILE_VARIABLE: str(job_dir / "error.txt"),
                PROGRESS_FILE_VARIABLE: str(job_dir / "progress"),
                JOB_ID_VARIABLE: job_id,
                RANKS_DIR_VARIABLE: str(job_dir / "ranks"),
                "TMPDIR": str(job_dir / "tmp"),  # every rank's, BLAST+'s and hydra's temporary files
            },
        )
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "paramedic", *argv]
        hydra_before, started = hydra_files(), time.time()
        show_bar = not settings.quiet and sys.stderr.isatty()
        code = supervise(command, env, job_dir, show_bar, ranks)
        if code is None:  # MPI did not start: once more, from a clean job directory
            print(
                f"paramedic: warning: MPI did not start within {mpi_start_seconds():.0f} s (a rank hung "
                "in MPI_Init); the job was stopped and is started again",
                file=sys.stderr,
                flush=True,
            )
            for part in ("tmp", "ranks"):
                shutil.rmtree(job_dir / part, ignore_errors=True)
                (job_dir / part).mkdir()
            code = supervise(command, env, job_dir, show_bar, ranks)
            if code is None:
                print(
                    f"paramedic: error: MPI did not start within {mpi_start_seconds():.0f} s, twice (a rank "
                    f"hung in MPI_Init; {MPI_START_VARIABLE} sets the bound); every rank was stopped",
                    file=sys.stderr,
                    flush=True,
                )
                code = JobError.exit_code
        if code != 0:
            remove_hydra_files(hydra_before, started)
    finally:
        remove_partial(settings, job_id)
        shutil.rmtree(job_dir, ignore_errors=True)
    if code != 0:
        say_journal_kept(settings)
    return code


def run_local(settings: SearchSettings, workers: int, argv: list[str]) -> int:
    """The job as threads of this process (paramedic.engine.runtime.local): no MPI, no other interpreter. Ends
    as the MPI launcher's job does: one line for an error or an interrupt, then whether finished work is
    kept in the journal."""
    from paramedic.blast.tools import prestart
    from paramedic.engine.core.settings import LOCAL_WORKERS_VARIABLE
    from paramedic.engine.runtime.jobdir import job_directory

    try:
        with job_directory(JOB_ID_VARIABLE):  # TMPDIR is the job's from here, for every BLAST+ run
            # BLAST+'s resolution of -db, the workers' fork servers and the database's digest start before
            # the engine is imported: their own starts overlap the imports and the job's checks
            # (docs/DESIGN.md, "The local runner"); the fork servers only for a job the engine will run
            # (`--strategy auto` may run one BLAST+ instead, issue 44)
            prefetched = _prefetch_info(settings)
            if settings.strategy != "auto" or settings.engine_asked() is not None:
                prestart(settings.program, workers)
            # a database of the earlier layout: its digest starts in a child now, while the job's modules
            # load; one in place is digested as it is resolved (its files' digests remembered), once -info
            # has answered, and its modules load meanwhile
            early = None if prefetched else _early_digest(settings)
            from paramedic.engine.job.job import prepare_job

            os.environ[LOCAL_WORKERS_VARIABLE] = str(workers)
            # with worker threads the digest overlaps the first searches (their loop looks at it)
            job = prepare_job(
                settings,
                workers=workers,
                digest="later" if workers > 1 else "now",
                early=early,
                one_node=True,
            )
            if job.strategy is not None and job.strategy.whole_blast:  # one BLAST+ run (issue 44)
                from paramedic.blast.forkserver import close_fork_servers
                from paramedic.engine.job.whole import run_whole
                from paramedic.report.publish import finish

                close_fork_servers()  # none, unless prestarted
                record = run_whole(job, ["paramedic", *argv], settings.cwd)
                finish(record, job.target.record, job.quiet, settings.report)
            else:
                from paramedic.engine.job.shell import conclude
                from paramedic.engine.runtime.local import run_local_job

                record = run_local_job(job, workers, ["paramedic", *argv])
                conclude(record, job, settings.report)
        return 0
    except BrokenPipeError:
        raise  # stdout's reader went away: quiet, exit 141 (paramedic.cli)
    except (KeyboardInterrupt, Exception) as exc:  # one line, as on a rank
        if os.environ.get("PARAMEDIC_DEBUG") and not isinstance(exc, (KeyboardInterrupt, ParamedicError)):
            raise  # a bug: PARAMEDIC_DEBUG=1 shows the traceback
        text, code = failure(exc)
        if isinstance(exc, KeyboardInterrupt):
            text += ": the job was stopped and its temporary files removed"
        print(f"paramedic: {text}", file=sys.stderr)
    finally:
        os.environ.pop(LOCAL_WORKERS_VARIABLE, None)
        from paramedic.db.blastdb import drop_prefetched

        drop_prefetched()
    sys.stderr.flush()
    say_journal_kept(settings)
    return code


def _prefetch_info(settings: SearchSettings) -> bool:
    """`blastdbcmd -info` of the job's -db started now, for the job's checks to read when they resolve
    it (paramedic.db.blastdb.prefetch_info); whether it was: not for a database in the layout of earlier
    `paramedic format` versions (its manifest says what -info would; its digest is what starts early),
    nor before the options name a -db."""
    from paramedic.blast.options import typed_value
    from paramedic.blast.programs import PROGRAMS
    from paramedic.db.blastdb import prefetch_info

    arg = typed_value(settings.blast_args, "db")
    program = PROGRAMS.get(settings.program)
    if not arg or program is None or (settings.cwd / arg / "manifest.json").is_file():
        return False
    return prefetch_info(arg, settings.cwd, program.db_type)


def _early_digest(settings: SearchSettings) -> Verification | None:
    """The -db database's digest, started in a child process before the engine is imported (a core is
    idle while the interpreter imports it and the job is checked: paramedic.db.manifest.Verification); None
    when the database cannot be found yet, which `prepare_job` then says in its own order."""
    from paramedic.blast.options import BlastOptions
    from paramedic.blast.programs import PROGRAMS
    from paramedic.db.locate import resolve_database
    from paramedic.db.manifest import Verification

    try:
        arg = BlastOptions.parse(settings.program, settings.blast_args).get("db")
        if not arg:
            return None
        program = PROGRAMS.get(settings.program)
        dbtype = program.db_type if program else None
        db, manifest = resolve_database(arg, settings.cwd, digest=False, dbtype=dbtype)
        return Verification(db.directory, manifest, child=True)
    except (ParamedicError, OSError, ValueError):
        return None


def refuse_srun_without_pmi() -> int:
    """A task of `srun` with no MPI plugin (`--mpi=none`, Slurm's default): there is no PMI to join the
    step's tasks into one MPI job, so each would start an mpiexec of its own, which inside the step waits
    for CPUs the step holds (seen: "step creation temporarily disabled", for ever). One line, from the
    step's first task; the others exit with the same code."""
    error = UsageError(
        "started by srun without an MPI plugin, so its tasks cannot join one MPI job: run "
        "`srun --mpi=pmi2 paramedic ...` (`srun --mpi=list` shows the plugins), or `paramedic search` "
        "without srun to use this node's cores"
    )
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return error.exit_code
    raise error


def check_before_launch(settings: SearchSettings) -> None:
    """Before MPI starts: the options, the -outfmt, the database and the option values (BLAST+ checks
    them); what cannot be checked here yet is left to rank 0, which checks everything again."""
    from paramedic.blast.options import CHECKED_VARIABLE, BlastOptions, check_values
    from paramedic.blast.programs import PROGRAMS
    from paramedic.db.locate import resolve_database
    from paramedic.db.subset import with_absolute_lists
    from paramedic.engine.job.job import check_outfmt

    program = PROGRAMS.get(settings.program)
    if program is None:
        return
    # list files named from the user's directory: BLAST+ checks the values elsewhere (-taxidlist
    # taxids.txt under mpiexec was "File is not acessible", exit 2)
    options = with_absolute_lists(BlastOptions.parse(program.name, settings.blast_args), settings.cwd)
    check_outfmt(program.name, options)
    if not options.get("db"):
        return
    db, manifest = resolve_database(  # rank 0 digests
        options.get("db") or "", settings.cwd, digest=False, dbtype=program.db_type
    )
    if db.dbtype != program.db_type:
        return
    check_values(program.name, options, db.checked(), manifest.checksum())
    os.environ[CHECKED_VARIABLE] = "1"
