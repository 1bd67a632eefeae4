"""The job on MPI ranks: rank 0 drives the master (paramedic.engine.core.master), every other rank is a worker.

Rank 0 runs the job shell (paramedic.engine.job.shell) with the MPI runner (paramedic.engine.runtime.ranks.run_workers):
idle workers get tasks, results go to the master. With a single rank the master's own rank does the tasks.
Rank 0 also keeps the journal and finds the search store every rank sees.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from mpi4py import MPI

from paramedic.durable import write_durably
from paramedic.engine.core.master import NOTHING
from paramedic.engine.core.scheduler import Plan
from paramedic.engine.job.job import Job
from paramedic.engine.job.shell import Runner, run_master
from paramedic.engine.rank.journal import Journal
from paramedic.engine.rank.staging import stager
from paramedic.engine.rank.store import ALIGNMENTS_VARIABLE, Store
from paramedic.engine.runtime.execute import serial_runner
from paramedic.engine.runtime.partitions import check_partitioning, run_partitioned
from paramedic.engine.runtime.ranks import run_worker, run_workers
from paramedic.engine.runtime.stopped import step_tag
from paramedic.report.record import RunRecord

VISIBLE_NAME = ".visible"  # rank 0's token in the search store, read back by every worker


def run_job(job: Job, comm: MPI.Comm, command: list[str]) -> RunRecord | None:
    """Run the job on this rank; the master returns the run record, workers return None."""
    plan: Plan | None = None
    journal: Journal | None = None
    replay = NOTHING
    if comm.Get_rank() == 0:
        plan = job.plan(max(1, comm.Get_size() - 1))
        if job.target.journal is not None:  # resuming: the journal's plan, whatever the ranks are this time
            journal, plan, replay = Journal.open(
                job.target.journal, job.journal_identity(), plan, job.target.restart, job.volume_stamps
            )
        if job.partition_size is not None:
            check_partitioning(job, plan, comm.Get_size(), job.partition_size)
    plan = comm.bcast(plan, root=0)
    assert plan is not None
    workdir = Path(tempfile.mkdtemp(prefix=f"paramedic-rank{comm.Get_rank()}-{step_tag()}"))
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
            size = comm.Get_size()
            runner: Runner = (
                serial_runner(job, plan, workdir, store)
                if size == 1
                else lambda master, stats: run_workers(master, comm, stats, job.queries)
            )
            return run_master(job, plan, size, runner, command, journal, replay, store)
        run_worker(job, plan, comm, workdir, store)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if journal is not None:
            journal.close(complete=False)  # kept for the next run if it holds finished work


def _shared_store(
    comm: MPI.Comm, job: Job, plan: Plan, workdir: Path, journal: Journal | None
) -> Store | None:
    """The search store (paramedic.engine.rank.store) when every rank sees it, else None: the journal's, or
    one in rank 0's temporary directory when reports are written from the searches' alignments or from
    their whole preliminary lists (traceback once). Rank 0 leaves a token there that every worker must
    read back: on a cluster a temporary directory is often local to its node, and a journal's
    filesystem may not be mounted on every node."""
    store: Store | None = None
    token = b""
    wanted = os.environ.get(ALIGNMENTS_VARIABLE) != "tasks"
    if comm.Get_rank() == 0 and wanted and not plan.query_segmentation:
        if journal is not None:
            store = journal.store
        elif job.keep_alignments or plan.traceback_once:  # or the lists pieces align as given
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
