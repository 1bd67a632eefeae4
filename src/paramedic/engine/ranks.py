"""What every MPI rank shares: waiting for a message without busy-polling, the tags, the worker's loop,
and the runner that hands a master's tasks to its workers (rank 0's, or a partition master's).

Waiting is done by probing and sleeping, never in a blocking receive: MPICH busy-polls a core in a blocking
receive, which on a 2-core machine slowed the workers by 40-55% (docs/DESIGN.md). Any failure on any rank
ends the whole job with the failing rank's message: workers report errors to their master, which raises.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from mpi4py import MPI

from paramedic.blast.forkserver import close_fork_servers
from paramedic.engine.execute import execute
from paramedic.engine.job import Job
from paramedic.engine.master import Master
from paramedic.engine.scheduler import Plan, Task
from paramedic.engine.store import Store
from paramedic.errors import JobError, ParamedicError
from paramedic.report.record import RankStats

# Waits between probes start short and double up to the maximum: a master waiting through a long search
# wakes 100 times a second instead of 500 (each wake-up takes a core from a BLAST+ run for a moment),
# and a message is still picked up within 10 ms.
POLL_SECONDS = 0.001
POLL_MAX_SECONDS = 0.01
TAG_READY, TAG_RESULT, TAG_ERROR, TAG_TASK, TAG_STOP, TAG_STATS = range(6)


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
    job: Job, plan: Plan, comm: MPI.Comm, workdir: Path, store: Store | None, rank: int | None = None
) -> None:
    """A worker's loop: tasks from its master (rank 0 of `comm`) until told to stop; errors go to the
    master, which ends the job with them. `rank`: this rank's number in the job, when `comm` is a
    partition's."""
    stats = RankStats(rank=comm.Get_rank() if rank is None else rank, role="worker")
    comm.send(None, dest=0, tag=TAG_READY)
    while True:
        task, _, tag, _ = patient_recv(comm, source=0)
        if tag == TAG_STOP:
            break
        try:
            payload = execute(task, job, plan, workdir, stats, store)
        except ParamedicError as exc:
            comm.send((str(exc), exc.exit_code), dest=0, tag=TAG_ERROR)
            return
        except Exception as exc:  # a bug: still end the whole job with a message, never hang
            comm.send((f"internal error: {type(exc).__name__}: {exc}", 1), dest=0, tag=TAG_ERROR)
            return
        comm.send(payload, dest=0, tag=TAG_RESULT)
    close_fork_servers()  # their BLAST+ runs then count in this rank's peak memory
    stats.measure_memory()
    comm.send(stats, dest=0, tag=TAG_STATS)


class Upstream(Protocol):
    """Where a partition master's work comes from (paramedic.engine.partitions): polled while it waits."""

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
    upstream: Upstream | None = None,
    ranks: Sequence[int] | None = None,
) -> list[RankStats]:
    """The MPI runner: hand tasks to idle worker ranks, pass their results to the master; then stop the
    workers and collect their figures. `stats`: this master's, which counts the bytes of the results.
    A partition master passes its `upstream` (the supermaster) and its ranks' numbers in the job."""
    size = comm.Get_size()
    names = list(ranks) if ranks is not None else list(range(size))
    master.start()
    idle: deque[int] = deque()
    busy: dict[int, Task] = {}
    while not (upstream.finished if upstream is not None else master.finished):
        got = patient_recv_or(comm, also=upstream.poll if upstream is not None else None)
        if got is not None:
            message, source, tag, nbytes = got
            stats.received_bytes += nbytes
            if tag == TAG_ERROR:
                text, code = message
                raise JobError(f"rank {names[source]}: {text}", code)
            if tag == TAG_RESULT:
                busy.pop(source, None)
                master.accept(message)
            idle.append(source)
        while idle:
            task = master.next_task(idle[0])
            if task is None:
                break
            worker = idle.popleft()
            busy[worker] = task
            comm.send(task, dest=worker, tag=TAG_TASK)
        finished = upstream.finished if upstream is not None else master.finished
        waiting = upstream is not None and upstream.waiting
        if not busy and not finished and not waiting and len(idle) == size - 1:
            raise JobError("internal: scheduler stalled with every worker idle")
    for worker in range(1, size):
        comm.send(None, dest=worker, tag=TAG_STOP)
    worker_stats: list[RankStats] = []
    while len(worker_stats) < size - 1:
        message, source, tag, _ = patient_recv(comm)
        if tag == TAG_STATS:
            worker_stats.append(message)
    return sorted(worker_stats, key=lambda s: s.rank)
