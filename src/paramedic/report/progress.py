"""The progress bar: queries written, with ETA, on stderr only when it is a terminal."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, quiet: bool):
        enabled = not quiet and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="query", desc="paramedic", disable=not enabled, file=sys.stderr)

    def advance(self, n: int) -> None:
        if n:
            self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
