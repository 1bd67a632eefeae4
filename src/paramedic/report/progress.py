"""The progress bar: queries written, with ETA; in the fragments strategy, tasks done (searches too).

Under paramedic's own launcher, rank 0 writes its count to a file and the launcher, which owns the
terminal, draws the bar (a rank's stderr is a pipe under mpiexec). Under another launcher the bar is drawn
here when stderr is a terminal (e.g. `srun --pty`).

With `searches` (the fragments strategy), queries are written only once every fragment of their batch is
searched: a bar of queries would sit at 0 for most of the job. It counts tasks instead: each fragment
search, and the report pieces in proportion to the queries written.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class Progress:
    def __init__(self, total: int, quiet: bool, searches: int = 0, pieces: int = 0):
        self.bar: Any = None
        self.queries = total
        self.written = 0
        self.searches = searches
        self.searches_done = 0
        self.pieces = pieces if searches else 0
        self.unit = "task" if searches else "query"
        self.total = searches + self.pieces if searches else total
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

            self.bar = tqdm(total=self.total, unit=self.unit, desc="paramedic", file=sys.stderr)

    def _write(self) -> None:
        if self.fd is not None:
            try:  # one short write at offset 0: the reader sees an old or a new count, padded
                os.pwrite(self.fd, f"{self.done} {self.total} {self.unit}".ljust(40).encode(), 0)
            except OSError:
                pass

    def advance(self, n: int) -> None:
        """`n` more queries written (or shipped)."""
        if n:
            self.written += n
            self._update()

    def search_done(self) -> None:
        """One more fragment search done (counted only when the bar counts tasks)."""
        if self.searches:
            self.searches_done += 1
            self._update()

    def _update(self) -> None:
        if self.searches:
            written = self.pieces * self.written // self.queries if self.queries else 0
            done = min(self.searches, self.searches_done) + written
        else:
            done = self.written
        if done == self.done:
            return
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done
        self._write()

    def finish(self) -> None:
        """The job's output is complete: the bar is full, whatever was counted (work kept from an earlier
        run, a site that already held the output), so it closes at 100% before the summary."""
        if self.done != self.total:
            if self.bar is not None:
                self.bar.update(self.total - self.done)
            self.done = self.total
            self._write()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
