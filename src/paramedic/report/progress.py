"""The progress bar: queries written, with ETA, on stderr only when it is a terminal."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    def __init__(self, total: int, quiet: bool):
        self.bar: Any = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm  # imported only when shown: every rank imports this module

            self.bar = tqdm(total=total, unit="query", desc="paramedic", file=sys.stderr)

    def advance(self, n: int) -> None:
        if n and self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
