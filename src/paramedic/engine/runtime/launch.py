"""Starting the job: under a given mpiexec/srun, as threads of this process, or under the embedded mpiexec.

Without an MPI launcher, `paramedic search` runs on all local cores: as worker threads of this process
(paramedic.engine.runtime.local, `--runner local`, the default unless an option needs ranks), or by starting
`mpiexec -n <cores + 1>` (one master, one worker per core; `--runner mpi`) from the project's own MPI
(the `mpich` wheel in the virtual environment), falling back to an mpiexec on PATH. Under a launcher it uses the ranks it is given (a
process with PMI variables is a rank); a task of `srun` without them (no `--mpi=pmi2`) is refused.

The launching process owns the terminal and the clean-up: it draws the progress bar (rank 0 writes its
count to a file; a rank's stderr is not a terminal under mpiexec), passes the ranks' output through
without MPICH's own abort lines and banner, prints one message when the job fails, and removes what a
killed job leaves behind: every rank's temporary files live in one directory of its own (TMPDIR), and
the hidden partial output is named after the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from paramedic.blast.options import typed_value
from paramedic.engine.core.settings import SearchSettings
from paramedic.errors import InternalError, JobError, ParamedicError, UsageError

if TYPE_CHECKING:
    from paramedic.db.manifest import Verification

# Environment variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's srun) set in each rank.
MPI_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")
LAUNCHED_VARIABLE = "PARAMEDIC_LAUNCHED"
# Where a failing rank leaves its one-line message for the launching process: mpiexec may tear the job
# down before it forwards the rank's stderr, and the user must still see why the job failed.
ERROR_FILE_VARIABLE = "PARAMEDIC_ERROR_FILE"
# Where rank 0 writes "<queries written> <queries>" for the launcher's progress bar.
PROGRESS_FILE_VARIABLE = "PARAMEDIC_PROGRESS_FILE"
# Names this job's hidden partial output (output.writer.LocalFile), so the launcher can remove it.
JOB_ID_VARIABLE = "PARAMEDIC_JOB_ID"
# Where each rank notes its process id, so the launcher can wait for (or end) stragglers.
RANKS_DIR_VARIABLE = "PARAMEDIC_RANKS_DIR"
# Seconds mpiexec gets to stop its ranks after an interrupt before it is killed.
STOP_SECONDS = 10.0
# How long the launcher waits for every rank to come out of MPI_Init (each notes its pid in the ranks
# directory then). MPICH's start hung for good in 1 of 22 runs here (every rank spinning in
# PMPI_Init_thread for over 6 minutes: the soak's silent 406 s hang); one machine's ranks start in well
# under a second. A job whose MPI did not start is stopped and started once more.
MPI_START_SECONDS = 60.0
MPI_START_VARIABLE = "PARAMEDIC_MPI_START_SECONDS"  # another bound, in seconds (tests)
# MPICH prints these besides the ranks' own output: `Abort(5) on node 0 (rank 0 in comm 0): ...` on
# stderr, hydra's "BAD TERMINATION" banner on stdout. The launcher prints one paramedic line instead.
_MPICH_STDERR = re.compile(rb"^(Abort\(\d+\) on node |\[mpiexec@|\[proxy:)")
_BANNER_RULE = b"=" * 20
_BANNER_TITLE = b"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
_EXIT_STRING = re.compile(rb"TERMINATED WITH THE EXIT STRING: (.*)")


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
        hydra_before, started = _hydra_files(), time.time()
        show_bar = not settings.quiet and sys.stderr.isatty()
        code = _supervise(command, env, job_dir, show_bar, ranks)
        if code is None:  # MPI did not start: once more, from a clean job directory
            print(
                f"paramedic: warning: MPI did not start within {_mpi_start_seconds():.0f} s (a rank hung "
                "in MPI_Init); the job was stopped and is started again",
                file=sys.stderr,
                flush=True,
            )
            for part in ("tmp", "ranks"):
                shutil.rmtree(job_dir / part, ignore_errors=True)
                (job_dir / part).mkdir()
            code = _supervise(command, env, job_dir, show_bar, ranks)
            if code is None:
                print(
                    f"paramedic: error: MPI did not start within {_mpi_start_seconds():.0f} s, twice (a rank "
                    f"hung in MPI_Init; {MPI_START_VARIABLE} sets the bound); every rank was stopped",
                    file=sys.stderr,
                    flush=True,
                )
                code = JobError.exit_code
        if code != 0:
            _remove_hydra_files(hydra_before, started)
    finally:
        _remove_partial(settings, job_id)
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


def say_journal_kept(settings: SearchSettings) -> None:
    """After a failed or interrupted search: whether its finished work waits in a journal (what a killed
    rank left half-written there is removed)."""
    from paramedic.engine.rank.journal import journal_path, tidy

    out = _output_path(settings)
    journal = journal_path(out) if out is not None else None
    if journal is not None and journal.is_dir() and tidy(journal):
        print(
            f"paramedic: finished work is kept in {journal}: the same command continues the search, "
            "--restart starts it afresh",
            file=sys.stderr,
            flush=True,
        )


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


def _mpi_start_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get(MPI_START_VARIABLE, MPI_START_SECONDS)))
    except ValueError:
        return MPI_START_SECONDS


def _supervise(
    command: list[str], env: dict[str, str], job_dir: Path, show_bar: bool, ranks: int
) -> int | None:
    """Run mpiexec in a session of its own (a terminal's Ctrl-C reaches only us; we stop the job). None
    when MPI did not start (`ranks` ranks out of MPI_Init) within `_mpi_start_seconds`: every process of
    the job is then killed, and what MPI made in /dev/shm removed."""
    from paramedic.orphans import dies_with_this_process

    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=dies_with_this_process(),  # killed with us: its ranks never search for nobody
    )
    watch = _Watch(proc, job_dir / "ranks", ranks, env[JOB_ID_VARIABLE])
    previous = {s: signal.signal(s, watch.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    bar = _Bar(job_dir / "progress") if show_bar else None
    exit_string: list[bytes] = []
    said: list[bytes] = []  # paramedic's own error lines the ranks printed
    stopping = _Either(watch.interrupted, watch.closed, watch.stuck)  # complaints while stopped: not shown
    relays = [
        threading.Thread(target=_relay_stdout, args=(proc.stdout, exit_string, watch.closed), daemon=True),
        threading.Thread(target=_relay_stderr, args=(proc.stderr, bar, said, stopping), daemon=True),
    ]
    for t in relays:
        t.start()
    try:
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if bar is not None:
                    bar.update()
                watch.look()
        for t in relays:
            t.join(timeout=5)
        _end_stragglers(job_dir / "ranks")
        _remove_shared_memory(job_dir / "ranks")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if bar is not None:
            bar.close(success=False)
    if watch.stuck and not watch.interrupted:
        return None
    if watch.closed and not watch.interrupted:  # as BLAST+ into a closed pipe: no message, 141
        from paramedic.pipes import stdout_closed

        return stdout_closed()
    if watch.interrupted:
        print("paramedic: interrupted: the job was stopped and its temporary files removed", file=sys.stderr)
        return 130
    if code == 0 or said:  # a job refused before its search: rank 0 said why and every rank exited
        return code
    return _unexplained(code, job_dir, exit_string)


class _Watch:
    """What the launcher watches while mpiexec runs: an interrupt (stop the job), our stdout's reader
    gone (`| head -1`: stop it too), a stop that takes too long (kill it), and MPI's start (a rank in
    MPI_Init past `_mpi_start_seconds` answers no signal: kill every process of the job). Each list holds
    when that happened, once it has."""

    def __init__(self, proc: subprocess.Popen[bytes], ranks_dir: Path, ranks: int, job_id: str):
        self.proc = proc
        self.ranks_dir = ranks_dir
        self.ranks = ranks
        self.job_id = job_id
        self.start_by: float | None = time.monotonic() + _mpi_start_seconds()
        self.interrupted: list[float] = []  # when the first interrupt came
        self.closed: list[float] = []  # when our stdout's reader went away
        self.stuck: list[float] = []  # when the job was killed for a rank stuck in MPI_Init
        self.killed = False  # whether the job was killed for a stop that took too long

    def on_signal(self, signum: int, _frame: Any) -> None:
        if not self.interrupted:
            self.interrupted.append(time.monotonic())
        with contextlib.suppress(OSError):
            self.proc.send_signal(signal.SIGINT)  # hydra stops every rank

    def look(self) -> None:
        """One look while mpiexec runs (every 0.2 s)."""
        now = time.monotonic()
        if len(self.closed) == 1:  # nobody reads the report any more: stop the job
            self.closed.append(now)
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
        first = self.interrupted[0] if self.interrupted else self.closed[0] if self.closed else None
        if first is not None and now - first > STOP_SECONDS and not self.killed:
            # mpiexec did not stop its ranks in time: a rank still in MPI_Init answers no signal, and
            # neither killing mpiexec's group reaches it nor did it note the segment it made in /dev/shm
            self.killed = True
            _kill_job(self.job_id, self.proc.pid)
        if not self.stuck and self.start_by is not None and now > self.start_by:
            if _started(self.ranks_dir) >= self.ranks:
                self.start_by = None  # every rank is out of MPI_Init: no bound from here on
            else:  # a rank in MPI_Init answers no signal: kill every process of the job
                self.stuck.append(now)
                _kill_job(self.job_id, self.proc.pid)


def _unexplained(code: int, job_dir: Path, exit_string: list[bytes]) -> int:
    """A job that failed without a rank saying why on its way out: the error a rank left in the job's
    directory, else what mpiexec said of the rank that ended."""
    message = _read(job_dir / "error.txt")
    if message:
        print(message.splitlines()[0], file=sys.stderr, flush=True)
        return code
    why = exit_string[0].decode(errors="replace").strip() if exit_string else f"exit {code}"
    print(
        f"paramedic: error: a rank of the job ended without a message ({why}); every rank was stopped",
        file=sys.stderr,
        flush=True,
    )
    return JobError.exit_code


def _started(ranks_dir: Path) -> int:
    """Ranks out of MPI_Init: each notes its pid in the ranks directory then (`run_under_mpi`)."""
    try:
        return sum(1 for p in ranks_dir.iterdir() if p.name.isdigit())
    except OSError:
        return 0


def _kill_job(job_id: str, mpiexec: int) -> None:
    """Kill mpiexec's process group and every process of this user that carries the job's id in its
    environment (ranks hung in MPI_Init noted nothing, and outlive a killed hydra proxy), after removing
    the /dev/shm files they map (MPICH makes its segment in MPI_Init)."""
    from paramedic.engine.runtime.stopped import mapped_shared_memory

    mark = f"{JOB_ID_VARIABLE}={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid() or mark not in (entry / "environ").read_bytes().split(
                b"\0"
            ):
                continue
        except OSError:
            continue
        pids.append(int(entry.name))
        for name in mapped_shared_memory(entry.name):
            with contextlib.suppress(OSError):
                Path("/dev/shm", name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        os.killpg(mpiexec, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _end_stragglers(ranks_dir: Path) -> None:
    """Ranks (each a session of its own under hydra, with its BLAST+ processes) may outlive mpiexec by
    a moment after a kill: wait for them, then end their process groups, before anything is removed."""
    pids = [int(p.name) for p in ranks_dir.iterdir() if p.name.isdigit()]
    deadline = time.monotonic() + STOP_SECONDS / 2
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.05)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _remove_shared_memory(ranks_dir: Path) -> None:
    """MPICH unlinks its shared-memory segment in MPI_Finalize only: a job that aborts (any failure after
    MPI started) or is killed leaves it in /dev/shm, megabytes of memory for ever. The ranks noted what
    they map; once they are gone, what is left of it goes."""
    for note in ranks_dir.glob("shm.*"):
        name = note.name.removeprefix("shm.")
        if "/" not in name and name not in (".", ".."):
            try:
                Path("/dev/shm", name).unlink(missing_ok=True)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


class _Either:
    """True when either list holds something (read by the stderr relay: stop showing the ranks' lines)."""

    def __init__(self, *lists: list[float]):
        self.lists = lists

    def __bool__(self) -> bool:
        return any(self.lists)


def _relay_stdout(stream: IO[bytes], exit_string: list[bytes], closed: list[float]) -> None:
    """The ranks' stdout (the report with `-out -`) passes through; hydra's banner stops it. When our
    own stdout is closed (`| head -1`) the rest is read and dropped, so that no rank blocks writing it,
    and `closed` tells the supervisor to stop the job."""
    try:
        _pass_stdout(stream, exit_string)
    except (BrokenPipeError, ValueError):
        closed.append(time.monotonic())
        for _ in iter(functools.partial(stream.read, 1 << 16), b""):
            pass


def _pass_stdout(stream: IO[bytes], exit_string: list[bytes]) -> None:
    out = sys.stdout.buffer
    held: list[bytes] = []  # an empty line or a rule that may start the banner
    in_banner = False
    for line in iter(stream.readline, b""):
        if in_banner:
            m = _EXIT_STRING.search(line)
            if m:
                exit_string.append(m.group(1))
            continue
        if line.startswith(b"[mpiexec@"):  # hydra's own notes, e.g. "Sending Ctrl-C to processes"
            continue
        if _BANNER_TITLE in line:
            in_banner = True
            held.clear()
            continue
        if line.strip() == b"" or line.startswith(_BANNER_RULE):
            held.append(line)
            continue
        for h in held:
            out.write(h)
        held.clear()
        out.write(line)
        out.flush()
    for h in held:
        out.write(h)
    out.flush()


def _relay_stderr(stream: IO[bytes], bar: _Bar | None, said: list[bytes], interrupted: _Either) -> None:
    for line in iter(stream.readline, b""):
        if _MPICH_STDERR.match(line) or interrupted:  # once interrupted, the launcher alone says so
            continue
        if line.startswith((b"paramedic: error:", b"paramedic: internal error:")):
            said.append(line)
        if bar is not None:
            bar.write(line.decode(errors="replace").rstrip("\n"))
        else:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()


class _Bar:
    """The progress bar, drawn by the launcher from the count rank 0 writes."""

    def __init__(self, path: Path):
        self.path = path
        self.bar: Any = None
        self.closed = False
        self.lock = threading.Lock()

    def update(self) -> None:
        fields = _read(self.path).split()
        if len(fields) not in (2, 3) or not all(f.isdigit() for f in fields[:2]):
            return
        done, total = int(fields[0]), int(fields[1])
        unit = fields[2] if len(fields) == 3 else "query"
        with self.lock:
            if self.closed:  # the summary is printed: no bar after it
                return
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit=unit, desc="paramedic", file=sys.stderr)
            self.bar.update(done - self.bar.n)

    def write(self, text: str) -> None:
        """A line of the ranks' above the bar; once the bar is full (the summary comes), the bar is closed
        at 100% first: it stays above the summary and is never drawn again."""
        self.update()
        with self.lock:
            if self.bar is not None and self.bar.n >= self.bar.total:
                self.bar.close()
                self.bar = None
                self.closed = True
            if self.bar is None:
                print(text, file=sys.stderr, flush=True)
            else:
                self.bar.write(text, file=sys.stderr)

    def close(self, success: bool) -> None:
        with self.lock:
            self.closed = True
            if self.bar is not None:
                self.bar.close()
                self.bar = None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _output_path(settings: SearchSettings) -> Path | None:
    """The local output file (with --site: the run record's stem, the path under the site's root)."""
    if settings.ship is not None:
        return settings.cwd / settings.ship.out
    args = settings.blast_args
    out = typed_value(args, "out")
    if not out or out == "-":
        return None
    return Path(out) if Path(out).is_absolute() else settings.cwd / out


# MPICH's hydra writes its hardware topology to this file name in /tmp (not $TMPDIR) and removes it when it
# ends normally; a stopped or killed mpiexec leaves it.
_HYDRA_TOPOLOGY = "hydra_hwloc_xmlfile_"


def _hydra_files() -> set[str]:
    try:
        return {n for n in os.listdir("/tmp") if n.startswith(_HYDRA_TOPOLOGY)}
    except OSError:
        return set()


def _remove_hydra_files(before: set[str], started: float) -> None:
    """After a failed or stopped job: the topology files that appeared while our mpiexec ran, are ours
    (the user's) and were not touched since it ended. Another mpiexec started meanwhile on this machine
    may have made one of them; its proxies read it only as they start."""
    uid = os.getuid()
    for name in _hydra_files() - before:
        path = Path("/tmp", name)
        try:
            info = path.lstat()
            if info.st_uid == uid and info.st_mtime >= started - 1 and path.is_file():
                path.unlink()
        except OSError:
            pass


def _remove_partial(settings: SearchSettings, job_id: str) -> None:
    """A rank killed while writing leaves `.<out>.partial-<job id>` beside the output: remove it."""
    path = _output_path(settings)
    if settings.ship is not None or path is None:
        return
    try:
        path.with_name(f".{path.name}.partial-{job_id}").unlink(missing_ok=True)
    except OSError:
        pass


def failure(exc: BaseException) -> tuple[str, int]:
    """What ended a job, as the one line after `paramedic: ` and the exit code (a rank's, the local
    runner's)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(exc, ParamedicError):
        return f"error: {exc}", exc.exit_code
    code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else InternalError.exit_code
    return f"error: internal error: {type(exc).__name__}: {exc} (PARAMEDIC_DEBUG=1 shows more)", code


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
    from paramedic.engine.core.strategy import job_memory, node_memory
    from paramedic.engine.job.job import prepare_job
    from paramedic.engine.job.shell import conclude
    from paramedic.engine.runtime.roles import run_job

    rank = comm.Get_rank()
    job = failure = None
    if rank != 0:
        warm_up(settings.program)  # this worker's BLAST+ fork server starts while rank 0 checks the job
    measured = comm.gather(node_memory(), root=0)  # each node's own memory and cgroup count (auto)
    spread = _spread_first_digest(settings, comm, measured)
    if rank == 0:
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
            failure = InternalError(
                f"internal error: {type(exc).__name__}: {exc} (PARAMEDIC_DEBUG=1 shows more)"
            )
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
