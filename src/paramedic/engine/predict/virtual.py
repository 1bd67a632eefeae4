"""Workers in virtual time: the transports (paramedic.engine.core.runner) of the predictor and of the tests.

Why: the predictor (`paramedic simulate`) and the unit tests of the master must run the loop that runs,
not a copy of it, yet take no wall-clock time and give the same answer on a loaded machine. Here a task's
result arrives when the task's virtual seconds are up, the earliest first (ties in the order sent); the
result is made by a function of the task (the tests' made-up hits, the predictor's empty ones). The
predictor's costs (a master's messages, its merge, its writes) are hooks of subclasses
(paramedic.engine.predict.servers).

`VirtualTransport`: one master, its loop run by `drive` (each wait pops the next result). A
`VirtualNetwork`: many masters at once (rank 0's SegmentMaster and partition masters, or one master),
each loop a generator the network hands its events to, in time order, over `WorkersLink` and
`PartitionsLink`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from paramedic.engine.core.hierarchy import Answer, PartitionMaster, PartitionResult, PieceUp, Segment
from paramedic.engine.core.master import Result
from paramedic.engine.core.runner import Arrival, Driven, R, Steps, T, Transport, steps
from paramedic.engine.core.scheduler import PieceTask, Task
from paramedic.errors import InternalError


class VirtualTransport(Transport[Task, Result]):
    """`workers` workers (1..workers) on a virtual clock `now`; `log` keeps every (time, "start" or
    "done", task), in order, unless told not to."""

    def __init__(
        self,
        workers: int,
        execute: Callable[[Task], Result],
        seconds: Callable[[Task], float] = lambda task: 1.0,
        log: bool = True,
    ):
        self.count = workers
        self.execute = execute
        self.seconds = seconds
        self.now = 0.0
        self.log: list[tuple[float, str, Task]] = []
        self.logging = log  # the predictor's millions of tasks are not kept
        self._running: list[tuple[float, int, int, Task]] = []  # (due, order sent, worker, task)
        self._order = itertools.count()

    def ready(self) -> range:
        return range(1, self.count + 1)

    @property
    def workers(self) -> int:
        return self.count

    def send(self, worker: int, task: Task) -> None:
        if self.logging:
            self.log.append((self.now, "start", task))
        heapq.heappush(self._running, (self.due(worker, task), next(self._order), worker, task))

    def receive(self) -> Arrival[Result]:
        self.now, _, worker, task = heapq.heappop(self._running)
        if self.logging:
            self.log.append((self.now, "done", task))
        self.arrived(task)
        return Arrival(worker, self.execute(task))

    @property
    def running(self) -> list[float]:
        """When the tasks in flight are due."""
        return [due for due, _, _, _ in self._running]

    # -- hooks of a costed clock (the predictor) ----------------------------------------------------
    def due(self, worker: int, task: Task) -> float:
        """The virtual time the result of `task`, sent now to `worker`, arrives."""
        return self.now + self.seconds(task)

    def arrived(self, task: Task) -> None:
        """The result of `task` arrived at `now`, before its master takes it."""


# -- many masters on one clock: one master with its workers, or rank 0 over partitions ---------------------
class VirtualNetwork:
    """Many masters' loops (paramedic.engine.core.runner.steps) on one virtual clock, in one thread: each loop
    runs until it waits; then the earliest event is delivered to its loop (ties in the order made). An
    event is made by a link's `send`, a partition's request or piece, or a loop's end."""

    def __init__(self) -> None:
        self.now = 0.0
        self.loop_seconds = 0.0  # real seconds spent in the masters' code (the loops)
        self._events: list[tuple[float, int, int, str, Callable[[], Arrival[Any] | None]]] = []
        self._order = itertools.count()
        self._loops: list[Steps[Any]] = []
        self._links: list[VirtualLink[Any, Any]] = []
        self._ended: set[int] = set()

    def join(self, master: Driven[T, R], link: VirtualLink[T, R]) -> None:
        """A master and the link to its workers; its loop starts with `run`."""
        link.network = self
        link.index = len(self._loops)
        self._loops.append(steps(master, link))
        self._links.append(link)

    def at(self, when: float, link: VirtualLink[Any, Any], kind: str, deliver: Callable[[], Any]) -> None:
        """At `when`, `deliver()` (an arrival, or None: look again) goes to `link`'s loop."""
        heapq.heappush(self._events, (when, next(self._order), link.index, kind, deliver))

    def due(self, kind: str) -> list[float]:
        """When the events of `kind` still to come are due."""
        return [when for when, _, _, k, _ in self._events if k == kind]

    def run(self) -> None:
        """Every loop to its end; a loop left waiting with nothing to come is its link's stall."""
        for index in range(len(self._loops)):
            self._step(index, None, first=True)
        while self._events:
            self.now, _, index, _, deliver = heapq.heappop(self._events)
            if index not in self._ended:
                self._step(index, deliver())
        for index, link in enumerate(self._links):
            if index not in self._ended:
                raise link.stall_error()

    def _step(self, index: int, arrival: Arrival[Any] | None, first: bool = False) -> None:
        started = time.perf_counter()
        loop, link = self._loops[index], self._links[index]
        try:
            if first:
                next(loop)
            else:
                loop.send(arrival)
        except StopIteration:
            self._ended.add(index)
            link.loop_ended()
        else:
            link.waiting()
        self.loop_seconds += time.perf_counter() - started


class VirtualLink(Transport[T, R]):
    """A transport of a `VirtualNetwork`: what it sends becomes events of the network."""

    network: VirtualNetwork
    index: int

    @property
    def now(self) -> float:
        return self.network.now

    def receive(self) -> Arrival[R] | None:
        raise InternalError("internal: a virtual link's loop is run by its network")

    def waiting(self) -> None:
        """The loop waits for its next arrival."""

    def loop_ended(self) -> None:
        """The loop is over."""


class WorkersLink(VirtualLink[Task, Result]):
    """A master and its `workers` workers (1..workers): a task's result arrives `seconds(task)` after it
    is sent. A partition's master (`partition`, under rank 0's `up`) asks for its next segment whenever
    it waits and wants one, and forwards its pieces up (`ForwardSink`). The hooks `due`, `arrived`,
    `asking`, `answered` and `forwarding` are where the predictor charges its costs."""

    def __init__(
        self,
        workers: int,
        execute: Callable[[Task], Result],
        seconds: Callable[[Task], float] = lambda task: 1.0,
        up: PartitionsLink | None = None,
    ):
        self.count = workers
        self.execute = execute
        self.seconds = seconds
        self.up = up
        self.partition: PartitionMaster | None = None  # set once its master is made
        self.number = up.add(self) if up is not None else 0

    def ready(self) -> range:
        return range(1, self.count + 1)

    @property
    def workers(self) -> int:
        return self.count

    def ended(self, master: Driven[Task, Result]) -> bool:
        return self.partition.finished if self.partition is not None else master.finished

    @property
    def may_stall(self) -> bool:
        return self.partition is None or self.partition.exhausted

    def send(self, worker: int, task: Task) -> None:
        self.network.at(self.due(worker, task), self, "done", functools.partial(self._done, worker, task))

    def _done(self, worker: int, task: Task) -> Arrival[Result]:
        self.arrived(task)
        return Arrival(worker, self.execute(task))

    def waiting(self) -> None:
        if self.partition is not None and self.partition.wants_segment():
            assert self.up is not None
            self.partition.requested = True
            self.network.at(self.asking(), self.up, "request", functools.partial(self.up.asked, self.number))

    def segment(self, answer: Answer) -> None:
        """Rank 0's answer arrives."""
        assert self.partition is not None
        self.answered()
        self.partition.receive(answer if isinstance(answer, Segment) else None)

    def forward(self, index: int, data: bytes) -> None:
        """A piece this partition wrote, to rank 0."""
        assert self.up is not None
        piece = functools.partial(self.up.piece, self.number, index, data)
        self.network.at(self.forwarding(index), self.up, "piece", piece)

    def loop_ended(self) -> None:
        if self.up is not None:
            # after its last piece, as MPI keeps one sender's messages in order
            self.network.at(self.forwarding(-1), self.up, "end", self.up.partition_ended)

    # -- hooks --------------------------------------------------------------------------------------
    def due(self, worker: int, task: Task) -> float:
        """The virtual time the result of `task`, sent now to `worker`, arrives."""
        return self.now + self.seconds(task)

    def arrived(self, task: Task) -> None:
        """The result of `task` arrived at `now`, before its master takes it."""

    def asking(self) -> float:
        """A request for a segment is sent now: when it reaches rank 0."""
        return self.now

    def answered(self) -> None:
        """Rank 0's answer arrived at `now`, before the partition master takes it."""

    def forwarding(self, index: int) -> float:
        """Piece `index` (-1: the partition's end) is sent up now: when it reaches rank 0."""
        return self.now


class ForwardSink:
    """A partition master's sink in virtual time: its pieces go up to rank 0 (`WorkersLink.forward`)."""

    holds_pieces = False

    def __init__(self, link: WorkersLink):
        self.link = link

    def add(self, index: int, data: bytes) -> int:
        self.link.forward(index, data)
        return 0

    def ship(self, tasks: list[PieceTask]) -> int:
        raise InternalError("internal: virtual partitions forward written pieces only")

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def placement(self) -> None:
        return None


class PartitionsLink(VirtualLink[Answer, PartitionResult]):
    """Rank 0 over partitions (paramedic.engine.core.hierarchy.SegmentMaster): a partition's request makes it
    idle, its answer goes down at `answer_due`, its pieces come up; the work is over when every
    partition's loop is. Hooks `asked`, `answer_due` and `piece_arrived` are the predictor's costs."""

    def __init__(self) -> None:
        self.partitions: list[WorkersLink] = []
        self.running = 0

    def add(self, partition: WorkersLink) -> int:
        self.partitions.append(partition)
        self.running += 1
        return len(self.partitions) - 1

    def ready(self) -> list[int]:
        return []

    @property
    def workers(self) -> int:
        return len(self.partitions)

    def ended(self, master: Driven[Answer, PartitionResult]) -> bool:
        return self.running == 0

    def send(self, worker: int, task: Answer) -> None:
        partition = self.partitions[worker]
        answer = functools.partial(partition.segment, task)
        self.network.at(self.answer_due(task), partition, "segment", answer)

    def asked(self, partition: int) -> Arrival[PartitionResult]:
        self.requested(partition)
        return Arrival(partition, None)

    def piece(self, partition: int, index: int, data: bytes) -> Arrival[PartitionResult]:
        self.piece_arrived(index)
        return Arrival(partition, PieceUp(index, data), idle=False)

    def partition_ended(self) -> None:
        self.running -= 1

    # -- hooks --------------------------------------------------------------------------------------
    def requested(self, partition: int) -> None:
        """A partition's request arrived at `now`."""

    def answer_due(self, answer: Answer) -> float:
        """The answer is sent now: when it reaches its partition."""
        return self.now

    def piece_arrived(self, index: int) -> None:
        """A partition's piece arrived at `now`, before rank 0 takes it."""
