"""What every MPI rank shares: waiting for a message without busy-polling, the tags, the worker's loop,
and the runner that hands a master's tasks to its workers (rank 0's, or a partition master's).

Waiting is done by probing and sleeping, never in a blocking receive: MPICH busy-polls a core in a blocking
receive, which on a 2-core machine slowed the workers by 40-55% (docs/DESIGN.md). Any failure on any rank
ends the whole job with the failing rank's message: workers report errors to their master, which raises.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from mpi4py import MPI

from paramedic.blast.forkserver import close_fork_servers
from paramedic.engine.core.master import Master, PieceHeld, PieceResult, Result
from paramedic.engine.core.placement import Placement
from paramedic.engine.core.runner import Arrival, Driven, Transport, drive
from paramedic.engine.core.scheduler import Plan, Task
from paramedic.engine.job.job import Job
from paramedic.engine.job.sinks import workers_write
from paramedic.engine.rank.mpiio import Holder, OutputFile
from paramedic.engine.rank.store import Store
from paramedic.engine.runtime.execute import execute, task_queries
from paramedic.errors import JobError, ParamedicError
from paramedic.output.stitch import stitch_alone
from paramedic.output.strategies import Order, Round
from paramedic.report.record import RankStats

# Waits between probes start short and double up to the maximum: a master waiting through a long search
# wakes 100 times a second instead of 500 (each wake-up takes a core from a BLAST+ run for a moment),
# and a message is still picked up within 10 ms.
POLL_SECONDS = 0.001
POLL_MAX_SECONDS = 0.01
TAG_READY, TAG_RESULT, TAG_ERROR, TAG_TASK, TAG_STOP, TAG_STATS = range(6)
# Workers writing the report (paramedic.output.strategies): orders from rank 0, a collective round, a
# worker's word that it is in the round, its count of what it wrote
TAG_WRITE, TAG_ROUND, TAG_JOINED, TAG_WRITTEN = range(6, 10)


def patient_recv(comm: MPI.Comm, source: int = MPI.ANY_SOURCE) -> tuple[Any, int, int, int]:
    """Receive without busy-polling a core: (message, source rank, tag, bytes received)."""
    got = patient_recv_or(comm, source)
    assert got is not None
    return got


def patient_recv_or(
    comm: MPI.Comm, source: int = MPI.ANY_SOURCE, also: Callable[[], bool] | None = None
) -> tuple[Any, int, int, int] | None:
    """As patient_recv; while waiting, `also()` handles other messages (a partition master's from the
    supermaster) and returning True ends the wait with None."""
    status = MPI.Status()
    wait = POLL_SECONDS
    while not comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status):
        if also is not None and also():
            return None
        time.sleep(wait)
        wait = min(2 * wait, POLL_MAX_SECONDS)
    size = status.Get_count(MPI.BYTE)
    message = comm.recv(source=status.Get_source(), tag=status.Get_tag())
    return message, status.Get_source(), status.Get_tag(), size


def run_worker(
    job: Job, plan: Plan, comm: MPI.Comm, workdir: Path, store: Store | None, world: MPI.Comm | None = None
) -> None:
    """A worker's loop: tasks from its master (rank 0 of `comm`) until told to stop; errors go to the
    master, which ends the job with them. `world`: the whole job's communicator, when `comm` is a
    partition's."""
    if workers_write(job):
        return run_writing_worker(job, plan, comm, workdir, store, world or comm)
    stats = RankStats(rank=(world or comm).Get_rank(), role="worker")
    comm.send(None, dest=0, tag=TAG_READY)
    while True:
        message, _, tag, _ = patient_recv(comm, source=0)
        if tag == TAG_STOP:
            break
        task, queries = message  # a task comes with its queries (RankTransport.send)
        try:
            payload = execute(task, job, plan, workdir, stats, store, queries)
        except Exception as exc:
            send_failure(comm, exc)
            return
        comm.send(payload, dest=0, tag=TAG_RESULT)
    close_fork_servers()  # their BLAST+ runs then count in this rank's peak memory
    stats.measure_memory()
    comm.send(stats, dest=0, tag=TAG_STATS)


def send_failure(comm: MPI.Comm, exc: Exception) -> None:
    """A worker's failure, to its master, which ends the whole job with it: a bug too, never a hang."""
    if isinstance(exc, ParamedicError):
        comm.send((str(exc), exc.exit_code), dest=0, tag=TAG_ERROR)
    else:
        comm.send((f"internal error: {type(exc).__name__}: {exc}", 1), dest=0, tag=TAG_ERROR)


class Upstream(Protocol):
    """Where a partition master's work comes from (paramedic.engine.runtime.partitions): polled while it waits."""

    def poll(self) -> bool:
        """Handle what came from above, without blocking; True when something did."""
        ...

    @property
    def waiting(self) -> bool:
        """Work was asked for and may still come."""
        ...

    @property
    def finished(self) -> bool: ...


def run_workers(
    master: Master,
    comm: MPI.Comm,
    stats: RankStats,
    queries: Sequence[tuple[str, str]],
    upstream: Upstream | None = None,
    ranks: Sequence[int] | None = None,
) -> list[RankStats]:
    """The MPI runner: hand tasks to idle worker ranks, pass their results to the master; then stop the
    workers and collect their figures. `stats`: this master's, which counts the bytes of the results.
    A partition master passes its `upstream` (the supermaster) and its ranks' numbers in the job.
    When the workers write the report (one master), the output strategy places the pieces."""
    sink = master.sink.placement() if master.sink is not None else None
    if sink is not None:  # the workers write: the output strategy places the pieces
        file, data_comm = open_output(comm, sink.tmp)
        holder = Holder(file, data_comm)
        sink.attach(holder)
        figures, written = run_tasks(
            master, comm, stats, queries, StrategyConductor(master, sink, comm.Get_size()), holder
        )
        sink.write_seconds += file.seconds
        sink.acknowledge(*written)
        sink.closed_by_ranks()
        return figures
    figures, _ = run_tasks(master, comm, stats, queries, Unconducted(master, upstream), None, upstream, ranks)
    return figures


# -- workers writing the report (--output-strategy other than master) ---------------------------------


def open_output(comm: MPI.Comm, path: Path | None) -> tuple[OutputFile, MPI.Comm]:
    """Every rank of the job at once: rank 0 names the temporary file, all open it (MPI-IO), and a
    duplicate of the communicator carries worker-merge's piece bytes apart from the tasks. With
    partitions `comm` is the whole job's, not a partition's: a piece's writer may be in another one."""
    name = comm.bcast(str(path) if path is not None else None, root=0)
    data_comm = comm.Dup()
    return OutputFile(cast(MPI.Intracomm, comm), Path(name)), data_comm


def _patient_probe(comm: MPI.Comm, holder: Holder) -> tuple[Any, int, int, int]:
    """As patient_recv from rank 0, moving the holder's non-blocking sends and receives on meanwhile."""
    status = MPI.Status()
    wait = POLL_SECONDS
    while not comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
        holder.progress()
        time.sleep(wait)
        wait = min(2 * wait, POLL_MAX_SECONDS)
    size = status.Get_count(MPI.BYTE)
    message = comm.recv(source=0, tag=status.Get_tag())
    return message, 0, status.Get_tag(), size


def run_writing_worker(
    job: Job, plan: Plan, comm: MPI.Comm, workdir: Path, store: Store | None, world: MPI.Comm
) -> None:
    """A worker that keeps the pieces it writes, stitched for their place, and writes them into the file
    as its master relays rank 0's orders (paramedic.output.strategies); rank 0 learns only their sizes.
    `comm`: the worker's and its master's (a partition's, or the job's); `world`: the job's, over which
    the file is open."""
    rank = world.Get_rank()
    stats = RankStats(rank=rank, role="worker")
    file, data_comm = open_output(world, None)
    holder = Holder(file, data_comm)
    outfmt = job.options.outfmt()
    total_queries = plan.pieces[-1].stop
    comm.send(None, dest=0, tag=TAG_READY)
    final: Round | None = None
    # A task's failure goes to the master, which ends the job; a failure writing the file is raised (the
    # launcher's handler aborts every rank): another rank may be waiting in a collective call with it
    while True:
        message, _, tag, _ = _patient_probe(comm, holder)
        if tag == TAG_STOP:
            final = message
            break
        if tag == TAG_WRITE:
            holder.run(message)
            continue
        if tag == TAG_ROUND:
            comm.send(None, dest=0, tag=TAG_JOINED)
            holder.round(message)
            comm.send(None, dest=0, tag=TAG_READY)
            continue
        task, queries = message  # a task comes with its queries (RankTransport.send)
        try:
            payload = execute(task, job, plan, workdir, stats, store, queries)
            if isinstance(payload, PieceResult):
                task = payload.task
                data, agreement = stitch_alone(
                    outfmt, len(plan.pieces), task.piece, payload.data, task.first_query, task.n_queries,
                    total_queries,
                )  # fmt: skip
                holder.keep(task.piece, data)
                # rank 0 needs only the piece's place, not its subjects again
                lean = dataclasses.replace(task, subjects=None, alignments=None, stored=None)
                payload = PieceHeld(lean, len(data), payload.seconds, rank, agreement)
        except Exception as exc:
            send_failure(comm, exc)
            return
        comm.send(payload, dest=0, tag=TAG_RESULT)
    if final is not None:
        holder.round(final)
    holder.drain()
    file.close()
    stats.add("write", file.seconds)
    comm.send((holder.written_pieces, holder.written_bytes), dest=0, tag=TAG_WRITTEN)
    close_fork_servers()  # their BLAST+ runs then count in this rank's peak memory
    stats.measure_memory()
    comm.send(stats, dest=0, tag=TAG_STATS)


class Conductor(Protocol):
    """Who places the pieces and calls the collective rounds for a master whose workers write: the
    output strategy itself (one master, `StrategyConductor`), or rank 0, whose orders a partition master
    relays (paramedic.engine.runtime.partitions). Ranks are those of the master's communicator."""

    # whether all work is known here: every worker idle with nothing busy and not ended is a stall
    decides: bool

    def poll(self) -> bool:
        """Handle what came from above, without blocking; True when something did."""
        ...

    def orders(self) -> dict[int, list[Order]]:
        """Orders made since the last call, per rank."""
        ...

    def start_round(self) -> dict[int, Round] | None:
        """A round to start now: every rank's share."""
        ...

    def entering_round(self) -> None:
        """Every worker is in the round; this master enters it next."""
        ...

    @property
    def ended(self) -> bool:
        """No piece is left to place: the last round and the stop."""
        ...

    def final(self) -> dict[int, Round] | None: ...


class Unconducted:
    """Nobody places pieces (rank 0 writes the report, or ships it): no orders, no rounds; the work ends
    with the master's, or with the partition's."""

    decides = True

    def __init__(self, master: Master, upstream: Upstream | None):
        self.master = master
        self.upstream = upstream

    def poll(self) -> bool:
        return False

    def orders(self) -> dict[int, list[Order]]:
        return {}

    def start_round(self) -> dict[int, Round] | None:
        return None

    def entering_round(self) -> None:
        pass

    @property
    def ended(self) -> bool:
        return self.upstream.finished if self.upstream is not None else self.master.finished

    def final(self) -> dict[int, Round] | None:
        return None


class StrategyConductor:
    """One master: its sink's output strategy places the pieces as their sizes arrive."""

    decides = True

    def __init__(self, master: Master, sink: Placement, ranks: int):
        self.master = master
        self.strategy = sink.strategy
        self.ranks = ranks

    def poll(self) -> bool:
        return False

    def orders(self) -> dict[int, list[Order]]:
        return self.strategy.take()

    def start_round(self) -> dict[int, Round] | None:
        if self.strategy.round_due and not self.master.finished:
            return self.strategy.start_round(self.ranks)
        return None

    def entering_round(self) -> None:
        pass

    @property
    def ended(self) -> bool:
        return self.master.finished

    def final(self) -> dict[int, Round] | None:
        return self.strategy.start_round(self.ranks)


class RankTransport(Transport[Task, Result]):
    """A master's workers as the ranks 1.. of `comm`. When the workers write the report (a `holder`: the
    file is open on every rank) it also sends them the orders the conductor makes (a worker reads them
    between tasks); a collective round: every worker is told, and the master joins the round once all
    are in it (so it never blocks while a worker still has a result to send). A partition master's
    `upstream` (its supermaster) is polled while it waits."""

    def __init__(
        self,
        comm: MPI.Comm,
        stats: RankStats,
        conductor: Conductor,
        holder: Holder | None,
        plan: Plan,
        queries: Sequence[tuple[str, str]],
        upstream: Upstream | None = None,
        ranks: Sequence[int] | None = None,
    ):
        self.comm = comm
        self.plan = plan
        self.queries = queries
        self.size = comm.Get_size()
        self.stats = stats
        self.conductor = conductor
        self.holder = holder
        self.upstream = upstream
        self.names = list(ranks) if ranks is not None else list(range(self.size))
        self.round_shares: dict[int, Round] | None = None  # the round under way
        self.joined: set[int] = set()

    def ready(self) -> list[int]:
        return []  # each worker says it is ready (TAG_READY)

    @property
    def workers(self) -> int:
        return self.size - 1

    def send(self, worker: int, task: Task) -> None:
        # with its queries: a worker rank holds none of the job's (paramedic.engine.job.job `for_workers`)
        self.comm.send((task, task_queries(task, self.plan, self.queries)), dest=worker, tag=TAG_TASK)

    def ended(self, master: Driven[Task, Result]) -> bool:
        return self.conductor.ended

    @property
    def holding(self) -> bool:
        return self.round_shares is not None

    @property
    def may_stall(self) -> bool:
        return self.conductor.decides and not (self.upstream is not None and self.upstream.waiting)

    def stall_error(self) -> ParamedicError:
        return JobError("internal: scheduler stalled with every worker idle")

    def send_orders(self) -> None:
        for rank, orders in self.conductor.orders().items():
            if rank == 0:
                assert self.holder is not None
                self.holder.run(orders)
            else:
                self.comm.send(orders, dest=rank, tag=TAG_WRITE)

    def between(self, idle: deque[int]) -> bool:
        self.send_orders()
        if self.round_shares is None:
            self.round_shares = self.conductor.start_round()
            if self.round_shares is not None:
                self.joined = set()
                idle.clear()
                for worker in range(1, self.size):
                    self.comm.send(self.round_shares[worker], dest=worker, tag=TAG_ROUND)
        if self.round_shares is not None and len(self.joined) == self.size - 1:
            assert self.holder is not None
            self.conductor.entering_round()
            self.holder.round(self.round_shares[0])  # every worker is in the round: this returns
            self.round_shares = None
            return True
        return False

    def _poll(self) -> bool:
        return self.conductor.poll() | (self.upstream.poll() if self.upstream is not None else False)

    def receive(self) -> Arrival[Result] | None:
        got = patient_recv_or(self.comm, also=self._poll)
        if got is None:
            return None
        message, source, tag, nbytes = got
        self.stats.received_bytes += nbytes
        if tag == TAG_ERROR:
            text, code = message
            raise JobError(f"rank {self.names[source]}: {text}", code)
        if tag == TAG_JOINED:
            self.joined.add(source)
            return None
        # in a round a worker says it is ready once the round is over
        result = message if tag == TAG_RESULT else None
        return Arrival(source, result, idle=self.round_shares is None)

    def stop(self) -> tuple[list[RankStats], tuple[int, int]]:
        """The last orders and round with the stop, then every rank syncs and closes the file; the
        workers' figures and the pieces and bytes written by this master and its workers."""
        comm, holder = self.comm, self.holder
        self.send_orders()
        final = self.conductor.final()
        for worker in range(1, self.size):
            comm.send(final[worker] if final is not None else None, dest=worker, tag=TAG_STOP)
        pieces = nbytes = 0
        if holder is not None:
            if final is not None:
                holder.round(final[0])
            holder.drain()
            holder.file.close()
            self.stats.add("write", holder.file.seconds)
            pieces, nbytes = holder.written_pieces, holder.written_bytes
        worker_stats: list[RankStats] = []
        while len(worker_stats) < self.size - 1:
            message, source, tag, _ = patient_recv(comm)
            if tag == TAG_ERROR:
                text, code = message
                raise JobError(f"rank {self.names[source]}: {text}", code)
            if tag == TAG_WRITTEN:
                pieces += message[0]
                nbytes += message[1]
            elif tag == TAG_STATS:
                worker_stats.append(message)
        return sorted(worker_stats, key=lambda s: s.rank), (pieces, nbytes)


def run_tasks(
    master: Master,
    comm: MPI.Comm,
    stats: RankStats,
    queries: Sequence[tuple[str, str]],
    conductor: Conductor,
    holder: Holder | None,
    upstream: Upstream | None = None,
    ranks: Sequence[int] | None = None,
) -> tuple[list[RankStats], tuple[int, int]]:
    """A master's runner over MPI ranks: the one loop (paramedic.engine.core.runner) over `RankTransport`,
    then the stop. Returns the workers' figures and the pieces and bytes written by this master and its
    workers. `queries`: the job's, each task's sent with it."""
    plan = master.scheduler.plan
    transport = RankTransport(comm, stats, conductor, holder, plan, queries, upstream, ranks)
    drive(master, transport)
    return transport.stop()
