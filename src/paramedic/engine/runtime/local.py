"""The job on one machine without MPI: the master in this process, each worker a thread driving BLAST+.

Why: started by paramedic itself on one machine, a job of MPI ranks pays a fixed cost before its first
search and after its last: mpiexec and its proxy, one Python interpreter per rank importing the engine
and initialising MPI, the job broadcast to every rank, and the teardown (measured on 2 cores: about 1 s
of wall and 1.2 s of CPU, most of a one-query search against 325 Mbp, docs/DESIGN.md "The local
runner"). Here a worker is a thread: it hands its task to BLAST+ (a child process, through the thread's
own fork server) and waits, so the threads do not contend for the interpreter while BLAST+ works. The
master, the scheduler, the sink and the journal are the same objects the MPI runner drives
(paramedic.engine.job.shell); only the transport between the master and its workers differs.

What needs MPI ranks (--partition-size, worker output strategies, --stage's nodes) runs over MPI
(paramedic.engine.core.settings `needs_mpi`), as does `--runner mpi`.

A failure in any worker ends the job with that worker's error; an interrupt (Ctrl-C, SIGTERM, SIGHUP)
stops every BLAST+ run this process started before the error is raised, and the job's temporary
directory goes with them.
"""

from __future__ import annotations

import os
import queue
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from paramedic.blast.tools import warm_up
from paramedic.db.manifest import fragment_members
from paramedic.engine.core.master import NOTHING, Master, Replay, Result
from paramedic.engine.core.runner import Arrival, Transport, drive
from paramedic.engine.core.scheduler import Plan, Task
from paramedic.engine.job.job import Job
from paramedic.engine.job.shell import Runner, run_master
from paramedic.engine.rank.journal import Journal
from paramedic.engine.rank.store import ALIGNMENTS_VARIABLE, Store
from paramedic.engine.runtime.execute import execute, serial_runner
from paramedic.engine.runtime.jobdir import stop_children
from paramedic.errors import DatabaseError
from paramedic.report.record import RankStats, RunRecord

# How often the master looks up from waiting for a result (an interrupt is raised between looks).
WAIT_SECONDS = 0.5
# How long a stopped job waits for each worker thread to end once its BLAST+ runs are killed.
STOP_SECONDS = 10.0


def run_local_job(job: Job, workers: int, command: list[str]) -> RunRecord:
    """Run `job` with `workers` worker threads in this process; the run record."""
    plan = job.plan(workers, one_machine=True)  # threads of one machine search equal shares
    journal: Journal | None = None
    replay: Replay = NOTHING
    if job.target.journal is not None:  # resuming: the journal's plan, whatever the workers are this time
        journal, plan, replay = Journal.open(
            job.target.journal, job.journal_identity(), plan, job.target.restart, job.volume_stamps
        )
    workdir = Path(tempfile.mkdtemp(prefix="paramedic-local-"))
    try:
        store = _store(job, plan, workdir, journal)
        runner = (
            serial_runner(job, plan, workdir, store)
            if workers == 1
            else thread_runner(job, plan, workdir, store, workers)
        )
        # ranks as an MPI job of the same workers counts them: the master and one per worker
        try:
            record = run_master(job, plan, workers + 1, runner, command, journal, replay, store)
        except Exception:
            if job.verified is not None:
                try:
                    job.verified()  # a damaged database is the error to say, whatever a BLAST+ run met
                except DatabaseError:
                    if journal is not None:  # the workers' records were made on bytes that failed it
                        journal.close(complete=True)
                    raise
            raise
        record.runner = "local"
        return record
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if journal is not None:
            journal.close(complete=False)  # kept for the next run if it holds finished work


def _store(job: Job, plan: Plan, workdir: Path, journal: Journal | None) -> Store | None:
    """The search store: every worker thread sees the master's files (paramedic.engine.runtime.roles)."""
    if plan.query_segmentation or os.environ.get(ALIGNMENTS_VARIABLE) == "tasks":
        return None
    if journal is not None:
        return journal.store
    if job.keep_alignments or plan.traceback_once:  # alignments, or the lists pieces align as given
        store = Store(workdir / "store", durable=False)
        store.path.mkdir()
        return store
    return None


def thread_runner(job: Job, plan: Plan, workdir: Path, store: Store | None, workers: int) -> Runner:
    """The runner of worker threads 1..`workers`: each runs one task at a time, as a worker rank does."""

    def run(master: Master, stats: RankStats) -> list[RankStats]:
        results: queue.SimpleQueue[tuple[int, Result | BaseException]] = queue.SimpleQueue()
        inboxes: dict[int, queue.SimpleQueue[Task | None]] = {
            w: queue.SimpleQueue() for w in range(1, workers + 1)
        }
        figures = {w: RankStats(rank=w, role="worker") for w in inboxes}
        if not plan.query_segmentation:  # read once, while the first BLAST+ runs search (not per thread)
            reader = threading.Thread(
                target=_read_members, args=(job,), name="paramedic-members", daemon=True
            )
            reader.start()
        threads = [
            threading.Thread(
                target=_work,
                args=(w, inboxes[w], results, job, plan, workdir / f"worker{w}", store, figures[w]),
                name=f"paramedic-worker-{w}",
                daemon=True,
            )
            for w in inboxes
        ]
        for t in threads:
            t.start()
        try:
            drive(master, ThreadTransport(inboxes, results, master.confirm_if_failed))
        except BaseException:
            stop_children()  # the workers' BLAST+ runs, so that each thread ends at once
            for inbox in inboxes.values():
                inbox.put(None)
            for t in threads:  # before the job's directories go: no thread outlives the job
                t.join(timeout=STOP_SECONDS)
            stop_children()  # a fork server a thread started meanwhile
            raise
        for inbox in inboxes.values():
            inbox.put(None)
        for t in threads:
            t.join()
        return [figures[w] for w in sorted(figures)]

    return run


def _read_members(job: Job) -> None:
    """The fragments' members, cached for the workers (a failure is theirs to meet and report)."""
    if job.db.in_place:  # global ids are arithmetic: nothing to read
        return
    try:
        fragment_members(job.db.directory, len(job.db.fragments), job.db.members_blake3)
    except Exception:
        pass


class ThreadTransport(Transport[Task, Result]):
    """Worker threads: a task goes into the worker's inbox, results come back on one queue; the master
    looks up every WAIT_SECONDS so that an interrupt is raised between looks, and calls `looking` there."""

    def __init__(
        self,
        inboxes: dict[int, queue.SimpleQueue[Task | None]],
        results: queue.SimpleQueue[tuple[int, Result | BaseException]],
        looking: Callable[[], None] = lambda: None,
    ):
        self.inboxes = inboxes
        self.results = results
        self.looking = looking

    def ready(self) -> list[int]:
        return sorted(self.inboxes)

    @property
    def workers(self) -> int:
        return len(self.inboxes)

    def send(self, worker: int, task: Task) -> None:
        self.inboxes[worker].put(task)

    def receive(self) -> Arrival[Result]:
        while True:
            try:
                worker, outcome = self.results.get(timeout=WAIT_SECONDS)
                break
            except queue.Empty:
                self.looking()  # e.g. a damaged database ends the job now, not at a result
        if isinstance(outcome, BaseException):
            raise outcome
        return Arrival(worker, outcome)


def _work(
    worker: int,
    inbox: queue.SimpleQueue[Task | None],
    results: queue.SimpleQueue[tuple[int, Result | BaseException]],
    job: Job,
    plan: Plan,
    workdir: Path,
    store: Store | None,
    stats: RankStats,
) -> None:
    """A worker thread: tasks from its inbox until None; a failure goes to the master, which raises it."""
    try:
        workdir.mkdir()
        warm_up(job.program)  # this thread takes its fork server (prestarted) before its first task
        while (task := inbox.get()) is not None:
            results.put((worker, execute(task, job, plan, workdir, stats, store)))
    except BaseException as exc:  # the master ends the job with it (or has ended it already)
        results.put((worker, exc))
    stats.python_cpu_seconds = round(time.thread_time(), 3)  # this thread's own
    stats.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's
    stats.peak_blast_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
