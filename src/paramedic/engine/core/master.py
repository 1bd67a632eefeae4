"""Rank 0's part of a job as a plain object: results in, tasks and output out. No MPI, no BLAST+.

The runner loop (paramedic.engine.core.runner, over MPI ranks, threads, the single rank or virtual time) asks
the Master for a task whenever a worker is idle and hands it every result. The Master merges through the scheduler,
keeps the journal (durable before a result counts), and sends released pieces to the output sink:
regenerated pieces to a writer, or, when pieces ship as metadata, the pieces themselves. With `--ship
auto` there is no sink at first: the first released piece goes to a worker as the probe, an ordinary
regeneration task, and its output and cost choose the sink (paramedic.ship.auto) while the other workers
go on searching. Time enters only through the results (a piece's BLAST+ seconds), so tests drive the
Master in virtual time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from paramedic.blast.hits import FragmentSearch
from paramedic.engine.core.placement import Placement
from paramedic.engine.core.scheduler import PieceTask, Scheduler, SearchTask, Task
from paramedic.output.stitch import Agreement
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats

if TYPE_CHECKING:
    from paramedic.db.manifest import Verification


@dataclass(frozen=True)
class Replay:
    """What a journal holds from earlier runs of the search."""

    searches: tuple[SearchTask, ...]  # in the order to replay them
    pieces: tuple[int, ...]

    @property
    def empty(self) -> bool:
        return not self.searches and not self.pieces


NOTHING = Replay((), ())  # a run with no journal, or a new one


class Journal(Protocol):
    """What a master keeps in the journal and reads back from it (paramedic.engine.rank.journal.Journal, rank
    0's files: the master itself writes none)."""

    def load_search(self, task: SearchTask, queries: int, alignments: bool) -> FragmentSearch | None: ...

    def load_piece(self, index: int) -> bytes | None: ...

    def search_done(self, task: SearchTask, result: FragmentSearch) -> None: ...

    def piece_done(self, index: int, data: bytes) -> None: ...


@dataclass(frozen=True)
class SearchResult:
    """A fragment search's merge keys for its batch's queries, with the alignments unless `stored`: the
    worker then wrote its whole result to the search store (paramedic.engine.rank.store), the journal's when
    there is one, before sending this."""

    task: SearchTask
    found: FragmentSearch
    stored: bool = False


@dataclass(frozen=True)
class PieceResult:
    """A piece of the report: BLAST+'s bytes for the piece's queries, and the seconds BLAST+ took."""

    task: PieceTask
    data: bytes
    seconds: float


@dataclass(frozen=True)
class PieceHeld:
    """A piece of the report that stays with the rank that wrote it (--output-strategy other than
    master, paramedic.output.strategies): its size once stitched for its position, the rank holding it,
    what the stitcher checks across pieces, and the seconds BLAST+ took. Not journaled: rank 0 never has
    the bytes."""

    task: PieceTask
    size: int
    seconds: float
    holder: int
    agreement: Agreement


Result = SearchResult | PieceResult | PieceHeld


class Sink(Protocol):
    """Where the job's output goes (paramedic.engine.job.sinks)."""

    @property
    def holds_pieces(self) -> bool:
        """True: released pieces are shipped as they are (metadata), never regenerated here."""
        ...

    def add(self, index: int, data: bytes) -> int:
        """A regenerated piece; returns how many queries became written."""
        ...

    def ship(self, tasks: list[PieceTask]) -> int:
        """Released pieces, shipped as metadata; returns how many queries they hold."""
        ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def placement(self) -> Placement | None:
        """None: rank 0 writes or ships the pieces; else the workers write them and the runner places them
        with what this returns (paramedic.engine.core.placement)."""
        ...


class HoldingSink(Sink, Protocol):
    """A sink whose pieces the workers hold and write (paramedic.engine.job.sinks.WorkerSink)."""

    def held(self, result: PieceHeld) -> int:
        """A piece held by a worker; returns how many queries it holds."""
        ...


# --ship auto: given the probe piece and its regenerated output, open the sink the job ships to.
ChooseSink = Callable[[PieceTask, PieceResult], Sink]


class Master:
    def __init__(
        self,
        scheduler: Scheduler,
        sink: Sink | None,
        progress: Progress,
        stats: RankStats,
        journal: Journal | None = None,
        replay: Replay = NOTHING,
        choose_sink: ChooseSink | None = None,
        verified: Verification | None = None,
    ):
        if (sink is None) == (choose_sink is None):
            raise ValueError("a master needs a sink, or a way to choose one (--ship auto)")
        self.scheduler = scheduler
        self.sink = sink
        self.progress = progress
        self.stats = stats
        self.journal = journal
        self.replay = replay
        self.choose_sink = choose_sink
        self.probe: PieceTask | None = None  # --ship auto: the piece that decides, once released
        self.probe_handed_out = False
        self.scheduler.hold_pieces = sink is None or sink.holds_pieces
        # The database's digest, when it still runs (paramedic.engine.job.job `Job.verified`): waited for
        # before anything the workers found is taken, journaled or written.
        self._verified = verified

    def confirm(self) -> None:
        """Wait for the database's digest if it still runs; raises its refusal."""
        if self._verified is not None:
            self._verified()
            self._verified = None

    def confirm_if_failed(self) -> None:
        """Raise the digest's refusal if it has already come (a runner's look while it waits)."""
        if self._verified is not None and self._verified.failed:
            self.confirm()

    # -- the runner's calls -------------------------------------------------------------------------
    def start(self) -> None:
        """Before the first task: what an earlier run of the job finished (the journal)."""
        if self.journal is not None:
            if not self.replay.empty:
                self.confirm()  # what an earlier run found is taken and written from here
            # alignments travel with the tasks only when the workers cannot read them in the store
            inline = self.scheduler.keep_alignments and not self.scheduler.alignments_stored
            for task in self.replay.searches:
                queries = len(self.scheduler.plan.batches[task.batch])
                found = self.journal.load_search(task, queries, alignments=inline)
                if found is not None:
                    self.scheduler.restore_search(task, found)
                    self.progress.search_done()
        if self.sink is not None and not self.sink.holds_pieces:
            self._restore_pieces()
        self._route_released()

    def next_task(self, worker: int) -> Task | None:
        """The task for an idle worker, or None when nothing can be handed out now."""
        if self.probe is not None and not self.probe_handed_out:
            self.probe_handed_out = True
            return self.probe
        return self.scheduler.next_task(worker)

    def accept(self, result: Result) -> None:
        """A worker's result. Recorded in the journal before it counts."""
        self.confirm()
        start = time.perf_counter()
        if isinstance(result, SearchResult):
            if self.journal is not None and not result.stored:
                self.journal.search_done(result.task, result.found)
            self.scheduler.search_done(result.task, result.found)
            self.progress.search_done()
            self.stats.add("merge", time.perf_counter() - start)
            start = time.perf_counter()
            self._route_released()
        elif isinstance(result, PieceHeld):  # the bytes stay with a worker: not journaled
            self.scheduler.piece_done(result.task)
            self.progress.advance(cast(HoldingSink, self.sink).held(result))
        elif self.sink is None:  # undecided: only the probe was handed out as a piece
            self._decide(result)
        else:
            assert self.sink is not None and not self.sink.holds_pieces
            if self.journal is not None:
                self.journal.piece_done(result.task.piece, result.data)
            self.scheduler.piece_done(result.task)
            self.progress.advance(self.sink.add(result.task.piece, result.data))
        self.stats.add("write", time.perf_counter() - start)

    @property
    def finished(self) -> bool:
        return self.scheduler.finished

    @property
    def per_worker(self) -> bool:
        """Whether the task handed out depends on which idle worker asks (--stage)."""
        return self.scheduler.per_worker

    def commit(self) -> None:
        """Every piece is written or shipped: the output is made final; the journal goes."""
        self.confirm()
        assert self.sink is not None
        self.sink.commit()

    def abort(self) -> None:
        if self.sink is not None:
            self.sink.abort()

    # -- output -------------------------------------------------------------------------------------
    def _route_released(self) -> None:
        """Pieces whose queries are all merged: shipped as metadata, or (undecided) the probe picked."""
        if not self.scheduler.hold_pieces:
            return  # they became regeneration tasks
        if self.sink is None:
            if self.probe is None and self.scheduler.released:
                first = min(self.scheduler.released, key=lambda t: t.piece)
                # searched, as the site would
                self.probe = dataclasses.replace(first, alignments=None, stored=None)
            return
        released = self.scheduler.take_released()
        if released:
            self.progress.advance(self.sink.ship(released))

    def _decide(self, probe: PieceResult) -> None:
        assert self.choose_sink is not None and self.probe is not None
        self.sink = self.choose_sink(self.probe, probe)
        if self.sink.holds_pieces:  # metadata: every held piece ships, the probe's too
            self._route_released()
            return
        # the output ships: held pieces are regenerated from now on, the probe's output is written
        self.scheduler.stop_holding()
        self._restore_pieces()
        piece = self.probe.piece
        if piece not in self.replay.pieces:
            if self.journal is not None:
                self.journal.piece_done(piece, probe.data)
            self.scheduler.mark_piece_done(piece)
            self.progress.advance(self.sink.add(piece, probe.data))

    def _restore_pieces(self) -> None:
        """Pieces an earlier run of the job wrote, from the journal, into a sink that writes pieces."""
        assert self.sink is not None
        if self.journal is None:
            return
        for index in self.replay.pieces:
            data = self.journal.load_piece(index)
            if data is not None:
                self.scheduler.mark_piece_done(index)
                self.progress.advance(self.sink.add(index, data))
