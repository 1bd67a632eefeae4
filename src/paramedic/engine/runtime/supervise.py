"""The embedded mpiexec, supervised: the launching process stops it on an interrupt or a closed stdout,
kills a job whose MPI did not start, says one line when the job fails, and removes what a stopped or
killed job leaves behind (stragglers, MPI's shared memory, hydra's files, the hidden partial output)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.runtime.ending import output_path
from paramedic.engine.runtime.jobvars import JOB_ID_VARIABLE
from paramedic.engine.runtime.relay import Bar, Either, read_file, relay_stderr, relay_stdout
from paramedic.errors import JobError

# Seconds mpiexec gets to stop its ranks after an interrupt before it is killed.
STOP_SECONDS = 10.0
# How long the launcher waits for every rank to come out of MPI_Init (each notes its pid in the ranks
# directory then). MPICH's start hung for good in 1 of 22 runs here (every rank spinning in
# PMPI_Init_thread for over 6 minutes: the soak's silent 406 s hang); one machine's ranks start in well
# under a second. A job whose MPI did not start is stopped and started once more.
MPI_START_SECONDS = 60.0
MPI_START_VARIABLE = "PARAMEDIC_MPI_START_SECONDS"  # another bound, in seconds (tests)


def mpi_start_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get(MPI_START_VARIABLE, MPI_START_SECONDS)))
    except ValueError:
        return MPI_START_SECONDS


def supervise(
    command: list[str], env: dict[str, str], job_dir: Path, show_bar: bool, ranks: int
) -> int | None:
    """Run mpiexec in a session of its own (a terminal's Ctrl-C reaches only us; we stop the job). None
    when MPI did not start (`ranks` ranks out of MPI_Init) within `mpi_start_seconds`: every process of
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
    bar = Bar(job_dir / "progress") if show_bar else None
    exit_string: list[bytes] = []
    said: list[bytes] = []  # paramedic's own error lines the ranks printed
    stopping = Either(watch.interrupted, watch.closed, watch.stuck)  # complaints while stopped: not shown
    relays = [
        threading.Thread(target=relay_stdout, args=(proc.stdout, exit_string, watch.closed), daemon=True),
        threading.Thread(target=relay_stderr, args=(proc.stderr, bar, said, stopping), daemon=True),
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
    return _outcome(watch, code, said, job_dir, exit_string)


def _outcome(
    watch: _Watch, code: int, said: list[bytes], job_dir: Path, exit_string: list[bytes]
) -> int | None:
    """What the supervised job comes to, once mpiexec and its relays are done (`supervise`)."""
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
    MPI_Init past `mpi_start_seconds` answers no signal: kill every process of the job). Each list holds
    when that happened, once it has."""

    def __init__(self, proc: subprocess.Popen[bytes], ranks_dir: Path, ranks: int, job_id: str):
        self.proc = proc
        self.ranks_dir = ranks_dir
        self.ranks = ranks
        self.job_id = job_id
        self.start_by: float | None = time.monotonic() + mpi_start_seconds()
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
    message = read_file(job_dir / "error.txt")
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


# MPICH's hydra writes its hardware topology to this file name in /tmp (not $TMPDIR) and removes it when it
# ends normally; a stopped or killed mpiexec leaves it.
_HYDRA_TOPOLOGY = "hydra_hwloc_xmlfile_"


def hydra_files() -> set[str]:
    try:
        return {n for n in os.listdir("/tmp") if n.startswith(_HYDRA_TOPOLOGY)}
    except OSError:
        return set()


def remove_hydra_files(before: set[str], started: float) -> None:
    """After a failed or stopped job: the topology files that appeared while our mpiexec ran, are ours
    (the user's) and were not touched since it ended. Another mpiexec started meanwhile on this machine
    may have made one of them; its proxies read it only as they start."""
    uid = os.getuid()
    for name in hydra_files() - before:
        path = Path("/tmp", name)
        try:
            info = path.lstat()
            if info.st_uid == uid and info.st_mtime >= started - 1 and path.is_file():
                path.unlink()
        except OSError:
            pass


def remove_partial(settings: SearchSettings, job_id: str) -> None:
    """A rank killed while writing leaves `.<out>.partial-<job id>` beside the output: remove it."""
    path = output_path(settings)
    if settings.ship is not None or path is None:
        return
    try:
        path.with_name(f".{path.name}.partial-{job_id}").unlink(missing_ok=True)
    except OSError:
        pass
