"""The MPI roles: one master (scheduling, merging, writing) and workers (BLAST+ runs).

Rank 0 is the master; every other rank is a worker. With a single rank the master runs the tasks itself.
Waiting is done by probing and sleeping, never in a blocking receive: MPICH busy-polls a core in a blocking
receive, which on a 2-core machine slowed the workers by 40-55% (DESIGN.md). Any failure on any rank ends
the whole job with the failing rank's message: workers report errors to the master, which aborts.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from mpi4py import MPI

from paramedic.blast.render import Unrenderable, render
from paramedic.blast.run import regenerate, search_fragment
from paramedic.db.manifest import fragment_members
from paramedic.db.seqids import seqid_table
from paramedic.engine.job import Job
from paramedic.engine.journal import Journal, Replay
from paramedic.engine.metadata import save_metadata
from paramedic.engine.scheduler import Plan, RegenTask, Scheduler, SearchTask, Task
from paramedic.errors import JobError, ParamedicError
from paramedic.output.writer import ByteSink, LocalFile, OrderedWriter
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord
from paramedic.ship.auto import Link, decide, measure_link
from paramedic.ship.blast_codec import BlastJobSetup, BlastMetadataCodec
from paramedic.ship.client import SiteError
from paramedic.ship.destination import Shipping, cancel_site_job, start_shipping

# Waits between probes start short and double up to the maximum: a master waiting through a long search
# wakes 100 times a second instead of 500 (each wake-up takes a core from a BLAST+ run for a moment),
# and a message is still picked up within 10 ms.
POLL_SECONDS = 0.001
POLL_MAX_SECONDS = 0.01
TAG_READY, TAG_RESULT, TAG_ERROR, TAG_TASK, TAG_STOP, TAG_STATS = range(6)


def patient_recv(comm: MPI.Comm, source: int = MPI.ANY_SOURCE) -> tuple[Any, int, int]:
    """Receive without busy-polling a core: (message, source rank, tag)."""
    status = MPI.Status()
    wait = POLL_SECONDS
    while not comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status):
        time.sleep(wait)
        wait = min(2 * wait, POLL_MAX_SECONDS)
    message = comm.recv(source=status.Get_source(), tag=status.Get_tag())
    return message, status.Get_source(), status.Get_tag()


def execute(task: Task, job: Job, plan: Plan, workdir: Path, stats: RankStats) -> Any:
    """Run one task on this rank; returns the payload the master needs."""
    if isinstance(task, SearchTask):
        batch = plan.batches[task.batch]
        queries = job.queries[batch.start : batch.stop]
        gids = fragment_members(job.db.directory, len(job.db.fragments))[task.fragment]
        result, run = search_fragment(
            job.program, job.options, job.db, task.fragment, queries, workdir, job.archive_render, gids
        )
        stats.add("search", run.seconds)
        stats.tasks["search"] += 1
        stats.fragments.append(task.fragment)
        stats.search_output_bytes += run.output_bytes
        return result
    queries = job.queries[task.first_query : task.first_query + task.n_queries]
    data = None
    if task.alignments is not None:
        try:
            data, run = render(
                job.program,
                job.options,
                job.db,
                queries,
                task.alignments,
                seqid_table(job.db.directory),
                workdir,
            )
            stats.tasks["rendered"] += 1
        except Unrenderable:
            stats.tasks["render_fallbacks"] += 1
    if data is None:
        data, run = regenerate(job.program, job.options, job.db, queries, task.subjects, workdir)
    phase = "search" if task.subjects is None else "regenerate"  # query segmentation searches and writes
    stats.add(phase, run.seconds)
    stats.tasks[phase] += 1
    stats.report_bytes += run.output_bytes
    return data


def run_job(job: Job, comm: MPI.Comm, command: list[str]) -> RunRecord | None:
    """Run the job on this rank; the master returns the run record, workers return None."""
    plan: Plan | None = None
    journal: Journal | None = None
    replay = Replay((), ())
    if comm.Get_rank() == 0:
        plan = job.plan(max(1, comm.Get_size() - 1))
        if job.journal is not None:  # resuming: the journal's plan, whatever the ranks are this time
            journal, plan, replay = Journal.open(job.journal, job.journal_identity(), plan, job.restart)
    plan = comm.bcast(plan, root=0)
    assert plan is not None
    workdir = Path(tempfile.mkdtemp(prefix=f"paramedic-rank{comm.Get_rank()}-"))
    try:
        if comm.Get_rank() == 0:
            return _master(job, plan, comm, workdir, command, journal, replay)
        _worker(job, plan, comm, workdir)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if journal is not None:
            journal.close(complete=False)  # kept for the next run if it holds finished work


def _worker(job: Job, plan: Plan, comm: MPI.Comm, workdir: Path) -> None:
    stats = RankStats(rank=comm.Get_rank(), role="worker")
    comm.send(None, dest=0, tag=TAG_READY)
    while True:
        task, _, tag = patient_recv(comm, source=0)
        if tag == TAG_STOP:
            break
        try:
            payload = execute(task, job, plan, workdir, stats)
        except ParamedicError as exc:
            comm.send((str(exc), exc.exit_code), dest=0, tag=TAG_ERROR)
            return
        except Exception as exc:  # a bug: still end the whole job with a message, never hang
            comm.send((f"internal error: {type(exc).__name__}: {exc}", 1), dest=0, tag=TAG_ERROR)
            return
        comm.send((task, payload), dest=0, tag=TAG_RESULT)
    stats.measure_memory()
    comm.send(stats, dest=0, tag=TAG_STATS)


def _master(
    job: Job,
    plan: Plan,
    comm: MPI.Comm,
    workdir: Path,
    command: list[str],
    journal: Journal | None,
    replay: Replay,
) -> RunRecord:
    start = time.perf_counter()
    size = comm.Get_size()
    stats = RankStats(rank=0, role="master" if size > 1 else "master+worker")
    auto = job.ship is not None and job.ship.mode == "auto"
    link = measure_site(job) if auto else None
    shipping = open_shipping(job, plan, job.ship.mode, journal) if job.ship is not None and not auto else None
    scheduler = Scheduler(
        plan,
        hold_pieces=auto or (shipping is not None and shipping.holds_pieces),
        keep_alignments=job.archive_render,
    )
    progress = Progress(len(job.queries), quiet=job.quiet)
    writer: OrderedWriter | None = None

    def open_writer(sink: ByteSink) -> OrderedWriter:
        """The ordered writer, with the pieces an earlier run of the job wrote (journaled) in it."""
        opened = OrderedWriter(sink, job.options.outfmt(), plan.pieces)
        if journal is None:
            return opened
        for index in replay.pieces:
            data = journal.load_piece(index)
            if data is not None:
                scheduler.restore_piece(index)
                progress.advance(opened.add(index, data))
        return opened

    try:
        if journal is not None:
            for task in replay.searches:
                result = journal.load_search(task, len(plan.batches[task.batch]))
                if result is not None:
                    scheduler.restore_search(task, result)
        if not auto and (shipping is None or not shipping.holds_pieces):
            partial = journal.partial_output if journal is not None else None
            sink = shipping if shipping is not None else LocalFile(job.out, partial)
            writer = open_writer(sink)

        def ship_released() -> None:
            nonlocal shipping, writer
            if not scheduler.hold_pieces:
                return
            released = scheduler.take_released()
            if not released:
                return
            t = time.perf_counter()
            if shipping is None:  # --ship auto: decide on the first piece, regenerated here
                # by search, as the storage site would (its cost g is what the decision weighs)
                probe = dataclasses.replace(released[0], alignments=None)
                output = execute(probe, job, plan, workdir, stats)
                mode, decision = decide_from_probe(job, probe, output, time.perf_counter() - t, link)
                shipping = open_shipping(job, plan, mode, journal)
                shipping.decision = decision
                if not shipping.holds_pieces:
                    if journal is not None:
                        journal.piece_done(probe.piece, output)
                    writer = open_writer(shipping)
                    if probe.piece not in replay.pieces:
                        progress.advance(writer.add(probe.piece, output))
                    scheduler.requeue([task for task in released[1:] if task.piece not in replay.pieces])
                    scheduler.stop_holding()
                    stats.add("write", time.perf_counter() - t)
                    return
            shipping.ship_pieces(released)
            stats.add("write", time.perf_counter() - t)
            progress.advance(sum(task.n_queries for task in released))

        def accept(task: Task, payload: Any) -> None:
            if isinstance(task, SearchTask):
                t = time.perf_counter()
                if journal is not None:  # durable before it counts
                    journal.search_done(task, payload)
                scheduler.search_done(task, payload)
                stats.add("merge", time.perf_counter() - t)
                ship_released()
            else:
                assert isinstance(task, RegenTask) and writer is not None
                t = time.perf_counter()
                if journal is not None:
                    journal.piece_done(task.piece, payload)
                scheduler.regen_done(task)
                progress.advance(writer.add(task.piece, payload))
                stats.add("write", time.perf_counter() - t)

        if job.preloaded is not None:
            scheduler.preload(job.preloaded)
        ship_released()  # pieces a preload or the journal's searches released: no search may follow
        if size == 1:
            while not scheduler.finished:
                task = scheduler.next_task(0)
                if task is None:
                    raise JobError("internal: scheduler stalled with no task for the only rank")
                accept(task, execute(task, job, plan, workdir, stats))
            worker_stats: list[RankStats] = []
        else:
            idle: deque[int] = deque()
            busy: dict[int, Task] = {}
            while not scheduler.finished:
                message, source, tag = patient_recv(comm)
                if tag == TAG_ERROR:
                    text, code = message
                    raise JobError(f"rank {source}: {text}", code)
                if tag == TAG_RESULT:
                    task, payload = message
                    busy.pop(source, None)
                    accept(task, payload)
                idle.append(source)
                while idle:
                    task = scheduler.next_task(idle[0])
                    if task is None:
                        break
                    worker = idle.popleft()
                    busy[worker] = task
                    comm.send(task, dest=worker, tag=TAG_TASK)
                if not busy and not scheduler.finished and len(idle) == size - 1:
                    raise JobError("internal: scheduler stalled with every worker idle")
            for worker in range(1, size):
                comm.send(None, dest=worker, tag=TAG_STOP)
            worker_stats = []
            while len(worker_stats) < size - 1:
                message, source, tag = patient_recv(comm)
                if tag == TAG_STATS:
                    worker_stats.append(message)
            worker_stats.sort(key=lambda s: s.rank)
        if writer is not None:
            writer.commit()
        elif shipping is not None:
            shipping.commit()
        merged = [scheduler.metadata(q) or [] for q in range(len(job.queries))]
        if job.save_metadata is not None:
            save_metadata(job.save_metadata, job.identity, merged)
    except BaseException:
        if writer is not None:
            writer.abort()
        elif shipping is not None:
            shipping.abort()
        raise
    finally:
        progress.close()
    if journal is not None:
        journal.close(complete=True)  # the output is complete: the journal goes
    stats.measure_memory()
    ship_report = shipping.report() if shipping else None
    return RunRecord(
        program=job.program,
        command=command,
        database=job.db.arg,
        manifest_sha256=job.manifest_checksum,
        queries=len(job.queries),
        ranks=size,
        workers=max(1, size - 1),
        batches=len(plan.batches),
        fragments=plan.n_fragments,
        pieces=len(plan.pieces),
        strategy="queries" if plan.direct else "fragments",
        search_batch_queries=len(plan.batches[0]),
        regen_group_queries=len(plan.pieces[0]),
        blast_startup_seconds=float(job.plan_inputs["startup_seconds"]),  # type: ignore[arg-type]
        wall_seconds=round(time.perf_counter() - start, 3),
        output=(f"{job.ship.site}/{job.ship.out}" if job.ship else str(job.out) if job.out else "-"),
        output_bytes=ship_report["output_bytes"] if ship_report else writer.bytes_written if writer else 0,
        metadata_pairs=None if plan.direct else sum(len(m) for m in merged),
        queries_with_hits=None if plan.direct else sum(1 for m in merged if m),
        searched_again=None if plan.direct else scheduler.searched_again,
        resumed={"searches": journal.kept_searches, "pieces": journal.kept_pieces} if journal else None,
        ranks_stats=[stats, *worker_stats],
        ship=ship_report,
    )


def measure_site(job: Job) -> Link | None:
    """--ship auto: measure the link before the search (and check the replica early)."""
    assert job.ship is not None
    link, manifest = measure_link(job.ship.site, job.ship.keys)
    if manifest is not None and manifest != job.manifest_checksum:
        raise SiteError(
            "storage site: the storage site's replica is not the compute site's database "
            "(manifest checksums differ)"
        )
    return link


def decide_from_probe(
    job: Job, probe: RegenTask, output: bytes, seconds: float, link: Link | None
) -> tuple[str, dict[str, Any]]:
    start = time.perf_counter()
    _, payload = BlastMetadataCodec().encode((probe.first_query, probe.subjects or (), job.db.nseq))
    encode_seconds = time.perf_counter() - start
    return decide(link, len(job.queries), probe.n_queries, output, seconds, len(payload), encode_seconds)


def open_shipping(job: Job, plan: Plan, mode: str, journal: Journal | None = None) -> Shipping:
    """With --site: open the job at the storage site (refusals, e.g. a replica mismatch, fail here)."""
    assert job.ship is not None
    if mode == "metadata" and plan.direct:
        raise JobError("--ship metadata needs the fragments strategy (query segmentation merges nothing)", 2)
    setup = None
    if mode == "metadata":
        setup = BlastJobSetup(
            program=job.program,
            options=job.options.without("query", "db", "out").argv(),
            db_arg=job.db.arg,
            manifest_sha256=job.manifest_checksum,
            pieces=plan.pieces,
            queries=job.queries,
        )
    earlier = journal.earlier_site_job() if journal is not None else None
    if earlier is not None:  # a killed run's job still holds the output path at the site
        cancel_site_job(job.ship, earlier)
    shipping = start_shipping(job.ship, mode, setup, job.db.nseq, len(job.queries))
    if journal is not None:
        journal.note_site_job(shipping.transport.job_id)
    return shipping
