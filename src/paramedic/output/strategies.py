"""Output strategies (`--output-strategy`): who writes the report's bytes into the final file.

`master` (the default) is the ordered writer of paramedic.output.writer: every piece's bytes go to rank 0,
which stitches and writes them. In the other strategies a piece's bytes stay with the rank that wrote the
piece (already stitched for its position: paramedic.output.stitch.stitch_alone); rank 0 receives only its
size. Rank 0 places pieces as their sizes arrive: a piece's offset is the sum of the sizes of the pieces
before it, known once all of them are (a prefix sum over the plan's piece order), before the bytes exist
where they are written. Each strategy turns placed pieces into orders for the ranks that hold them:

- `worker-individual`: the holder writes its piece at its offset (MPI-IO `Write_at`, independent);
- `worker-collective`: pieces are written in rounds in which every rank calls `Write_all` with a file
  view over its own ranges; a round starts when the placed, unwritten bytes reach `ROUND_BYTES`, and a
  last one at the end;
- `worker-merge`: consecutive pieces are grouped into segments of at most `MERGE_BUFFER_BYTES` (a piece
  larger than that is a segment alone); the segment's writer is the rank holding most of its bytes, its
  peers send it their pieces (non-blocking sends), and it writes the segment with one contiguous
  `Write_at`.

Pieces rank 0 itself holds (journaled by an earlier run, or every piece when the job has one rank) are
written by rank 0: `Write` orders, or its share of a round. This module is pure bookkeeping (no MPI):
paramedic.engine.rank.mpiio carries the orders out.
"""

from __future__ import annotations

import importlib
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

MASTER = "master"
MERGE_BUFFER_BYTES = 4 * 2**20  # worker-merge: the most a writer gathers before it writes (the issue's)
ROUND_BYTES = 32 * 2**20  # worker-collective: placed, unwritten bytes that start a round
# Both bounds at once, in bytes (for tests and measurements: small values give many rounds and segments)
BUFFER_VARIABLE = "PARAMEDIC_OUTPUT_BUFFER"


def _bound(default: int) -> int:
    value = os.environ.get(BUFFER_VARIABLE)
    if not value:
        return default
    try:
        bound = int(value)
    except ValueError:
        bound = 0
    if bound < 1:
        raise ValueError(f"{BUFFER_VARIABLE}={value}: expected a positive number of bytes")
    return bound


@dataclass(frozen=True)
class Write:
    """The holder writes its piece at `offset`."""

    piece: int
    offset: int


@dataclass(frozen=True)
class Send:
    """The holder sends its piece's bytes to rank `to` (worker-merge)."""

    piece: int
    to: int


@dataclass(frozen=True)
class Merge:
    """The writer gathers `parts` (piece, holder rank, size), in file order, and writes them at `offset`."""

    offset: int
    parts: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Round:
    """One rank's ranges in collective round `number` (every rank takes part, with nothing if need be)."""

    number: int
    writes: tuple[Write, ...]


Order = Write | Send | Merge


class OutputStrategy:
    """Placing pieces as their sizes arrive, and the orders that follow. `master` needs none of it."""

    name: ClassVar[str]
    help: ClassVar[str]
    workers_write: ClassVar[bool] = True
    collective: ClassVar[bool] = False

    def __init__(self, n_pieces: int):
        self.n_pieces = n_pieces
        self.sizes: dict[int, int] = {}
        self.holders: dict[int, int] = {}
        self.offsets: dict[int, int] = {}
        self.next = 0  # the first piece without an offset
        self.total = 0  # bytes of pieces 0 .. next-1
        self._orders: defaultdict[int, list[Order]] = defaultdict(list)

    def held(self, piece: int, size: int, holder: int) -> None:
        """Rank `holder` holds piece `piece`, `size` bytes once stitched."""
        if not 0 <= piece < self.n_pieces or piece in self.sizes or size < 0:
            raise ValueError(f"internal: piece {piece} ({size} bytes) reported twice or out of range")
        self.sizes[piece] = size
        self.holders[piece] = holder
        while self.next in self.sizes:
            index = self.next
            self.offsets[index] = self.total
            self._placed(index, self.total, self.sizes[index], self.holders[index])
            self.total += self.sizes[index]
            self.next += 1
        if self.complete:
            self._end()

    @property
    def complete(self) -> bool:
        return self.next == self.n_pieces

    def take(self) -> dict[int, list[Order]]:
        """The orders made since the last call, per rank, in the order they must be carried out."""
        orders = dict(self._orders)
        self._orders.clear()
        return orders

    def _order(self, rank: int, order: Order) -> None:
        self._orders[rank].append(order)

    # -- per strategy -------------------------------------------------------------------------------
    def _placed(self, piece: int, offset: int, size: int, holder: int) -> None:
        self._order(holder, Write(piece, offset))

    def _end(self) -> None:
        pass

    @property
    def round_due(self) -> bool:
        return False

    def counts(self) -> dict[str, int]:
        """What the strategy did, for the run record (rounds, segments)."""
        return {}

    def start_round(self, ranks: int) -> dict[int, Round] | None:
        """worker-collective: every rank's share of a round over the unwritten placed pieces (None when
        there is nothing to write)."""
        return None


OUTPUT_STRATEGIES: dict[str, type[OutputStrategy]] = {}
# The strategies in modules of their own (each imports this module for `OutputStrategy`, so this one cannot
# import them at its top: a cycle), imported when the strategies are first asked for. A new strategy is its
# module and one line here (docs/CONTRIBUTING.md, "Add an output strategy").
PLUGINS: tuple[str, ...] = ()


def register_output_strategy(cls: type[OutputStrategy]) -> type[OutputStrategy]:
    if cls.name in OUTPUT_STRATEGIES:
        raise ValueError(f"output strategy {cls.name!r} registered twice")
    OUTPUT_STRATEGIES[cls.name] = cls
    return cls


def _import_plugins() -> None:
    for module in PLUGINS:
        importlib.import_module(module)  # its import registers its strategy (once: imports are cached)


def output_strategy_names() -> tuple[str, ...]:
    """The choices of `--output-strategy`, `master` first."""
    _import_plugins()
    return tuple(OUTPUT_STRATEGIES)


def output_strategy(name: str) -> type[OutputStrategy]:
    _import_plugins()
    try:
        return OUTPUT_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown output strategy {name!r}") from None


@register_output_strategy
class MasterWrites(OutputStrategy):
    name = MASTER
    help = "rank 0 receives every piece and writes the file (paramedic.output.writer)"
    workers_write = False


@register_output_strategy
class WorkerIndividual(OutputStrategy):
    name = "worker-individual"
    help = "each worker writes its pieces at their offsets (MPI-IO Write_at)"


@register_output_strategy
class WorkerCollective(OutputStrategy):
    name = "worker-collective"
    help = "every rank writes its pieces in collective rounds (a file view each, MPI-IO Write_all)"
    collective = True

    def __init__(self, n_pieces: int):
        super().__init__(n_pieces)
        self.round_bytes = _bound(ROUND_BYTES)
        self.rounds = 0
        self.unwritten: defaultdict[int, list[Write]] = defaultdict(list)
        self.unwritten_bytes = 0

    def _placed(self, piece: int, offset: int, size: int, holder: int) -> None:
        self.unwritten[holder].append(Write(piece, offset))
        self.unwritten_bytes += size

    @property
    def round_due(self) -> bool:
        return self.unwritten_bytes >= self.round_bytes

    def counts(self) -> dict[str, int]:
        return {"rounds": self.rounds}

    def start_round(self, ranks: int) -> dict[int, Round] | None:
        if not self.unwritten:
            return None
        if max(self.unwritten) >= ranks:
            raise ValueError(f"internal: a piece held by rank {max(self.unwritten)} of {ranks}")
        shares = {rank: Round(self.rounds, tuple(self.unwritten.get(rank, ()))) for rank in range(ranks)}
        self.rounds += 1
        self.unwritten.clear()
        self.unwritten_bytes = 0
        return shares


@register_output_strategy
class WorkerMerge(OutputStrategy):
    name = "worker-merge"
    help = (
        "per run of consecutive pieces (up to a 4 MiB buffer) the worker holding most of its bytes gathers "
        "its peers' pieces (non-blocking sends) and writes them contiguously"
    )

    def __init__(self, n_pieces: int):
        super().__init__(n_pieces)
        self.buffer_bytes = _bound(MERGE_BUFFER_BYTES)
        self.segment: list[tuple[int, int, int]] = []  # (piece, holder, size), consecutive
        self.segment_offset = 0
        self.segment_bytes = 0
        self.segments = 0
        self.gathered = 0  # segments whose writer received pieces from other ranks

    def counts(self) -> dict[str, int]:
        return {"segments": self.segments, "gathered": self.gathered}

    def _placed(self, piece: int, offset: int, size: int, holder: int) -> None:
        if holder == 0:  # rank 0's own pieces (journaled, or a one-rank job): rank 0 writes them
            self._close()
            self._order(0, Write(piece, offset))
            return
        if self.segment and self.segment_bytes + size > self.buffer_bytes:
            self._close()
        if not self.segment:
            self.segment_offset = offset
        self.segment.append((piece, holder, size))
        self.segment_bytes += size

    def _end(self) -> None:
        self._close()

    def _close(self) -> None:
        if not self.segment:
            return
        held: defaultdict[int, int] = defaultdict(int)
        for _, holder, size in self.segment:
            held[holder] += size
        writer = min(held, key=lambda rank: (-held[rank], rank))
        self.gathered += len(held) > 1
        for piece, holder, _ in self.segment:
            if holder != writer:
                self._order(holder, Send(piece, writer))
        self._order(writer, Merge(self.segment_offset, tuple(self.segment)))
        self.segments += 1
        self.segment = []
        self.segment_bytes = 0
