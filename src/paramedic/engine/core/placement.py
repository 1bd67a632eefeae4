"""What a runner needs of an output that the workers write themselves (`Sink.placement()`).

Such an output (paramedic.engine.job.sinks.WorkerSink) has a file under a temporary name that every rank
opens, and an output strategy (paramedic.output.strategies) that places each piece as its size arrives
and says when the collective rounds are due. The runner (paramedic.engine.runtime.ranks, or rank 0's side of
partitions) opens the file on every rank, attaches rank 0's Holder, and at the end hands back what the
ranks acknowledged writing; the output then checks it all and renames the file into place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from paramedic.output.strategies import OutputStrategy


class Keeper(Protocol):
    """Rank 0's holder of the pieces it writes itself (paramedic.engine.rank.mpiio.Holder, made by the runner)."""

    def keep(self, piece: int, data: bytes) -> None: ...


class Placement(Protocol):
    tmp: Path  # the file every rank opens
    strategy: OutputStrategy  # places the pieces, orders the rounds
    write_seconds: float  # rank 0's time in file writes, for the run record

    def attach(self, holder: Keeper) -> None:
        """The file is open on every rank: rank 0's holder takes the pieces rank 0 was given so far."""
        ...

    def acknowledge(self, pieces: int, nbytes: int) -> None:
        """What ranks wrote, as they report it."""
        ...

    def closed_by_ranks(self) -> None:
        """Every rank synced and closed the file."""
        ...
