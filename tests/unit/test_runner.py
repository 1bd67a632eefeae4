"""The one runner loop (paramedic.engine.core.runner) and its seams, each tried as docs/CONTRIBUTING.md says:
a new transport (results back in the reverse order of sending) and a new scheduling policy (no cache
affinity) give the same output; a stall is an error, never a hang; the predictor takes the policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from paramedic.engine.core.master import Master, Result
from paramedic.engine.core.runner import Arrival, Transport, drive
from paramedic.engine.core.scheduler import Plan, Scheduler, Task
from paramedic.engine.predict.simulate import predict
from paramedic.engine.predict.virtual import VirtualTransport
from paramedic.errors import InternalError
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats
from tests.unit.test_master import PLAN, expected_output, run_task, writer
from tests.unit.test_simulate import made_up, model, settings


class LastInFirstOut(Transport[Task, Result]):
    """Workers whose last task sent is the first to come back (the recipe's four members only)."""

    def __init__(self, workers: int):
        self.count = workers
        self.stack: list[tuple[int, Task]] = []
        self.sent: list[Task] = []

    def ready(self) -> range:
        return range(1, self.count + 1)

    @property
    def workers(self) -> int:
        return self.count

    def send(self, worker: int, task: Task) -> None:
        self.stack.append((worker, task))
        self.sent.append(task)

    def receive(self) -> Arrival[Result]:
        worker, task = self.stack.pop()
        return Arrival(worker, run_task(task))


class NoAffinity(Scheduler):
    """A policy: any pending fragment, whatever the worker holds."""

    def preferences(
        self, held: set[int], on_node: set[int], home: set[int], held_by_others: set[int]
    ) -> tuple[Callable[[int], bool], ...]:
        return (lambda f: True,)


def master(scheduler: Scheduler) -> tuple[Master, object]:
    sink, memory = writer()
    return Master(scheduler, sink, Progress(PLAN.n_queries, quiet=True), RankStats(0, "master")), memory


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_a_new_transport_runs_every_task_once_and_writes_the_output_in_order(workers: int) -> None:
    m, memory = master(Scheduler(PLAN))
    transport = LastInFirstOut(workers)
    drive(m, transport)
    m.commit()
    assert len(transport.sent) == len(set(transport.sent)) == 3 * 3 + 5  # searches and pieces
    assert bytes(memory.data) == expected_output()  # type: ignore[attr-defined]


def test_a_new_policy_gives_the_same_output_and_changes_who_gets_what() -> None:
    outputs, logs = [], []
    for policy in (Scheduler, NoAffinity):
        m, memory = master(policy(PLAN))
        clock = VirtualTransport(2, run_task, lambda task: 1.0 + getattr(task, "fragment", 0))
        drive(m, clock)
        m.commit()
        outputs.append(bytes(memory.data))  # type: ignore[attr-defined]
        logs.append([task for _, what, task in clock.log if what == "start"])
    assert outputs[0] == outputs[1] == expected_output()
    assert logs[0] != logs[1]  # affinity keeps a worker on its fragment; the policy does not


def test_a_master_with_nothing_to_hand_out_is_a_stall_not_a_hang() -> None:
    plan = Plan(batches=(range(0, 2),), n_fragments=1, pieces=(range(0, 2),), hitlist_size=5)
    m, _ = master(Scheduler(plan, assigned=set()))  # a partition's, never given a segment
    with pytest.raises(InternalError, match="stalled"):
        drive(m, VirtualTransport(2, run_task))


@pytest.mark.parametrize("partition_size", [None, 3])
def test_the_predictor_runs_a_policy(tmp_path: Path, partition_size) -> None:
    path = made_up(tmp_path)
    s = settings(path, 60, 5, partition_size=partition_size)
    default, other = predict(model(path), s), predict(model(path), s, scheduler=NoAffinity)
    assert default.tasks == other.tasks and default.work_seconds == pytest.approx(other.work_seconds)
    assert other.wall_seconds > 0
