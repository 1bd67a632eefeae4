"""The progress bar: queries written, with ETA.

Under paramedic's own launcher, rank 0 writes its count to a file and the launcher, which owns the
terminal, draws the bar (a rank's stderr is a pipe under mpiexec). Under another launcher the bar is drawn
here when stderr is a terminal (e.g. `srun --pty`).
"""

from __future__ import annotations

import os
import sys
from typing import Any


class Progress:
    def __init__(self, total: int, quiet: bool):
        self.bar: Any = None
        self.total = total
        self.done = 0
        self.fd: int | None = None
        path = os.environ.get("PARAMEDIC_PROGRESS_FILE")
        if quiet:
            return
        if path:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError:
                self.fd = None
            self._write()
        elif sys.stderr.isatty():
            from tqdm import tqdm  # imported only when shown: every rank imports this module

            self.bar = tqdm(total=total, unit="query", desc="paramedic", file=sys.stderr)

    def _write(self) -> None:
        if self.fd is not None:
            try:  # one short write at offset 0: the reader sees an old or a new count, padded
                os.pwrite(self.fd, f"{self.done} {self.total}".ljust(40).encode(), 0)
            except OSError:
                pass

    def advance(self, n: int) -> None:
        if not n:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        self._write()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
