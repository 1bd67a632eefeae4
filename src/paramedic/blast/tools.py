"""Finding and running BLAST+ executables, with failures turned into one-line errors."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from paramedic.blast.forkserver import ForkServer, prelim_shim, server_for
from paramedic.blast.forkserver import prestart as prestart_servers  # tools.prestart: by program
from paramedic.cache import file_key, read_cached, write_cached
from paramedic.errors import BlastError

# The programs run many times per job; makeblastdb and blastdbcmd run a few times and start normally.
FORK_SERVED = frozenset({"blastn", "blastp", "blastx", "tblastn", "tblastx", "blast_formatter"})


@functools.cache
def require_tool(name: str) -> str:
    """Absolute path of a BLAST+ executable, or a clear error naming the package to install."""
    path = shutil.which(name)
    if path is None:
        raise BlastError(
            f"{name} not found on PATH: install NCBI BLAST+ (Debian: apt-get install ncbi-blast+)"
        )
    return path


@functools.cache
def blast_version() -> str:
    """The BLAST+ version string, e.g. '2.12.0+', recorded in manifests and run records."""
    out = run_tool(["blastn", "-version"]).stdout.decode()
    first = out.splitlines()[0] if out else ""
    return first.split(":", 1)[-1].strip()


@functools.cache
def expands_taxids(program: str) -> bool:
    """Whether this BLAST+ expands -taxids and -taxidlist to their descendant taxa (2.15 and later,
    through taxonomy4blast.sqlite3), seen by the feature itself: such a BLAST+ has -no_taxid_expansion,
    2.12 matches the taxids stored with each sequence exactly and has no such option."""
    return b"-no_taxid_expansion" in run_tool([program, "-help"]).stdout


def taxid_matching(program: str, no_expansion: bool = False) -> dict[str, str]:
    """How the installed BLAST+ matches a job's taxids, for the run record."""
    version = blast_version()
    if not expands_taxids(program):
        how = "exact: the taxids stored with each sequence (this BLAST+ has no -no_taxid_expansion)"
    elif no_expansion:
        how = "exact: -no_taxid_expansion was given"
    else:
        how = "with descendants: each taxid and the taxa below it, through taxonomy4blast.sqlite3"
    return {"blast": version, "taxids_matched": how}


# A start-up measurement is reused this long (per executable and machine): it sizes plans only, and
# measuring it costs rank 0 about 0.2 s while every worker waits, a tenth of a one-query search.
STARTUP_REUSE_SECONDS = 6 * 3600


# The cache of start-up measurements; "startup" held wall seconds (see startup_seconds).
STARTUP_CACHE = "startup-cpu"


def startup_seconds(program: str) -> float:
    """Seconds of fixed cost per BLAST+ run on this machine (process start).

    Measured by starting the program plainly: the master runs no searches, so it starts no fork server
    of its own. Never taken below 40 ms, the cost of starting BLAST+ here without the fork server:
    batches stay large enough either way, and smaller query batches make BLAST+ scan each subject more
    often. The least of three starts, in CPU seconds (user and system) rather than wall: the plan weighs
    the start against searches' CPU (RATE), and a wall measured while the machine was busy for a moment
    (0.137 s for blastp against 0.05 s quiet) was kept for hours and changed plans (blastp, 1 query: 2
    searches instead of 4, 1.18x BLAST+'s wall instead of 1.13x). Kept in the user's cache for
    STARTUP_REUSE_SECONDS, keyed by the executable and the host.
    """
    exe = require_tool(program)
    key = f"{file_key(exe)}-{hashlib.sha256(os.uname().nodename.encode()).hexdigest()[:8]}"
    cached = read_cached(STARTUP_CACHE, key)
    if cached is not None:
        try:
            measured_at, value = (float(x) for x in cached.split())
            if 0 <= time.time() - measured_at < STARTUP_REUSE_SECONDS and 0.04 <= value < 60:
                return value
        except ValueError:
            pass  # measured again below, and the entry replaced
    value = max(0.04, min(_start_cpu_seconds(program, exe) for _ in range(3)))
    write_cached(STARTUP_CACHE, key, f"{time.time():.0f} {value:.6f}\n".encode())
    return value


def _start_cpu_seconds(program: str, exe: str) -> float:
    """CPU seconds (user and system) of one `exe -version`, read from its own rusage (os.wait4), so that
    no other child of this process counts."""
    try:
        proc = subprocess.Popen([exe, "-version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
    except OSError as exc:
        raise BlastError(f"cannot run `{program} -version`: {exc}") from exc
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise BlastError(f"cannot run `{program} -version`: exit status {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def prestart(program: str, count: int) -> None:
    """Start `count` fork servers for `program` before the threads that will use them exist (see
    forkserver.prestart); a problem is left for the first real run to report."""
    if program not in FORK_SERVED:
        return
    try:
        prestart_servers(require_tool(program), _preload(None), count)
    except (BlastError, OSError):
        pass


def warm_up(program: str) -> None:
    """Start this thread's fork server for `program` now, while there is nothing else to do."""
    if program not in FORK_SERVED:
        return
    try:
        server_for(require_tool(program), _preload(None))
    except (BlastError, OSError):
        pass  # the first real run reports the problem


def _preload(extra_env: Mapping[str, str] | None) -> str | None:
    """The library a fork server preloads: the caller's, else the preliminary-list shim when it builds.
    The shim only passes calls through unless a run's own environment sets PARAMEDIC_PRELIM, so one
    server per program and thread runs a job's every kind of search (fragment searches, pieces that
    align given lists, plain runs): each server costs a BLAST+ start (docs/DESIGN.md, "The local
    runner")."""
    if extra_env and "LD_PRELOAD" in extra_env:
        return extra_env["LD_PRELOAD"]
    library = prelim_shim()
    return str(library) if library is not None else None


def run_tool(
    argv: Sequence[str],
    cwd: str | os.PathLike[str] | None = None,
    stdout_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    stdin_path: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a BLAST+ program; a non-zero exit (even with empty output) becomes a BlastError. `stdin_path`:
    its standard input (programs that are not fork-served).

    BLAST+ exits 255 with empty output on some database errors, so the exit code is always checked.
    Search programs run through this process's fork server when it is available (see forkserver.py).
    """
    exe = require_tool(argv[0])
    server = server_for(exe, _preload(extra_env)) if argv[0] in FORK_SERVED else None
    env = dict(os.environ, **extra_env) if extra_env else None
    try:
        if server is not None:
            request = {k: v for k, v in (extra_env or {}).items() if k != "LD_PRELOAD"}
            proc = _run_forked(server, [argv[0], *argv[1:]], cwd, stdout_path, request)
        elif stdout_path is not None:
            with open(stdout_path, "wb") as out:
                proc = subprocess.run([exe, *argv[1:]], cwd=cwd, stdout=out, stderr=subprocess.PIPE, env=env)
        elif stdin_path is not None:
            with open(stdin_path, "rb") as given:
                proc = subprocess.run([exe, *argv[1:]], cwd=cwd, stdin=given, capture_output=True, env=env)
        else:
            proc = subprocess.run([exe, *argv[1:]], cwd=cwd, capture_output=True, env=env)
    except OSError as exc:
        raise BlastError(f"cannot run {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        raise BlastError(f"{argv[0]} failed (exit {proc.returncode}): {first_error_line(proc.stderr)}")
    return proc


def _run_forked(
    server: ForkServer,
    argv: list[str],
    cwd: str | os.PathLike[str] | None,
    stdout_path: Path | None,
    env: Mapping[str, str],
) -> subprocess.CompletedProcess[bytes]:
    # in the run's own working directory when it has one (a storage site's job scratch, a rank's work
    # directory): whoever clears that clears this too, also after a kill -9 (the site's restart empties
    # its scratch; in TMPDIR a killed site's run directories stayed for good)
    with tempfile.TemporaryDirectory(prefix="paramedic-run-", dir=cwd) as tmp:
        out = Path(stdout_path) if stdout_path is not None else Path(tmp) / "stdout"
        err = Path(tmp) / "stderr"
        code = server.run(argv, str(Path(cwd or ".").resolve()), str(out.resolve()), str(err), env)
        stdout = b"" if stdout_path is not None else out.read_bytes() if out.exists() else b""
        stderr = err.read_bytes() if err.exists() else b""
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def first_error_line(stderr: bytes) -> str:
    """The line of BLAST+'s stderr that says what went wrong (the first naming an error, else the first)."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else "no message"
