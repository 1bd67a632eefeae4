"""The local job's own temporary directory, and the processes it starts (BLAST+ runs, fork servers).

Apart from the runner (paramedic.engine.runtime.local) so that the launcher can make the directory, and start
the BLAST+ fork servers in it, before it imports the engine: a fork server's own start (exec, dynamic
linking) then overlaps the imports instead of delaying the first search (docs/DESIGN.md, "The local
runner").
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def stop_children(wait_seconds: float = 2.0) -> None:
    """Kill every process this one started, and theirs (BLAST+ runs and their fork servers), and wait
    (at most `wait_seconds`) until they have ended: a killed process takes a moment to go, and the job's
    end must not be seen before its searches'."""
    pidfds: list[int] = []
    for pid in _descendants(os.getpid()):
        try:
            pidfds.append(os.pidfd_open(pid))  # before the kill: the number cannot be reused meanwhile
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait_seconds
    try:
        for fd in pidfds:  # readable once the process has ended
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for fd in pidfds:
            os.close(fd)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    children = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            stack.extend(children)
    return found


@contextmanager
def job_directory(job_id_variable: str) -> Iterator[Path]:
    """A temporary directory of the job's own, made TMPDIR for this process and every BLAST+ run, named
    as the MPI launcher names its (so a later run removes what a killed one left); SIGTERM and SIGHUP
    become interrupts while it is in use."""
    from paramedic.engine.runtime.leftovers import JOB_PREFIX, note_launcher, remove_leftovers

    remove_leftovers(Path(tempfile.gettempdir()))  # what launchers killed outright left
    job_dir = Path(tempfile.mkdtemp(prefix=JOB_PREFIX))
    saved = {name: os.environ.get(name) for name in ("TMPDIR", job_id_variable)}
    previous: dict[int, Any] = {}
    try:
        note_launcher(job_dir)
        (job_dir / "tmp").mkdir()
        os.environ["TMPDIR"] = str(job_dir / "tmp")
        os.environ[job_id_variable] = secrets.token_hex(6)
        tempfile.tempdir = None  # read TMPDIR again
        previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        yield job_dir
    except BaseException:
        stop_children()  # whatever BLAST+ runs are left, before their directory goes
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = None
        shutil.rmtree(job_dir, ignore_errors=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
