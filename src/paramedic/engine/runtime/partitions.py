"""The job on MPI ranks in partitions (--partition-size): rank 0 the supermaster, each partition a master
and its workers (paramedic.engine.core.hierarchy).

Rank 0 hands out query segments on request, writes (or ships) the pieces the partitions send it, keeps
the journal's pieces and writes the run record. A partition master runs the ordinary master over the
segments it was given and hands their tasks to its workers over a communicator of the partition's own,
with the same runner and worker loop as a one-master job (paramedic.engine.runtime.ranks); its searches' results
stay in the search store as there. Pieces reach rank 0 as they are written; the workers' figures and the
merged subjects once the partition is done.

With workers writing the report (--output-strategy other than master) rank 0 places the pieces from
their sizes as with one master, and a partition master relays: its workers' sizes up, rank 0's orders and
collective rounds down (`Relay`); the file is open over the whole job, so a segment's writer may gather
pieces from workers of other partitions.

With --ship auto each partition master holds its pieces and regenerates its first released piece as a
probe (the one master's way), sends it up (TAG_PROBE) and waits for rank 0's answer (TAG_MODE: whether
it holds pieces as metadata). The first probe to reach rank 0 opens the output by the ParaMEDIC rule;
later probes hear the same choice (in metadata mode their regeneration is the only work spent twice).
Not with --from-metadata: refused up front.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from mpi4py import MPI

from paramedic.blast.forkserver import close_fork_servers
from paramedic.blast.hits import FragmentSearch
from paramedic.engine.core.hierarchy import (
    Answer,
    PartitionMaster,
    PartitionResult,
    PiecesShipped,
    PieceUp,
    ProbeUp,
    Segment,
    SegmentMaster,
    Supermaster,
    partitions,
)
from paramedic.engine.core.master import ChooseSink, Master, PieceHeld, PieceResult, Replay
from paramedic.engine.core.placement import Placement
from paramedic.engine.core.runner import Arrival, Driven, Transport, drive
from paramedic.engine.core.scheduler import PieceTask, Plan
from paramedic.engine.job.job import Job
from paramedic.engine.job.outcome import run_record
from paramedic.engine.job.shell import JobOutput, JobShell, new_scheduler
from paramedic.engine.job.sinks import workers_write
from paramedic.engine.rank.journal import Journal
from paramedic.engine.rank.mpiio import Holder
from paramedic.engine.rank.store import RecordError, Store
from paramedic.engine.runtime.ranks import (
    POLL_MAX_SECONDS,
    POLL_SECONDS,
    TAG_ERROR,
    open_output,
    patient_recv,
    run_tasks,
    run_worker,
    run_workers,
)
from paramedic.errors import InternalError, JobError
from paramedic.output.strategies import Order, Round
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord
from paramedic.ship.registry import ships_pieces

# Messages between rank 0 and the partition masters (the workers' tags, engine/runtime/ranks.py, are 0-9).
TAG_WANT, TAG_SEGMENT, TAG_PIECE, TAG_SHIP, TAG_DONE = range(20, 25)
# ... when the workers write the report: a piece's size and holder (up), orders, a collective round,
# the partition is in it (up), the last round and the end (down)
TAG_HELD, TAG_ORDERS, TAG_ROUND, TAG_JOINED, TAG_FINAL = range(25, 30)
# ... with --ship auto: a partition's probe piece (up), whether it holds its pieces as metadata (down)
TAG_PROBE, TAG_MODE = range(30, 32)
# rank 0 to each partition master: the job's queries, which worker ranks do not hold (Job.for_workers)
TAG_QUERIES = 32


def run_partitioned(
    job: Job,
    plan: Plan,
    comm: MPI.Comm,
    workdir: Path,
    command: list[str],
    journal: Journal | None,
    replay: Replay,
    store: Store | None,
    size: int,
) -> RunRecord | None:
    """This rank's part in a job of partitions of `size` ranks; rank 0 returns the run record."""
    groups = partitions(comm.Get_size(), size)
    rank = comm.Get_rank()
    color = next((i for i, group in enumerate(groups) if rank in group), MPI.UNDEFINED)
    local = comm.Split(color, key=rank)
    if rank == 0:
        for group in groups:  # a partition master sends each task's queries with it
            comm.send(job.queries, dest=group[0], tag=TAG_QUERIES)
        return _supermaster(job, plan, comm, groups, command, journal, replay, store)
    group = groups[color]
    if rank == group[0]:
        job = dataclasses.replace(job, queries=comm.recv(source=0, tag=TAG_QUERIES))
        _partition_master(job, plan, comm, local, group, store)
    else:
        run_worker(job, plan, local, workdir, store, world=comm)
    return None


# -- a partition master ------------------------------------------------------------------------------
class Forward:
    """A partition master's sink: its pieces go to rank 0, which writes or ships them."""

    def __init__(self, comm: MPI.Comm, holds_pieces: bool):
        self.comm = comm
        self.holds_pieces = holds_pieces

    def add(self, index: int, data: bytes) -> int:
        self.comm.send((index, data), dest=0, tag=TAG_PIECE)
        return 0

    def ship(self, tasks: list[PieceTask]) -> int:
        self.comm.send(tasks, dest=0, tag=TAG_SHIP)
        return 0

    def held(self, result: PieceHeld) -> int:
        """A piece a worker holds (it writes it): rank 0 places it."""
        self.comm.send(result, dest=0, tag=TAG_HELD)
        return 0

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def placement(self) -> None:
        return None  # rank 0 places a partition's pieces (Placing)


@dataclass
class SupermasterLink:
    """The partition master's side of its supermaster: asks for segments, receives them."""

    partition: PartitionMaster
    comm: MPI.Comm
    store: Store | None
    plan: Plan

    def poll(self) -> bool:
        if self.partition.wants_segment():
            self.comm.send(None, dest=0, tag=TAG_WANT)
            self.partition.requested = True
        if not self.comm.Iprobe(source=0, tag=TAG_SEGMENT):
            return False
        segment: Segment | None = self.comm.recv(source=0, tag=TAG_SEGMENT)
        self.partition.receive(segment, self._kept(segment))
        return True

    def _kept(self, segment: Segment | None) -> dict[int, FragmentSearch]:
        """The searches an earlier run kept in the journal's store, read back (a record that does not read
        back is searched again)."""
        if segment is None or self.store is None:
            return {}
        queries = len(self.plan.batches[segment.batch])
        kept = {}
        for fragment in segment.kept_searches:
            try:
                kept[fragment] = self.store.keys(segment.batch, fragment, queries)
            except RecordError:
                continue
        return kept

    @property
    def waiting(self) -> bool:
        return not self.partition.exhausted

    @property
    def finished(self) -> bool:
        return self.partition.finished


def _partition_master(
    job: Job, plan: Plan, comm: MPI.Comm, local: MPI.Comm, group: list[int], store: Store | None
) -> None:
    stats = RankStats(rank=comm.Get_rank(), role="partition master")
    scheduler = new_scheduler(job, plan, store, group, assigned=set())  # --stage: the partition's nodes
    if job.target.ship is not None and job.target.ship.mode == "auto":  # rank 0 decides from the first probe
        master = Master(scheduler, None, Progress(0, quiet=True), stats, choose_sink=_asking(comm))
    else:
        holds = job.target.ship is not None and ships_pieces(job.target.ship.mode)
        master = Master(scheduler, Forward(comm, holds), Progress(0, quiet=True), stats)
    partition = PartitionMaster(master, workers=local.Get_size() - 1)
    link = SupermasterLink(partition, comm, store, plan)
    written = (0, 0)
    if workers_write(job):
        file, data_comm = open_output(comm, None)
        relay = Relay(comm, group)
        worker_stats, written = run_tasks(
            master, local, stats, job.queries, relay, Holder(file, data_comm), upstream=link, ranks=group
        )
    else:
        worker_stats = run_workers(master, local, stats, job.queries, upstream=link, ranks=group)
    merged = {q: s for b in scheduler.assigned or () for q in plan.batches[b] if (s := scheduler.metadata(q))}
    close_fork_servers()
    stats.measure_memory()
    comm.send(([stats, *worker_stats], merged, scheduler.searched_again, written), dest=0, tag=TAG_DONE)


class Relay:
    """A partition master's conductor when its workers write the report: rank 0 places the pieces and
    calls the rounds; this passes its orders and rounds on to the partition's workers (local ranks)."""

    decides = False  # its workers wait for rank 0's last round once the partition's work is done

    def __init__(self, comm: MPI.Comm, group: list[int]):
        self.comm = comm
        self.local = {rank: i for i, rank in enumerate(group)}
        self._orders: dict[int, list[Order]] = {}
        self._round: dict[int, Round] | None = None
        self._final: dict[int, Round] | None = None
        self._ended = False

    def poll(self) -> bool:
        status = MPI.Status()
        got = False
        while self.comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status) and status.Get_tag() in (
            TAG_ORDERS,
            TAG_ROUND,
            TAG_FINAL,
        ):
            tag = status.Get_tag()
            message = self.comm.recv(source=0, tag=tag)
            got = True
            if tag == TAG_ORDERS:
                for rank, orders in message.items():
                    self._orders.setdefault(self.local[rank], []).extend(orders)
            elif tag == TAG_ROUND:
                self._round = self._mapped(message)
            else:
                self._final = self._mapped(message) if message is not None else None
                self._ended = True
        return got

    def _mapped(self, shares: dict[int, Round]) -> dict[int, Round]:
        return {self.local[rank]: share for rank, share in shares.items()}

    def orders(self) -> dict[int, list[Order]]:
        orders, self._orders = self._orders, {}
        return orders

    def start_round(self) -> dict[int, Round] | None:
        shares, self._round = self._round, None
        return shares

    def entering_round(self) -> None:
        self.comm.send(None, dest=0, tag=TAG_JOINED)

    @property
    def ended(self) -> bool:
        return self._ended

    def final(self) -> dict[int, Round] | None:
        return self._final


class Placing:
    """Rank 0's side when the workers write the report: places the pieces as their sizes arrive (the
    sink's output strategy), sends each partition master its workers' orders, runs the collective rounds
    (rank 0 enters once every partition is in), and at the end the last round and the file's close."""

    def __init__(self, sink: Placement, comm: MPI.Comm, groups: list[list[int]]):
        self.sink = sink
        self.comm = comm
        self.groups = groups
        self.master_of = {rank: group[0] for group in groups for rank in group}
        file, data_comm = open_output(comm, sink.tmp)
        self.holder = Holder(file, data_comm)
        sink.attach(self.holder)
        self.round: dict[int, Round] | None = None
        self.joined: set[int] = set()
        self.closed = False

    def send_orders(self) -> None:
        per_master: dict[int, dict[int, list[Order]]] = {}
        for rank, orders in self.sink.strategy.take().items():
            if rank == 0:
                self.holder.run(orders)
            else:
                per_master.setdefault(self.master_of[rank], {})[rank] = orders
        for master, orders_of in per_master.items():
            self.comm.send(orders_of, dest=master, tag=TAG_ORDERS)

    def joined_round(self, master: int) -> None:
        self.joined.add(master)

    def step(self, finished: bool) -> None:
        """After each message: orders out, a round started or entered, or (all pieces placed) the end."""
        self.send_orders()
        strategy = self.sink.strategy
        if self.round is None and not finished and strategy.round_due:
            self.round = strategy.start_round(self.comm.Get_size())
            self.joined = set()
            self._down(TAG_ROUND, self.round)
        if self.round is not None and len(self.joined) == len(self.groups):
            self.holder.round(self.round[0])
            self.round = None
        if finished and self.round is None and not self.closed:
            final = strategy.start_round(self.comm.Get_size())
            self._down(TAG_FINAL, final)
            if final is not None:
                self.holder.round(final[0])
            self.holder.drain()
            self.holder.file.close()
            self.sink.write_seconds += self.holder.file.seconds
            self.sink.acknowledge(self.holder.written_pieces, self.holder.written_bytes)
            self.closed = True

    def _down(self, tag: int, shares: dict[int, Round] | None) -> None:
        for group in self.groups:
            part = {rank: shares[rank] for rank in group} if shares is not None else None
            self.comm.send(part, dest=group[0], tag=tag)


def _asking(comm: MPI.Comm) -> ChooseSink:
    """--ship auto, a partition master's side: its probe goes up, and the sink is rank 0's answer."""

    def ask(probe: PieceTask, result: PieceResult) -> Forward:
        comm.send((probe, result), dest=0, tag=TAG_PROBE)
        wait = POLL_SECONDS
        while not comm.Iprobe(source=0, tag=TAG_MODE):  # not patient_recv: a segment may come meanwhile
            time.sleep(wait)
            wait = min(2 * wait, POLL_MAX_SECONDS)
        holds: bool = comm.recv(source=0, tag=TAG_MODE)
        return Forward(comm, holds)

    return ask


# -- the supermaster ---------------------------------------------------------------------------------
class PartitionTransport(Transport[Answer, PartitionResult]):
    """Rank 0's partition masters, as the runner loop's workers: a request (TAG_WANT) makes one idle,
    its answer goes down as TAG_SEGMENT (None: no segment left); pieces come up as results that leave
    the partition at work. A partition's end (TAG_DONE) brings its ranks' figures and merged subjects;
    the work is over when every partition has ended. With workers writing the report, rank 0's placing
    steps after every message."""

    def __init__(
        self,
        comm: MPI.Comm,
        groups: list[list[int]],
        stats: RankStats,
        segments: SegmentMaster,
        placing: Placing | None,
    ):
        self.comm = comm
        self.count = len(groups)
        self.running = len(groups)
        self.stats = stats
        self.segments = segments
        self.placing = placing
        self.heard = False  # placing steps after each message, not before the first
        self.stats_of: list[RankStats] = []
        self.merged: dict[int, list[int]] = {}
        self.searched_again = 0

    def ready(self) -> list[int]:
        return []  # a partition master asks (TAG_WANT)

    @property
    def workers(self) -> int:
        return self.count

    def ended(self, master: Driven[Answer, PartitionResult]) -> bool:
        return self.running == 0

    def between(self, idle: deque[int]) -> bool:
        if self.placing is not None and self.running and self.heard:
            self.placing.step(self.segments.finished)
        return False

    def send(self, worker: int, task: Answer) -> None:
        segment = task if isinstance(task, Segment) else None
        self.comm.send(segment, dest=worker, tag=TAG_SEGMENT)

    def receive(self) -> Arrival[PartitionResult] | None:
        message, source, tag, nbytes = patient_recv(self.comm)
        self.stats.received_bytes += nbytes
        self.heard = True
        if tag == TAG_WANT:
            return Arrival(source, None)
        if tag == TAG_PIECE:
            return Arrival(source, PieceUp(*message), idle=False)
        if tag == TAG_SHIP:
            return Arrival(source, PiecesShipped(message), idle=False)
        if tag == TAG_HELD:
            return Arrival(source, message, idle=False)
        if tag == TAG_PROBE:
            return Arrival(source, ProbeUp(source, *message), idle=False)
        if tag == TAG_JOINED and self.placing is not None:
            self.placing.joined_round(source)
        elif tag == TAG_DONE:
            figures, part, again, written = message
            self.stats_of.extend(figures)
            self.merged.update(part)
            self.searched_again += again
            if self.placing is not None:
                self.placing.sink.acknowledge(*written)
            self.running -= 1
        elif tag == TAG_ERROR:  # a partition master's own failure travels as an abort, not here
            raise JobError(f"rank {source}: {message[0]}", message[1])
        return None


def _supermaster(
    job: Job,
    plan: Plan,
    comm: MPI.Comm,
    groups: list[list[int]],
    command: list[str],
    journal: Journal | None,
    replay: Replay,
    store: Store | None,
) -> RunRecord:
    start = time.perf_counter()
    stats = RankStats(rank=0, role="supermaster")
    progress = Progress(len(job.queries), quiet=job.quiet)
    shell = JobShell(job, journal, progress)
    opened: JobOutput | None = None
    segments: SegmentMaster | None = None

    def abort() -> None:
        output = segments.sink if segments is not None else opened.sink if opened is not None else None
        if output is not None:
            output.abort()

    with shell.running(abort):
        opened = shell.open_output(plan)
        sink, chooser = opened.sink, opened.chooser
        done = list(opened.done_pieces(plan))  # an earlier run's job finished at the site
        if journal is not None and sink is not None and not sink.holds_pieces:
            for index in replay.pieces:
                data = journal.load_piece(index)
                if data is not None:
                    done.append(index)
                    progress.advance(sink.add(index, data))
        kept: dict[int, list[int]] = {}
        if store is not None:  # the partition masters read the kept searches back from the store
            for task in replay.searches:
                kept.setdefault(task.batch, []).append(task.fragment)
        supermaster = Supermaster(plan, done, kept)
        placement = sink.placement() if sink is not None else None  # the workers write: rank 0 places
        placing = Placing(placement, comm, groups) if placement is not None else None
        if journal is not None:
            journal.kept_searches = sum(len(f) for b, f in kept.items())

        def tell(partition: int, holds: bool) -> None:
            comm.send(holds, dest=partition, tag=TAG_MODE)

        segments = SegmentMaster(
            supermaster, sink, progress, stats, journal, chooser, tell if chooser is not None else None
        )
        transport = PartitionTransport(comm, groups, stats, segments, placing)
        drive(segments, transport)
        merged, searched_again, stats_of = transport.merged, transport.searched_again, transport.stats_of
        if not supermaster.finished:
            raise InternalError("internal: the partitions finished with pieces left unwritten")
        if placing is not None:
            placing.sink.closed_by_ranks()
        metadata = [merged.get(q, []) for q in range(len(job.queries))]
        shell.complete(opened.output.commit, metadata)
    stats.measure_memory()
    workers = sum(len(group) - 1 for group in groups)
    _note(job, groups)
    return run_record(
        job,
        plan,
        command,
        wall_seconds=time.perf_counter() - start,
        ranks=comm.Get_size(),
        workers=workers,
        sink=opened.output,
        merged=metadata,
        searched_again=searched_again,
        journal=journal,
        store=store,
        ranks_stats=[stats, *sorted(stats_of, key=lambda s: s.rank)],
        partitions=len(groups),
    )


def _note(job: Job, groups: list[list[int]]) -> None:
    if not job.quiet:
        sizes = ", ".join(str(len(g)) for g in groups)
        print(f"paramedic: {len(groups)} partitions of {sizes} ranks under rank 0", file=sys.stderr)


def check_partitioning(job: Job, plan: Plan, ranks: int, size: int) -> None:
    """Refuse up front what partitions cannot do (rank 0, before any rank starts work)."""
    try:
        partitions(ranks, size)
        for batch in range(len(plan.batches)):
            plan.batch_pieces(batch)
    except ValueError as exc:
        raise JobError(f"--partition-size {size}: {exc}", 2) from exc
