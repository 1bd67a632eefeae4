"""A third worker output strategy, written by following docs/CONTRIBUTING.md "Add an output strategy":
one module, one registration. `worker-at-end` keeps every placed piece's order until the last piece is
placed, then each holder writes all of its pieces, highest offset first (a strategy whose writes all come
late and out of file order: the output must not depend on either)."""

from __future__ import annotations

from paramedic.output.strategies import OutputStrategy, Write, register_output_strategy


@register_output_strategy
class WorkerAtEnd(OutputStrategy):
    name = "worker-at-end"
    help = "each worker writes its pieces once every piece is placed, last offset first (a test's strategy)"

    def __init__(self, n_pieces: int):
        super().__init__(n_pieces)
        self.kept: list[tuple[int, Write]] = []  # (holder, order) until the end

    def _placed(self, piece: int, offset: int, size: int, holder: int) -> None:
        self.kept.append((holder, Write(piece, offset)))

    def _end(self) -> None:
        for holder, write in sorted(self.kept, key=lambda kept: -kept[1].offset):
            self._order(holder, write)

    def counts(self) -> dict[str, int]:
        return {"late_writes": len(self.kept)}
