"""Workers in virtual time: the transport (paramedic.engine.runner) of the predictor and of the tests.

Why: the predictor (`paramedic simulate`) and the unit tests of the master must run the loop that runs,
not a copy of it, yet take no wall-clock time and give the same answer on a loaded machine. Here a task's
result arrives when the task's virtual seconds are up, the earliest first (ties in the order sent); the
result is made by a function of the task (the tests' made-up hits, the predictor's empty ones). The
predictor's costs (a master's messages, its merge, its writes) are hooks of a subclass
(paramedic.engine.simulate).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from paramedic.engine.master import Result
from paramedic.engine.runner import Arrival, Transport
from paramedic.engine.scheduler import Task


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
        heapq.heappush(self._running, (self.due(task), next(self._order), worker, task))

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
    def due(self, task: Task) -> float:
        """The virtual time the result of `task`, sent now, arrives."""
        return self.now + self.seconds(task)

    def arrived(self, task: Task) -> None:
        """The result of `task` arrived at `now`, before its master takes it."""
