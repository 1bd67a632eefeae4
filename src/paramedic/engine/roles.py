"""The job on MPI ranks: rank 0 drives the master (paramedic.engine.master), every other rank is a worker.

Rank 0 runs the master's loop over MPI (paramedic.engine.ranks.run_workers): idle workers get tasks,
results go to the master. With a single rank the master's own rank does the tasks
(paramedic.engine.master.run_serial). Rank 0 also opens the output, keeps the journal, finds the search
store every rank sees, and writes the run record.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mpi4py import MPI

from paramedic.blast.forkserver import close_fork_servers
from paramedic.durable import write_durably
from paramedic.engine.execute import execute
from paramedic.engine.job import Job
from paramedic.engine.journal import NOTHING, Journal, Replay
from paramedic.engine.master import Master, Sink, run_serial
from paramedic.engine.metadata import save_metadata
from paramedic.engine.outcome import run_record
from paramedic.engine.partitions import check_partitioning, run_partitioned
from paramedic.engine.ranks import run_worker, run_workers
from paramedic.engine.scheduler import Plan, Scheduler
from paramedic.engine.sinks import (
    MetadataSink,
    PublishedSink,
    WriterSink,
    auto_chooser,
    measure_site,
    open_sink,
    published_earlier,
)
from paramedic.engine.staging import scheduling, stager
from paramedic.engine.store import Store
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord

VISIBLE_NAME = ".visible"  # rank 0's token in the search store, read back by every worker
# "tasks": the searches' results travel through rank 0 even when every rank sees the search store, as
# they must when one does not (for measuring the two side by side, and for a store on a slow filesystem)
ALIGNMENTS_VARIABLE = "PARAMEDIC_ALIGNMENTS"


def run_job(job: Job, comm: MPI.Comm, command: list[str]) -> RunRecord | None:
    """Run the job on this rank; the master returns the run record, workers return None."""
    plan: Plan | None = None
    journal: Journal | None = None
    replay = NOTHING
    if comm.Get_rank() == 0:
        plan = job.plan(max(1, comm.Get_size() - 1))
        if job.journal is not None:  # resuming: the journal's plan, whatever the ranks are this time
            journal, plan, replay = Journal.open(job.journal, job.journal_identity(), plan, job.restart)
        if job.partition_size is not None:
            check_partitioning(job, plan, comm.Get_size(), job.partition_size)
    plan = comm.bcast(plan, root=0)
    assert plan is not None
    workdir = Path(tempfile.mkdtemp(prefix=f"paramedic-rank{comm.Get_rank()}-"))
    try:
        store = _shared_store(comm, job, plan, workdir, journal)
        if job.stage is not None:  # every rank's node and what is staged there, for the scheduler(s)
            hellos = comm.allgather(stager(job.stage, job.db).hello())
            job = dataclasses.replace(job, stage_nodes=tuple(hellos))
        if job.partition_size is not None:
            return run_partitioned(
                job, plan, comm, workdir, command, journal, replay, store, job.partition_size
            )
        if comm.Get_rank() == 0:
            return _master(job, plan, comm, workdir, command, journal, replay, store)
        run_worker(job, plan, comm, workdir, store)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if journal is not None:
            journal.close(complete=False)  # kept for the next run if it holds finished work


def _shared_store(
    comm: MPI.Comm, job: Job, plan: Plan, workdir: Path, journal: Journal | None
) -> Store | None:
    """The search store (paramedic.engine.store) when every rank sees it, else None: the journal's, or
    one in rank 0's temporary directory when reports are written from the searches' alignments. Rank 0
    leaves a token there that every worker must read back: on a cluster a temporary directory is often
    local to its node, and a journal's filesystem may not be mounted on every node."""
    store: Store | None = None
    token = b""
    wanted = os.environ.get(ALIGNMENTS_VARIABLE) != "tasks"
    if comm.Get_rank() == 0 and wanted and not plan.query_segmentation:
        if journal is not None:
            store = journal.store
        elif job.keep_alignments:
            store = Store(workdir / "store", durable=False)
            store.path.mkdir()
        if store is not None and comm.Get_size() > 1:
            token = secrets.token_hex(16).encode()
            write_durably(store.path / VISIBLE_NAME, token, sync=False)
    store, token = comm.bcast((store, token), root=0)
    if store is None or comm.Get_size() == 1:
        return store
    sees = comm.Get_rank() == 0 or _reads(store.path / VISIBLE_NAME) == token
    everyone = all(comm.allgather(sees))
    if comm.Get_rank() == 0:
        (store.path / VISIBLE_NAME).unlink(missing_ok=True)
    return store if everyone else None


def _reads(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _master(
    job: Job,
    plan: Plan,
    comm: MPI.Comm,
    workdir: Path,
    command: list[str],
    journal: Journal | None,
    replay: Replay,
    store: Store | None,
) -> RunRecord:
    start = time.perf_counter()
    size = comm.Get_size()
    stats = RankStats(rank=0, role="master" if size > 1 else "master+worker")
    progress = Progress(
        len(job.queries),
        quiet=job.quiet,
        searches=0
        if plan.query_segmentation or job.preloaded is not None
        else len(plan.batches) * plan.n_fragments,
        pieces=len(plan.pieces),
    )
    published = published_earlier(job, journal)
    auto = job.ship is not None and job.ship.mode == "auto" and published is None
    link = measure_site(job) if auto else None
    master: Master | None = None
    try:
        sink: Sink | None = None
        if published is not None:
            sink = PublishedSink(job, published)
        elif not auto:
            sink = open_sink(job, plan, job.ship.mode if job.ship else None, journal)
        master = Master(
            Scheduler(
                plan,
                keep_alignments=job.keep_alignments,
                alignments_stored=store is not None,
                replica_group=job.replica_group_size,
                **scheduling(job.stage, job.stage_nodes, range(size)),
            ),
            sink,
            progress,
            stats,
            journal,
            replay,
            auto_chooser(job, plan, link, journal) if auto else None,
        )
        if published is not None:  # an earlier run's job finished at the site: nothing is left to do
            for piece in range(len(plan.pieces)):
                master.scheduler.mark_piece_done(piece)
            if not job.quiet:
                print(
                    f"paramedic: the storage site already holds {job.ship.out if job.ship else ''} from an "
                    "earlier run of this search, stopped before it heard so: nothing left to do",
                    file=sys.stderr,
                )
        if job.preloaded is not None:
            master.scheduler.preload(job.preloaded)
        if size == 1:
            run_serial(master, lambda task: execute(task, job, plan, workdir, stats, store))
            worker_stats: list[RankStats] = []
        else:
            worker_stats = run_workers(master, comm, stats)
        master.commit()
        progress.finish()
        merged = [master.scheduler.metadata(q) or [] for q in range(len(job.queries))]
        if job.save_metadata is not None:
            save_metadata(job.save_metadata, job.identity, merged)
    except BaseException:
        if master is not None:
            master.abort()
        raise
    finally:
        progress.close()
    if journal is not None:
        journal.close(complete=True)  # the output is complete: the journal goes
    close_fork_servers()  # their BLAST+ runs then count in this rank's peak memory
    stats.measure_memory()
    sink = master.sink
    assert isinstance(sink, (WriterSink, MetadataSink, PublishedSink))
    return run_record(
        job,
        plan,
        command,
        wall_seconds=time.perf_counter() - start,
        ranks=size,
        workers=max(1, size - 1),
        sink=sink,
        merged=merged,
        searched_again=master.scheduler.searched_again,
        journal=journal,
        store=store,
        ranks_stats=[stats, *worker_stats],
    )
