"""Two-level scheduling without MPI (paramedic.engine.core.hierarchy): a supermaster and partition masters
driven in virtual time by the engine's runner loop; the output equals one master's, segments flow to the fastest partition."""

from __future__ import annotations

import pytest

from paramedic.engine.core.hierarchy import PartitionMaster, Segment, SegmentMaster, Supermaster, partitions
from paramedic.engine.core.master import Master
from paramedic.engine.core.scheduler import Plan, Scheduler, SearchTask, Task
from paramedic.engine.predict.virtual import ForwardSink, PartitionsLink, VirtualNetwork, WorkersLink
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats
from tests.unit.test_master import PLAN, expected_output, run_task, writer


class Speeds(WorkersLink):
    """A partition's workers in virtual time, each at its own speed: a task takes 1 / speed."""

    def __init__(self, plan: Plan, speeds: list[float], up: PartitionsLink):
        super().__init__(len(speeds), lambda task: run_task(task, plan), up=up)
        self.speeds = speeds

    def due(self, worker: int, task: Task) -> float:
        return self.now + 1 / self.speeds[worker - 1]


def run(
    plan: Plan, speeds: list[list[float]], done_pieces: tuple[int, ...] = ()
) -> tuple[bytes, dict[int, list[int]]]:
    """Partitions with workers of the given speeds, every master on the engine's runner loop in one
    virtual time (paramedic.engine.predict.virtual); returns the output and, per partition, the batches it got."""
    sink, memory = writer(plan)
    supermaster = Supermaster(plan, done_pieces)
    for index in done_pieces:  # an earlier run wrote them (the journal)
        sink.add(
            index,
            b"".join(
                line
                for line in expected_output(plan).splitlines(keepends=True)
                if int(line[1 : line.index(b"\t")]) in plan.pieces[index]
            ),
        )
    network = VirtualNetwork()
    rank0 = PartitionsLink()
    links = []
    for workers in speeds:
        link = Speeds(plan, workers, rank0)
        master = Master(Scheduler(plan, assigned=set()), ForwardSink(link), Progress(0, quiet=True),
                        RankStats(0, "master"))  # fmt: skip
        link.partition = PartitionMaster(master, len(workers))
        network.join(master, link)
        links.append(link)
    network.join(
        SegmentMaster(supermaster, sink, Progress(0, quiet=True), RankStats(0, "supermaster")), rank0
    )
    network.run()
    assert supermaster.finished and all(link.partition.finished for link in links)
    got: dict[int, list[int]] = {p: [] for p in range(len(speeds))}
    for batch, p in sorted(supermaster.handed.items()):
        got[p].append(batch)
    sink.commit()
    return bytes(memory.data), got


PLAN6 = Plan(
    batches=tuple(range(3 * b, 3 * b + 3) for b in range(6)),
    n_fragments=3,
    pieces=tuple(range(3 * b + s, min(3 * b + 3, 3 * b + s + 2)) for b in range(6) for s in (0, 2)),
    hitlist_size=5,
)


@pytest.mark.parametrize("plan", [PLAN, PLAN6], ids=["3 segments", "6 segments"])
@pytest.mark.parametrize("speeds", [[[1.0]], [[1.0, 1.0], [1.0]], [[1.0], [1.0], [1.0], [1.0]]])
def test_partitions_write_what_one_master_writes(plan: Plan, speeds: list[list[float]]) -> None:
    output, got = run(plan, speeds)
    assert output == expected_output(plan)
    assert sorted(b for batches in got.values() for b in batches) == list(range(len(plan.batches)))


def test_segments_flow_to_the_faster_partition() -> None:
    _, got = run(PLAN6, [[4.0, 4.0], [1.0, 1.0]])
    assert len(got[0]) > len(got[1]) >= 1


def test_a_partition_prefetches_its_next_segment_before_its_workers_run_dry() -> None:
    scheduler = Scheduler(PLAN6, assigned=set())
    pm = PartitionMaster(
        Master(scheduler, writer(PLAN6)[0], Progress(0, quiet=True), RankStats(0, "m")), workers=2
    )
    assert pm.wants_segment()
    pm.requested = True
    assert not pm.wants_segment()  # one request at a time
    pm.receive(Segment(0))
    assert scheduler.open_tasks == 3 and not pm.wants_segment()  # 3 open tasks for 2 workers
    first, second = pm.master.next_task(0), pm.master.next_task(1)
    assert {first, second} == {SearchTask(0, 0), SearchTask(0, 1)}
    assert pm.wants_segment()  # 1 open task < 2 workers: ask before they run dry
    pm.requested = True
    pm.receive(None)
    assert pm.exhausted and not pm.finished and not pm.wants_segment()


def test_pieces_an_earlier_run_wrote_are_not_handed_out_again() -> None:
    supermaster = Supermaster(PLAN6, done_pieces=(0, 1, 4))  # batch 0 whole, half of batch 2
    segments = []
    while (segment := supermaster.next_segment(1)) is not None:
        segments.append(segment)
    assert [s.batch for s in segments] == [1, 2, 3, 4, 5]
    assert segments[1].done_pieces == (4,)
    output, _ = run(PLAN6, [[1.0], [1.0]], done_pieces=(0, 1, 4))
    assert output == expected_output(PLAN6)


def test_partitions_of_the_ranks() -> None:
    assert partitions(9, 4) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert partitions(10, 4) == [[1, 2, 3, 4], [5, 6, 7, 8, 9]]  # a lone rank joins as a worker
    assert partitions(8, 4) == [[1, 2, 3, 4], [5, 6, 7]]
    with pytest.raises(ValueError):
        partitions(2, 4)
    with pytest.raises(ValueError):
        partitions(9, 1)


def test_a_report_in_one_piece_cannot_be_cut_into_segments() -> None:
    whole = Plan(batches=(range(0, 2), range(2, 4)), n_fragments=2, pieces=(range(0, 4),), hitlist_size=5)
    with pytest.raises(ValueError, match="cross"):
        Supermaster(whole)
