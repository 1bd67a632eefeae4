"""The masters as servers in virtual time (`paramedic simulate`): the engine's own masters' transports
(paramedic.engine.predict.virtual) charged each message, merge and write, and the workers' BLAST+ seconds.

`MasterCosts`: the only master, or a partition's; `RankZeroCosts`: the supermaster over partitions;
`Shared`: what they share in one prediction; `VirtualSink`: a master's sink that writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paramedic.engine.core.hierarchy import Answer, Segment
from paramedic.engine.core.master import Result
from paramedic.engine.core.scheduler import PieceTask, Plan, SearchTask, Task
from paramedic.engine.predict.costs import CostModel, OutputCost
from paramedic.engine.predict.startup import Startup
from paramedic.engine.predict.virtual import PartitionsLink, WorkersLink
from paramedic.errors import ParamedicError, UsageError

# Unpickling one merge key (a Hit or a Candidate) in a master: a search result of 20 queries with 48 hits
# and 48 candidates each took 4.17 ms to unpickle (and as long to pickle) here: 2.2 us per key.
KEY_SECONDS = 2.2e-6


class VirtualSink:
    """A master's sink in virtual time: counts the pieces, forwards them to the supermaster."""

    holds_pieces = False

    def __init__(self, plan: Plan, on_piece: Callable[[int], None]):
        self.plan = plan
        self.on_piece = on_piece

    def add(self, index: int, data: bytes) -> int:
        self.on_piece(index)
        return len(self.plan.pieces[index])

    def ship(self, tasks: list[PieceTask]) -> int:
        raise AssertionError("the predictor writes pieces")

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def placement(self) -> None:
        return None


@dataclass
class Shared:
    """What every master's costs share in one prediction: the cost model, the BLAST+ work handed out,
    and the collective output rounds (a round waits for the last task in flight anywhere)."""

    model: CostModel
    output: OutputCost
    plan: Plan
    message: float
    latency: float
    searching: int  # the ranks running BLAST+
    work: float = 0.0  # BLAST+ seconds of every task
    worker_busy: float = 0.0
    tasks: int = 0
    unwritten: int = 0  # collective rounds: placed bytes not yet written
    round_until: float = 0.0  # ... no task starts before the round under way ends
    rounds: int = 0
    startup: Startup | None = None  # a described database's start-up: first uses of volumes
    volumes: range = range(0)  # the volumes a report piece reads (a mask over the whole database)
    spent: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("search", "report pieces", "merge", "messages", "output"), 0.0)
    )

    def write_round(self, barrier: float) -> None:
        """Every worker writes its share of the unwritten bytes once all are in."""
        self.round_until = barrier + self.unwritten * self.model.write_per_byte / self.searching
        self.worker_busy += self.unwritten * self.model.write_per_byte
        self.spent["output"] += self.unwritten * self.model.write_per_byte
        self.unwritten = 0
        self.rounds += 1


class MasterCosts(WorkersLink):
    """A master (the only one, or a partition's) as a server in virtual time: each message it handles
    costs it `message_seconds` and messages wait while it is busy; a search result also costs the merge,
    and the only master's written piece its write (the output strategy's); a task reaches its worker
    `latency_seconds` after it is sent, and no task starts before a collective round under way ends."""

    def __init__(
        self,
        shared: Shared,
        workers: int,
        execute: Callable[[Task], Result],
        cost: Callable[[Task], float],
        up: RankZeroCosts | None = None,
        ranks: Sequence[int] = (),
    ):
        super().__init__(workers, execute, cost, up)
        self.shared = shared
        self.free = 0.0  # the master's next free moment
        self.busy = 0.0
        self.ranks = ranks  # the global rank of each (the master first, then its workers 1..workers)

    def _handle(self, seconds: float, at: float | None = None) -> None:
        """The master handles something that came at `at` (None: right after what it does now)."""
        self.free = (self.free if at is None else max(at, self.free)) + seconds
        self.busy += seconds

    def due(self, worker: int, task: Task) -> float:
        s = self.shared
        self._handle(s.message)
        s.spent["messages"] += s.message
        seconds = self.seconds(task)
        written = 0.0
        if isinstance(task, PieceTask):
            size = round(task.n_queries * s.model.output_per_query)
            written = s.output.on_worker(size, s.model.write_per_byte)
            s.spent["output"] += written
        s.spent["search" if isinstance(task, SearchTask) else "report pieces"] += seconds
        s.work += seconds
        s.worker_busy += seconds + written
        s.tasks += 1
        start = max(self.free, s.round_until) + s.latency
        if s.startup is not None:  # the rank's first use of the task's volumes
            volumes = (
                s.startup.shape.volumes_of(task.fragment, s.plan.n_fragments)
                if isinstance(task, SearchTask)
                else s.volumes
            )
            begin = s.startup.first_use(self.ranks[worker], volumes, start, isinstance(task, SearchTask))
            s.worker_busy += begin - start
            start = begin
        return start + seconds + written

    def arrived(self, task: Task) -> None:
        s = self.shared
        self._handle(s.message, at=self.now)
        s.spent["messages"] += s.message
        if isinstance(task, SearchTask):
            per_query = s.model.merge_per_query + s.model.keys_per_query * KEY_SECONDS
            self._handle(per_query * len(s.plan.batches[task.batch]))
            s.spent["merge"] += per_query * len(s.plan.batches[task.batch])
        if s.output.round_bytes is not None and isinstance(task, PieceTask):
            s.unwritten += round(task.n_queries * s.model.output_per_query)
            if s.unwritten >= s.output.round_bytes:  # after the last task in flight anywhere
                s.write_round(max([self.now, *self.network.due("done")]))

    def asking(self) -> float:
        self._handle(self.shared.message)
        self.shared.spent["messages"] += self.shared.message
        return self.free + self.shared.latency

    def answered(self) -> None:
        self._handle(self.shared.message, at=self.now)
        self.shared.spent["messages"] += self.shared.message

    def forwarding(self, index: int) -> float:
        return self.free + self.shared.latency

    def piece_written(self, index: int) -> None:
        """The only master wrote a piece (its sink): rank 0's time, with the `master` strategy."""
        s = self.shared
        size = round(len(s.plan.pieces[index]) * s.model.output_per_query)
        self._handle(s.output.on_rank0(size, s.model.write_per_byte))
        s.spent["output"] += s.output.on_rank0(size, s.model.write_per_byte)

    def stall_error(self) -> ParamedicError:
        return UsageError("internal: the simulated job stalled (the scheduler handed out no task)")


class RankZeroCosts(PartitionsLink):
    """Rank 0 over partitions in virtual time: a request and its answer cost it one message, a piece one
    message and its write (the output strategy's); messages wait while it is busy."""

    def __init__(self, shared: Shared):
        super().__init__()
        self.shared = shared
        self.free = 0.0
        self.busy = 0.0
        self.last_segment: float | None = None  # when the last segment was handed out

    def _handle(self, seconds: float) -> None:
        self.free = max(self.now, self.free) + seconds
        self.busy += seconds

    def requested(self, partition: int) -> None:
        self._handle(self.shared.message)
        self.shared.spent["messages"] += self.shared.message

    def answer_due(self, answer: Answer) -> float:
        if isinstance(answer, Segment):
            self.last_segment = self.free
        return self.free + self.shared.latency

    def piece_arrived(self, index: int) -> None:
        s = self.shared
        size = round(len(s.plan.pieces[index]) * s.model.output_per_query)
        self._handle(s.message + s.output.on_rank0(size, s.model.write_per_byte))
        s.spent["messages"] += s.message
        s.spent["output"] += s.output.on_rank0(size, s.model.write_per_byte)

    def stall_error(self) -> ParamedicError:
        return UsageError("internal: the simulated job stalled (the scheduler handed out no task)")
