"""Two-level scheduling, as mpiBLAST scaled on Blue Gene/P: a supermaster hands query segments to
partition masters, and each partition master schedules its segments' tasks on its own workers.

One master handing out every task of a large job becomes the bottleneck (its message rate) long before the
workers do. With partitions, rank 0 only hands out query segments (a search batch with its report pieces)
and receives finished pieces; each partition master runs the ordinary master (paramedic.engine.core.master)
over the job's plan restricted to the segments it was given, with cache affinity among its own workers.
A partition master asks for its next segment before its workers run out of work (prefetch: when the
tasks it could still hand out fall below its number of workers), so segments flow to the partitions that
work fastest: dynamic balancing at both levels.

Pure objects, events in and decisions out: the MPI runner (paramedic.engine.runtime.partitions) and the
predictor drive the same ones, each master with the one runner loop (paramedic.engine.core.runner): a
partition master's Master over its workers, and rank 0's `SegmentMaster` over the partition masters,
whose tasks are segments (the answer to a partition's request) and whose results are finished pieces.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import cast

from paramedic.blast.hits import FragmentSearch
from paramedic.engine.core.master import (
    ChooseSink,
    HoldingSink,
    Journal,
    Master,
    PieceHeld,
    PieceResult,
    Sink,
)
from paramedic.engine.core.scheduler import PieceTask, Plan, SearchTask
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats


@dataclass(frozen=True)
class Segment:
    """A query segment: one search batch of the plan, with what an earlier run finished of it."""

    batch: int
    done_pieces: tuple[int, ...] = ()  # report pieces the journal holds: not written again
    kept_searches: tuple[int, ...] = ()  # fragments whose search records the journal's store holds


def partitions(ranks: int, size: int) -> list[list[int]]:
    """Ranks 1.. cut into partitions of `size` ranks (a partition master, then its workers); the last may
    be smaller but keeps at least one worker. Rank 0 is the supermaster."""
    if size < 2:
        raise ValueError("a partition needs a master and at least one worker (--partition-size >= 2)")
    groups = [list(range(start, min(ranks, start + size))) for start in range(1, ranks, size)]
    if len(groups) > 1 and len(groups[-1]) < 2:
        groups[-2].extend(groups.pop())  # a lone rank joins the partition before it as a worker
    if not groups or len(groups[0]) < 2:
        raise ValueError(f"{ranks} ranks are too few for partitions: need a supermaster and one partition")
    return groups


class Supermaster:
    """Rank 0 with partitions: query segments in query order to whichever partition asks, and the count of
    finished pieces."""

    def __init__(
        self,
        plan: Plan,
        done_pieces: Collection[int] = (),
        kept_searches: Mapping[int, Collection[int]] | None = None,
    ):
        for batch in range(len(plan.batches)):
            plan.batch_pieces(batch)  # ValueError: the report cannot be cut into segments
        self.plan = plan
        self._done = set(done_pieces)
        kept = kept_searches or {}
        self._segments: deque[Segment] = deque(
            Segment(
                b, tuple(p for p in plan.batch_pieces(b) if p in self._done), tuple(sorted(kept.get(b, ())))
            )
            for b in range(len(plan.batches))
            if any(p not in self._done for p in plan.batch_pieces(b))
        )
        self.handed: dict[int, int] = {}  # batch -> the partition (its master's rank) that got it

    def next_segment(self, partition: int) -> Segment | None:
        """The next segment for the partition whose master is rank `partition`; None when none is left."""
        if not self._segments:
            return None
        segment = self._segments.popleft()
        self.handed[segment.batch] = partition
        return segment

    def piece_done(self, index: int) -> None:
        self._done.add(index)

    @property
    def finished(self) -> bool:
        return len(self._done) == len(self.plan.pieces)


class PartitionMaster:
    """One partition's master: the ordinary master over the segments it was given, asking for the next one
    while its workers still have work (prefetch)."""

    def __init__(self, master: Master, workers: int):
        if master.scheduler.assigned is None:
            raise ValueError("a partition master's scheduler starts with no batch assigned")
        self.master = master
        self.workers = workers
        self.requested = False  # a request for a segment is on its way to the supermaster
        self.exhausted = False  # the supermaster has no segment left

    def wants_segment(self) -> bool:
        """Ask now: no request is out, segments are left, and fewer tasks are open than workers."""
        return not self.requested and not self.exhausted and self.master.scheduler.open_tasks < self.workers

    def receive(self, segment: Segment | None, kept: Mapping[int, FragmentSearch] | None = None) -> None:
        """The supermaster's answer: a segment (with `kept`, fragment -> the earlier run's search result
        for the kept searches that could be read back), or None: nothing is left."""
        self.requested = False
        if segment is None:
            self.exhausted = True
            return
        scheduler = self.master.scheduler
        scheduler.assign(segment.batch)
        for piece in segment.done_pieces:
            scheduler.mark_piece_done(piece)
        for fragment, found in (kept or {}).items():
            scheduler.restore_search(SearchTask(segment.batch, fragment), found)
        self.master.start()  # released pieces (a segment whose searches were all kept) go out now

    @property
    def finished(self) -> bool:
        return self.exhausted and self.master.scheduler.idle


@dataclass(frozen=True)
class NoSegment:
    """The supermaster's answer to a request when no segment is left (the partition then ends)."""


NO_SEGMENT = NoSegment()
Answer = Segment | NoSegment  # what rank 0 hands a partition master that asked


@dataclass(frozen=True)
class PieceUp:
    """A partition's regenerated piece, for rank 0 to write (and journal)."""

    index: int
    data: bytes


@dataclass(frozen=True)
class PiecesShipped:
    """A partition's released pieces, for rank 0 to ship as metadata."""

    tasks: list[PieceTask]


@dataclass(frozen=True)
class ProbeUp:
    """--ship auto: a partition's probe piece, regenerated, for rank 0 to decide the job's output by (the
    first one to come up decides; each partition then hears whether it holds pieces as metadata)."""

    partition: int  # its master's rank, which waits for the answer
    task: PieceTask
    result: PieceResult


PartitionResult = PieceUp | PiecesShipped | PieceHeld | ProbeUp


class SegmentMaster:
    """Rank 0 with partitions, as the runner loop drives it: a partition master that asks is an idle
    worker, and its task is the answer (the next segment, or none left); a finished piece is its result,
    written or shipped here (journaled first when written), as one master does with its own."""

    per_worker = False

    def __init__(
        self,
        supermaster: Supermaster,
        sink: Sink | None,
        progress: Progress,
        stats: RankStats,
        journal: Journal | None = None,
        choose_sink: ChooseSink | None = None,
        tell: Callable[[int, bool], None] | None = None,
    ):
        if (sink is None) == (choose_sink is None or tell is None):
            raise ValueError("rank 0 needs a sink, or a way to choose one and to tell the partitions")
        self.supermaster = supermaster
        self.sink = sink
        self.progress = progress
        self.stats = stats
        self.journal = journal
        self.choose_sink = choose_sink  # --ship auto: the first probe to come up opens the sink
        self.tell = tell  # --ship auto: (partition, holds pieces) down to a partition that sent its probe

    def start(self) -> None:
        pass

    def next_task(self, partition: int) -> Answer:
        return self.supermaster.next_segment(partition) or NO_SEGMENT

    def accept(self, result: PartitionResult) -> None:
        if isinstance(result, ProbeUp):
            self._probed(result)
            return
        assert self.sink is not None  # a partition sends pieces once it has heard the sink's choice
        if isinstance(result, PieceHeld):  # a worker holds the bytes: only placed here
            self.supermaster.piece_done(result.task.piece)
            self.progress.advance(cast(HoldingSink, self.sink).held(result))
            return
        written = time.perf_counter()  # the journal and the writing count as writing, as under one master
        if isinstance(result, PieceUp):
            if self.journal is not None:
                self.journal.piece_done(result.index, result.data)
            self.supermaster.piece_done(result.index)
            self.progress.advance(self.sink.add(result.index, result.data))
        else:
            for task in result.tasks:
                self.supermaster.piece_done(task.piece)
            self.progress.advance(self.sink.ship(result.tasks))
        self.stats.add("write", time.perf_counter() - written)

    def _probed(self, probe: ProbeUp) -> None:
        """--ship auto: the first probe opens the output (paramedic.engine.job.sinks.AutoChooser); every
        partition's probe is answered with the choice. The probe's piece itself comes up afterwards as
        any other, written or shipped, from the partition that made it."""
        assert self.choose_sink is not None and self.tell is not None
        if self.sink is None:
            self.sink = self.choose_sink(probe.task, probe.result)
        self.tell(probe.partition, self.sink.holds_pieces)

    @property
    def finished(self) -> bool:
        return self.supermaster.finished
