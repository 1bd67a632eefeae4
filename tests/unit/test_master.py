"""The master without MPI (paramedic.engine.core.master), driven in virtual time by the engine's own runner
loop (paramedic.engine.core.runner over paramedic.engine.predict.virtual): tasks out, results in, output in order; --ship auto's probe is an ordinary task while the others search."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from paramedic.blast.hits import Hit
from paramedic.engine.core.master import Master, PieceResult, Result, SearchResult
from paramedic.engine.core.runner import drive, run_serial
from paramedic.engine.core.scheduler import PieceTask, Plan, Scheduler, SearchTask, Task
from paramedic.engine.job.sinks import WriterSink
from paramedic.engine.predict.virtual import VirtualTransport
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats
from tests.unit.fragments import searched

PLAN = Plan(
    batches=(range(0, 3), range(3, 6), range(6, 9)),
    n_fragments=3,
    pieces=(range(0, 2), range(2, 3), range(3, 6), range(6, 8), range(8, 9)),
    hitlist_size=5,
)


def report(task: PieceTask) -> bytes:
    """A piece's 'BLAST+ output': one tabular line per query and subject."""
    subjects = task.subjects or ((),) * task.n_queries
    return b"".join(
        f"q{task.first_query + i}\ts{gid}\n".encode() for i, s in enumerate(subjects) for gid in s
    )


def run_task(task: Task, plan: Plan = PLAN) -> Result:
    if isinstance(task, SearchTask):
        hits = [
            [Hit(10.0 ** -(9 - task.fragment), 50, 100 * q + task.fragment)] for q in plan.batches[task.batch]
        ]
        return SearchResult(task, searched(hits))
    return PieceResult(task, report(task), seconds=0.5)


def expected_output(plan: Plan = PLAN) -> bytes:
    return b"".join(f"q{q}\ts{100 * q + f}\n".encode() for q in range(plan.n_queries) for f in range(3))


@dataclass
class Memory:
    """A byte sink in memory."""

    data: bytearray = field(default_factory=bytearray)
    committed: bool = False

    def write(self, data: bytes) -> None:
        self.data += data

    def commit(self) -> None:
        self.committed = True

    def abort(self) -> None:
        raise AssertionError("aborted")


def writer(plan: Plan = PLAN) -> tuple[WriterSink, Memory]:
    """The engine's own writer sink, onto memory."""
    memory = Memory()
    return WriterSink("6", plan.pieces, memory), memory


class Shipped:
    """A sink that ships pieces as metadata (as engine.job.sinks.MetadataSink)."""

    holds_pieces = True

    def __init__(self) -> None:
        self.pieces: list[PieceTask] = []
        self.committed = False

    def add(self, index: int, data: bytes) -> int:
        raise AssertionError("metadata is shipped, not written")

    def ship(self, tasks: list[PieceTask]) -> int:
        self.pieces += tasks
        return sum(t.n_queries for t in tasks)

    def commit(self) -> None:
        self.committed = True

    def abort(self) -> None:
        raise AssertionError("aborted")


def master(sink=None, choose=None, plan: Plan = PLAN) -> Master:
    return Master(Scheduler(plan), sink, Progress(plan.n_queries, quiet=True), RankStats(0, "master"),
                  choose_sink=choose)  # fmt: skip


def simulate(m: Master, workers: int, seconds=lambda task: 1.0) -> list[tuple[float, str, Task]]:
    """Workers in virtual time, over the engine's own runner loop: each idle worker gets a task, results
    come back when their time is up. Returns the events (time, "start"/"done", task)."""
    clock = VirtualTransport(workers, run_task, seconds)
    drive(m, clock)
    return clock.log


def started(events, kind) -> list:
    return [t for _, what, t in events if what == "start" and isinstance(t, kind)]


def test_every_task_once_and_the_output_in_query_order_whatever_the_finishing_order() -> None:
    sink, memory = writer()
    # later fragments are slower, so results come back out of order
    events = simulate(master(sink), workers=3, seconds=lambda t: 1.0 + getattr(t, "fragment", 0) * 0.7)
    searches = started(events, SearchTask)
    assert sorted((t.batch, t.fragment) for t in searches) == [(b, f) for b in range(3) for f in range(3)]
    assert sorted(t.piece for t in started(events, PieceTask)) == [0, 1, 2, 3, 4]
    assert bytes(memory.data) == expected_output()  # commit is the runner's, after finished


def test_the_single_rank_runner_does_every_task_itself() -> None:
    sink, memory = writer()
    m = master(sink)
    run_serial(m, run_task)
    m.commit()
    assert memory.committed and bytes(memory.data) == expected_output()


def test_auto_probe_is_a_worker_task_and_the_others_keep_searching_until_metadata_is_chosen() -> None:
    chosen: list[tuple[PieceTask, PieceResult]] = []
    shipped = Shipped()

    def choose(probe: PieceTask, result: PieceResult) -> Shipped:
        chosen.append((probe, result))
        return shipped

    m = master(choose=choose)
    events = simulate(m, workers=2, seconds=lambda t: 5.0 if isinstance(t, PieceTask) else 1.0)
    (probe,) = started(events, PieceTask)  # the probe is the only piece regenerated here
    assert probe.piece == 0 and probe.alignments is None
    probe_start = next(when for when, what, t in events if t == probe and what == "start")
    probe_end = next(when for when, what, t in events if t == probe and what == "done")
    # while the probe ran, the other worker was handed search tasks (and their results were taken in)
    assert any(probe_start < when < probe_end for when, what, t in events if isinstance(t, SearchTask))
    assert len(chosen) == 1 and chosen[0][1].data == report(probe) and chosen[0][1].seconds == 0.5
    assert sorted(t.piece for t in shipped.pieces) == [0, 1, 2, 3, 4]  # every piece shipped once
    assert m.finished


def test_auto_choosing_to_ship_the_output_writes_the_probes_output_and_regenerates_the_rest() -> None:
    sink, memory = writer()
    m = master(choose=lambda probe, result: sink)
    events = simulate(m, workers=2)
    pieces = [t.piece for t in started(events, PieceTask)]
    assert sorted(pieces) == [0, 1, 2, 3, 4]  # the probe's piece (0) is not regenerated a second time
    assert bytes(memory.data) == expected_output()


def test_a_plan_may_start_past_query_zero() -> None:
    """A partition master owns a sub-plan: its queries are a range of the job's."""
    plan = Plan(batches=(range(10, 12), range(12, 13)), n_fragments=2, pieces=(range(10, 11), range(11, 13)),
                hitlist_size=5)  # fmt: skip
    assert plan.n_queries == 3 and plan.first_query == 10
    scheduler = Scheduler(plan)
    while not scheduler.finished:
        task = scheduler.next_task(1)
        assert task is not None
        if isinstance(task, SearchTask):
            result = run_task(task, plan)
            assert isinstance(result, SearchResult)
            scheduler.search_done(task, result.found)
        else:
            assert task.first_query in (10, 11)
            scheduler.piece_done(task)
    assert [scheduler.metadata(q) for q in (10, 11, 12)] == [[1000, 1001], [1100, 1101], [1200, 1201]]


class Digest:
    """The database's digest as prepare_job(digest="later") hands it over: still running until `finish`."""

    def __init__(self) -> None:
        self.done = False
        self.refusal: Exception | None = None
        self.waited = 0

    def finish(self, refusal: Exception | None = None) -> None:
        self.done, self.refusal = True, refusal

    @property
    def failed(self) -> bool:
        return self.done and self.refusal is not None

    def __call__(self) -> None:
        self.waited += 1
        assert self.done, "the master took a result before the digest had passed"
        if self.refusal is not None:
            raise self.refusal


def test_no_result_is_taken_before_the_digest_has_passed() -> None:
    """The local runner's workers search while the digest runs; the master waits for it at the first
    result, and not again."""
    sink, memory = writer()
    digest = Digest()
    m = Master(Scheduler(PLAN), sink, Progress(PLAN.n_queries, quiet=True), RankStats(0, "master"),
               verified=digest)  # fmt: skip
    m.start()
    task = m.next_task(1)
    assert task is not None
    with pytest.raises(AssertionError, match="before the digest had passed"):
        m.accept(run_task(task))
    digest.finish()
    m.accept(run_task(task))
    while not m.finished:
        nxt = m.next_task(1)
        assert nxt is not None
        m.accept(run_task(nxt))
    m.commit()
    assert digest.waited == 2 and bytes(memory.data) == expected_output()


def test_a_failed_digest_is_raised_at_the_next_look_and_at_the_first_result() -> None:
    refusal = ValueError("corrupt database")
    digest = Digest()
    m = Master(Scheduler(PLAN), writer()[0], Progress(PLAN.n_queries, quiet=True), RankStats(0, "master"),
               verified=digest)  # fmt: skip
    m.confirm_if_failed()  # still running: no wait
    assert digest.waited == 0
    digest.finish(refusal)
    with pytest.raises(ValueError, match="corrupt database"):
        m.confirm_if_failed()
