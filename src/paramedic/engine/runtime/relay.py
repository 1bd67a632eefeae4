"""The ranks' output passed through the launching process, and the progress bar it draws.

A rank's stderr is not a terminal under mpiexec: rank 0 writes its count to a file and the launcher
draws the bar. The ranks' output passes through without MPICH's own abort lines and banner."""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

# MPICH prints these besides the ranks' own output: `Abort(5) on node 0 (rank 0 in comm 0): ...` on
# stderr, hydra's "BAD TERMINATION" banner on stdout. The launcher prints one paramedic line instead.
_MPICH_STDERR = re.compile(rb"^(Abort\(\d+\) on node |\[mpiexec@|\[proxy:)")
_BANNER_RULE = b"=" * 20
_BANNER_TITLE = b"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
_EXIT_STRING = re.compile(rb"TERMINATED WITH THE EXIT STRING: (.*)")


class Either:
    """True when either list holds something (read by the stderr relay: stop showing the ranks' lines)."""

    def __init__(self, *lists: list[float]):
        self.lists = lists

    def __bool__(self) -> bool:
        return any(self.lists)


def relay_stdout(stream: IO[bytes], exit_string: list[bytes], closed: list[float]) -> None:
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


def relay_stderr(stream: IO[bytes], bar: Bar | None, said: list[bytes], interrupted: Either) -> None:
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


class Bar:
    """The progress bar, drawn by the launcher from the count rank 0 writes."""

    def __init__(self, path: Path):
        self.path = path
        self.bar: Any = None
        self.closed = False
        self.lock = threading.Lock()

    def update(self) -> None:
        fields = read_file(self.path).split()
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


def read_file(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""
