"""Running many small BLAST+ jobs without paying BLAST+'s ~35 ms start-up each time.

`native/forkserver.c` is an LD_PRELOAD shim that turns a BLAST+ program into a fork server: started once,
it forks a child per request that runs the program's real main() with the request's arguments. Output is
that of a fresh process (the children are fresh processes; only the static initialisation before main()
is shared), and the tests check it byte for byte against plain BLAST+.

The shim is compiled on first use with the system C compiler into the user's cache directory. Without a
compiler, or with PARAMEDIC_FORKSERVER=0, BLAST+ is started normally for every run.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import select
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from paramedic.cache import cache_dir

SOURCE = Path(__file__).with_name("native") / "forkserver.c"
MAX_REQUEST = 1 << 20


PRELIM_SOURCE = Path(__file__).with_name("native") / "prelim.c"


@functools.cache
def prelim_shim() -> Path | None:
    """The preliminary-list shim (paramedic.blast.prelim), compiled; None without a C compiler. Here
    because fork servers preload it too (paramedic.blast.tools)."""
    return compiled(PRELIM_SOURCE)


@functools.cache
def shim_path() -> Path | None:
    """The compiled shim, built once per source version; None when it cannot be had."""
    if os.environ.get("PARAMEDIC_FORKSERVER", "1") == "0":
        return None
    return compiled(SOURCE)


def compiled(
    source: Path,
    compiler: str | None = None,
    flags: tuple[str, ...] = ("-ldl",),
    depends: tuple[Path, ...] = (),
    variant: str = "",
) -> Path | None:
    """A preload library built from `source` (and the headers in `depends`) once per source version and
    `variant` into the user's cache, with `compiler` (the system C compiler by default) and `flags`; None
    without the compiler (or when it fails)."""
    try:
        text = source.read_bytes() + b"".join(d.read_bytes() for d in depends)
    except OSError:
        return None
    cache = cache_dir("native")
    key = hashlib.sha256(text + variant.encode() + " ".join(flags).encode()).hexdigest()[:16]
    target = cache / f"{source.stem}{'-' + variant if variant else ''}-{key}.so"
    if variant == "" and flags == ("-ldl",):
        target = cache / f"{source.stem}-{hashlib.sha256(text).hexdigest()[:16]}.so"
    if target.is_file():
        return target
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=cache)
        os.close(fd)
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", tmp, str(source), *flags], capture_output=True
        )
        if proc.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, target)
    except OSError:
        return None
    return target


# The deadline of this thread's fork-served runs (`bounded`), or none.
_bound = threading.local()


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Every BLAST+ run through this thread's fork server inside the block ends within `seconds` of the
    block's start, or its server is killed, the run fails (TimeoutError) and the thread's next run gets a
    new server. The storage site bounds a regeneration so (serve --regen-timeout): its housekeeping kills
    the BLAST+ processes in the job's scratch directory, but a server that stopped answering (SIGSTOPped,
    or hung before it forked) runs nothing there, and its I/O worker thread waited for the reply for good."""
    previous = getattr(_bound, "deadline", None)
    _bound.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _bound.deadline = previous


class ForkServer:
    """One BLAST+ program held ready to fork; requests are served one at a time. A server that failed a
    request (it died, or missed a `bounded` deadline and was killed) is `broken`: `server_for` replaces it."""

    def __init__(self, executable: str, shim: Path, preload: str | None = None):
        self.broken = False
        request_read, self._requests = os.pipe()
        self._replies, reply_write = os.pipe()
        env = dict(os.environ)
        # the fork server's shim first, then any other preload the caller asks for
        env["LD_PRELOAD"] = ":".join(p for p in (str(shim), preload) if p)
        env["PARAMEDIC_FORKSERVER_FDS"] = f"{request_read},{reply_write}"
        self._proc = subprocess.Popen(
            [executable],
            env=env,
            pass_fds=(request_read, reply_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        os.close(request_read)
        os.close(reply_write)

    def run(
        self,
        argv: list[str],
        cwd: str,
        stdout_path: str,
        stderr_path: str,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Run `argv` (argv[0] is the program name) in a forked child, with `env` added to its
        environment; its exit status."""
        assignments = [f"{k}={v}" for k, v in (env or {}).items()]
        if any("=" in k or not k for k in env or {}):
            raise ValueError("an environment variable name with '=' or empty")
        fields = [cwd, stdout_path, stderr_path, str(len(assignments)), *assignments, *argv]
        if any("\0" in f for f in fields):
            raise ValueError("NUL byte in a BLAST+ argument")
        payload = b"".join(f.encode() + b"\0" for f in fields)
        if len(payload) > MAX_REQUEST:
            raise ValueError("BLAST+ command line too long for the fork server")
        deadline = getattr(_bound, "deadline", None)
        try:
            _write_all(self._requests, struct.pack("=I", len(payload)) + payload, deadline)
            reply = _read_exactly(self._replies, 4, deadline)
        except TimeoutError as exc:
            self.kill()
            raise TimeoutError(f"BLAST+ fork server {exc}: killed") from exc
        except OSError as exc:
            self.broken = True
            raise BrokenPipeError(f"BLAST+ fork server stopped: {exc}") from exc
        return struct.unpack("=i", reply)[0]

    def alive(self) -> bool:
        return not self.broken and self._proc.poll() is None

    def kill(self) -> None:
        """Kill the server (stopped or not: SIGKILL ends both) and reap it; a BLAST+ it forked runs on in its
        working directory, where its caller's clean-up finds it (the site's job scratch)."""
        self.broken = True
        self.hang_up()
        try:
            self._proc.kill()
        except OSError:
            pass
        self.reap(time.monotonic() + 5)

    def close(self) -> None:
        self.hang_up()
        self.reap(time.monotonic() + 5)

    def hang_up(self) -> None:
        """End of input: the server exits (a run in progress ends first). Once: a descriptor number closed
        twice may by then be another file's."""
        fds, self._requests, self._replies = (self._requests, self._replies), -1, -1
        for fd in fds:
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass

    def reap(self, deadline: float) -> None:
        """Wait for the server to exit (killed at `deadline`), woken by its exit, not by polling
        (Popen.wait with a timeout sleeps 1, 2, 4 ... 50 ms between looks)."""
        try:
            pidfd = os.pidfd_open(self._proc.pid)
        except OSError:  # already reaped, or a kernel without pidfds
            pidfd = None
        if pidfd is not None:
            try:
                select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
            finally:
                os.close(pidfd)
        try:
            self._proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _wait_for(fd: int, writing: bool, deadline: float | None) -> None:
    """Until `fd` is ready, or TimeoutError at `deadline` (None: no bound)."""
    poller = select.poll()  # not select(): a site holding many connections has descriptors over 1024
    poller.register(fd, select.POLLOUT if writing else select.POLLIN)
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
    if not poller.poll(remaining):
        raise TimeoutError("did not answer in time (a bounded run: serve --regen-timeout)")


def _write_all(fd: int, data: bytes, deadline: float | None) -> None:
    """All of `data` to a pipe the server may have stopped reading: in pieces as it makes room."""
    view = memoryview(data)
    while view:
        _wait_for(fd, True, deadline)
        os.set_blocking(fd, False)
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            written = 0
        finally:
            os.set_blocking(fd, True)
        view = view[written:]


def _read_exactly(fd: int, n: int, deadline: float | None = None) -> bytes:
    data = b""
    while len(data) < n:
        _wait_for(fd, False, deadline)
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise OSError("end of file")
        data += chunk
    return data


# One fork server per program, environment and thread: a server handles one request at a time, and the
# storage site regenerates on several I/O worker threads at once.
_servers: dict[tuple[str, str | None, int], ForkServer] = {}
# Servers started ahead of the threads that will use them (`prestart`), by program and preload.
_spares: dict[tuple[str, str | None], list[ForkServer]] = {}
_servers_lock = threading.Lock()


def server_for(executable: str, preload: str | None = None) -> ForkServer | None:
    """This thread's fork server for a program and another preloaded library (a spare `prestart` began,
    else started now), or None. Everything else a run needs in its environment goes with its request."""
    shim = shim_path()
    if shim is None:
        return None
    key = (executable, preload, threading.get_ident())
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and not server.alive():  # it died, or was killed at a deadline: a new one
            server.kill()
            server = None
        if server is None:
            spares = _spares.get((executable, preload))
            server = _servers[key] = spares.pop() if spares else ForkServer(executable, shim, preload)
        return server


def prestart(executable: str, preload: str | None, count: int) -> None:
    """Start `count` servers now, for the threads that will ask for them (`server_for`): a server's own
    start (exec, dynamic linking, static initialisers: ~40 ms) then overlaps the job's preparation
    instead of delaying its first search."""
    shim = shim_path()
    if shim is None:
        return
    with _servers_lock:
        spares = _spares.setdefault((executable, preload), [])
        while len(spares) < count:
            spares.append(ForkServer(executable, shim, preload))


@atexit.register
def close_fork_servers() -> None:
    """Stop this process's fork servers, spares included (they restart on next use)."""
    with _servers_lock:
        servers = [*_servers.values(), *(s for spares in _spares.values() for s in spares)]
        for server in servers:  # all told first, so that they exit side by side
            server.hang_up()
        deadline = time.monotonic() + 5
        for server in servers:
            server.reap(deadline)
        _servers.clear()
        _spares.clear()
