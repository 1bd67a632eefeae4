"""One loop for every master: idle workers get tasks, their results go to the master, over a transport.

Why: the loop that keeps a master's workers busy was written once per way of reaching them (the single
rank, worker threads, MPI ranks, the supermaster's partitions, the predictor's virtual time, and the
tests' virtual-time drivers), and each copy decided stalls, idleness and dispatch order a little
differently, so the predictor and the tests did not run the code that runs. Here the loop is written once
(`steps`) and what differs is a `Transport`: how a task reaches a worker and how its result comes back.
A transport is a small class (docs/CONTRIBUTING.md "Add a transport").

The loop asks the master for a task for an idle worker (`next_for_idle`), sends it, waits for the next
arrival (a result, or a worker saying it is ready), hands results to the master, and ends when the
transport says the work is over (by default: the master is finished). Every worker idle with nothing
running and the work not over is a stall: the transport's error, never a hang.

What the loop drives is any `Driven`: the job's Master (tasks are searches and pieces), or the
supermaster (paramedic.engine.core.hierarchy.SegmentMaster: tasks are query segments, the workers are
partition masters). The loop is a generator that yields whenever it waits, so that one thread can run
many masters' loops on one virtual clock (paramedic.engine.predict.virtual); `drive` runs one loop to its end
over a transport whose `receive` waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from paramedic.engine.core.master import Master, Result
from paramedic.engine.core.scheduler import Task
from paramedic.errors import InternalError, ParamedicError

T = TypeVar("T")  # what the master hands out
R = TypeVar("R")  # what comes back
T_co = TypeVar("T_co", covariant=True)
R_contra = TypeVar("R_contra", contravariant=True)


class Driven(Protocol[T_co, R_contra]):
    """What the loop drives: tasks out for idle workers, results in (paramedic.engine.core.master.Master)."""

    def start(self) -> None: ...

    def next_task(self, worker: int) -> T_co | None: ...

    def accept(self, result: R_contra) -> None: ...

    @property
    def finished(self) -> bool: ...

    @property
    def per_worker(self) -> bool:
        """Whether the task handed out depends on which idle worker asks."""
        ...


@dataclass(frozen=True)
class Arrival(Generic[R]):
    """What came back from a worker: its result, or None when it only says it is ready (an MPI rank at
    its start, or after a collective round); `idle`: it may be given a task now (False while a round is
    under way: it says it is ready once the round is over; or a partition's piece, which leaves the
    partition at work)."""

    worker: int
    result: R | None
    idle: bool = True


class Transport(Generic[T, R]):
    """How a master reaches its workers. A transport implements `ready`, `workers`, `send` and
    `receive`; the rest has defaults for a transport whose work ends with its master's and that has no
    business of its own between tasks (the MPI ranks have: orders and collective rounds when the
    workers write the report, and a partition master's supermaster)."""

    def ready(self) -> Iterable[int]:
        """The workers idle at the start (an MPI rank says so itself, with an arrival)."""
        raise NotImplementedError

    @property
    def workers(self) -> int:
        """How many workers the master has: all of them idle and nothing running is a stall."""
        raise NotImplementedError

    def send(self, worker: int, task: T) -> None:
        """Hand `task` to the idle `worker`."""
        raise NotImplementedError

    def receive(self) -> Arrival[R] | None:
        """Wait for the next arrival; None when woken by the transport's own business (the loop then
        looks again at what it can hand out). Only `drive` calls it: a loop run by `steps` is handed
        its arrivals by whoever runs it (virtual time)."""
        raise NotImplementedError

    def between(self, idle: deque[int]) -> bool:
        """The transport's own business before tasks are handed out: it may take the `idle` workers (a
        collective round began: they say they are ready again once it is over). True: look again from
        the top of the loop (a round just ended)."""
        return False

    @property
    def holding(self) -> bool:
        """No task may be handed out now (a collective round is under way); the loop runs on until it
        is over, even when the work is."""
        return False

    def ended(self, master: Driven[T, R]) -> bool:
        """The work is over."""
        return master.finished

    @property
    def may_stall(self) -> bool:
        """Whether every worker idle with nothing running means the scheduler stalled (False while work
        may still come from above: a partition master waiting for its next segment)."""
        return True

    def stall_error(self) -> ParamedicError:
        return InternalError("internal: the scheduler stalled with every worker idle")


def next_for_idle(master: Driven[T, R], idle: deque[int]) -> tuple[int, T] | None:
    """The first idle worker the master has a task for, taken off `idle`. Only the first is asked unless
    the answer depends on the worker (--stage: paramedic.engine.core.scheduler `per_worker`)."""
    for worker in list(idle) if master.per_worker else [idle[0]]:
        task = master.next_task(worker)
        if task is not None:
            idle.remove(worker)
            return worker, task
    return None


# The loop waits by yielding; it is sent the next arrival (or None: look again).
Steps = Generator[None, "Arrival[R] | None", None]


def steps(master: Driven[T, R], transport: Transport[T, R]) -> Steps[R]:
    """The one loop of every runner: `master` driven to the end of its work over `transport`, waiting
    for each arrival by yielding."""
    master.start()
    idle: deque[int] = deque(transport.ready())
    busy: dict[int, T] = {}
    while not transport.ended(master) or transport.holding:
        if transport.between(idle):
            continue
        while idle and not transport.holding:
            handed = next_for_idle(master, idle)
            if handed is None:
                break
            worker, task = handed
            busy[worker] = task
            transport.send(worker, task)
        stalled = (
            not busy
            and not transport.holding
            and len(idle) == transport.workers
            and not transport.ended(master)
        )
        if stalled and transport.may_stall:
            raise transport.stall_error()
        arrival = yield
        if arrival is None:
            continue
        if arrival.result is not None:
            busy.pop(arrival.worker, None)
            master.accept(arrival.result)
        if arrival.idle:
            idle.append(arrival.worker)


def drive(master: Driven[T, R], transport: Transport[T, R]) -> None:
    """Run the loop to its end, each wait a `transport.receive()`."""
    loop = steps(master, transport)
    try:
        next(loop)
        while True:
            loop.send(transport.receive())
    except StopIteration:
        return


class SerialTransport(Transport[Task, Result]):
    """The single rank: the master's own rank (worker 0) does every task, in the order handed out."""

    def __init__(self, execute: Callable[[Task], Result]):
        self.execute = execute
        self.task: Task | None = None

    def ready(self) -> Iterable[int]:
        return [0]

    @property
    def workers(self) -> int:
        return 1

    def send(self, worker: int, task: Task) -> None:
        self.task = task

    def receive(self) -> Arrival[Result] | None:
        task, self.task = self.task, None
        assert task is not None
        return Arrival(0, self.execute(task))

    def stall_error(self) -> ParamedicError:
        return InternalError("internal: the scheduler stalled with no task for the only rank")


def run_serial(master: Master, execute: Callable[[Task], Result]) -> None:
    """The single-rank runner: the master's own rank does every task, in the order handed out."""
    drive(master, SerialTransport(execute))
