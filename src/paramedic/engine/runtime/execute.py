"""A worker's part of a job: one task run with BLAST+, its result as a typed value for the master.

With a search store every rank sees (paramedic.engine.rank.store), a search's alignments stay there: the
worker writes its whole result to the store and returns the keys, and a piece whose alignments are
`stored` is written from the store's records. A record the store cannot give back (removed, damaged)
costs only speed: the piece is written by searching again, as when its reports do not line up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.blast.prelim import INJECTABLE, injection, piece_batch_residues, query_batches
from paramedic.blast.prelim_check import injection_works
from paramedic.blast.render import Unrenderable, render
from paramedic.blast.run import Database, regenerate, search_fragment
from paramedic.db.manifest import fragment_members, global_ids
from paramedic.db.seqids import seqid_table
from paramedic.engine.core.master import Master, PieceResult, Result, SearchResult
from paramedic.engine.core.scheduler import PieceTask, Plan, SearchTask, Task
from paramedic.engine.job.job import Job
from paramedic.engine.rank.staging import stager
from paramedic.engine.rank.store import RecordError, Store, keys_only
from paramedic.errors import InternalError
from paramedic.report.record import RankStats, TaskCost

if TYPE_CHECKING:  # the job shell only on rank 0: the workers import this module too
    from paramedic.engine.job.shell import Runner

PIECE_LISTS_VARIABLE = "PARAMEDIC_PIECE_LISTS"


def task_queries(task: Task, plan: Plan, queries: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The queries `task` searches or writes: what a worker rank is sent with it (it holds no others)."""
    if isinstance(task, SearchTask):
        batch = plan.batches[task.batch]
        return list(queries[batch.start : batch.stop])
    return list(queries[task.first_query : task.first_query + task.n_queries])


def execute(
    task: Task,
    job: Job,
    plan: Plan,
    workdir: Path,
    stats: RankStats,
    store: Store | None = None,
    queries: list[tuple[str, str]] | None = None,
) -> Result:
    """Run one task on this rank; `store`: the search store, when every rank sees it; `queries`: the
    task's own (`task_queries`), which a worker rank receives with it (default: from the job's)."""
    if queries is None:
        queries = task_queries(task, plan, job.queries)
    if isinstance(task, SearchTask):
        members = job.db.directory, len(job.db.fragments), job.db.members_blake3
        fragments = plan.fragments_of(task.fragment)
        with _place(job, fragments, stats) as db:
            found, run = search_fragment(
                job.program,
                job.options,
                db,
                fragments,
                queries,
                workdir,
                job.keep_alignments,
                (lambda: db.searched_ids(fragments))
                if db.in_place
                else lambda: global_ids(fragment_members(*members), fragments),
                prelim_only=plan.traceback_once,
                lists=store is not None and _injects(job, plan),
            )
        stats.add("search", run.seconds)
        stats.tasks["search"] += 1
        stats.fragments.append(task.fragment)
        stats.search_output_bytes += run.output_bytes
        fragment_residues = job.plan_inputs.fragment_residues
        stats.add_task(
            TaskCost(
                "search",
                task.batch,
                task.fragment,
                len(queries),
                _residues(queries),
                sum(int(fragment_residues[f]) for f in fragments),
                run.seconds,
            )
        )
        if store is None:
            return SearchResult(task, found)
        store.put(task.batch, task.fragment, found)
        return SearchResult(task, keys_only(found), stored=True)
    data = None
    if task.renderable:
        try:
            data, run = render(
                job.program,
                job.options,
                job.db,
                queries,
                _alignments(task, plan, store),
                _no_table if job.db.in_place else seqid_table(job.db.directory),
                workdir,
            )
            stats.tasks["rendered"] += 1
        except (Unrenderable, RecordError):
            stats.tasks["render_fallbacks"] += 1
    if data is None:
        lists = _lists(task, job, plan, store, queries)
        data, run = regenerate(job.program, job.options, job.db, queries, task.subjects, workdir, lists)
        stats.tasks["injected"] += run.injected
    phase = "search" if task.subjects is None else "regenerate"  # query segmentation searches and writes
    stats.add(phase, run.seconds)
    stats.tasks[phase] += 1
    stats.report_bytes += run.output_bytes
    whole = task.subjects is None
    stats.add_task(
        TaskCost(
            "whole" if whole else "piece",
            task.piece,
            -1,
            len(queries),
            _residues(queries),
            job.db.length if whole else 0,
            run.seconds,
        )
    )
    return PieceResult(task, data, run.seconds)


@contextmanager
def _place(job: Job, fragments: tuple[int, ...], stats: RankStats) -> Iterator[Database]:
    """Where fragments are searched: a fragment's staged copy on this node (--stage, which searches
    fragments one by one), else the -db directory."""
    if job.stage is None:
        yield job.db
        return
    if len(fragments) != 1:
        raise InternalError("internal: --stage searches fragments one at a time")
    fragment = fragments[0]
    local = stager(job.stage, job.db)
    try:
        entered = time.time()
        with local.fragment(fragment) as db:
            stats.add_event("stage", entered, time.time() - entered)  # copied, waited for, or a hit
            yield db
    finally:
        stats.stage = local.record()


def _injects(job: Job, plan: Plan) -> bool:
    """Whether pieces align the fragment searches' lists as given (docs/DESIGN.md, "Traceback once"):
    with traceback once, for programs whose BLAST+ batches are known in advance. PIECE_LISTS_VARIABLE=scan
    makes pieces scan for their lists, to measure the two side by side."""
    if os.environ.get(PIECE_LISTS_VARIABLE) == "scan":
        return False
    return plan.traceback_once and job.program in INJECTABLE and injection_works(job.program)


def _lists(
    task: PieceTask, job: Job, plan: Plan, store: Store | None, queries: list[tuple[str, str]]
) -> bytes | None:
    """The lists a traceback-once piece aligns without scanning for them, or None (it scans its mask:
    the same report, slower), e.g. when a search's lists are missing from the store."""
    if store is None or task.subjects is None or not _injects(job, plan):
        return None
    first, n = task.first_query, task.n_queries
    try:
        searched = []
        for b, batch in enumerate(plan.batches):
            if batch.start < first + n and first < batch.stop:
                searched += [(batch.start, store.lists(b, f)) for f in range(plan.n_fragments)]
    except RecordError:
        return None
    lengths = [len(sequence) for _, sequence in queries]
    residues = piece_batch_residues(job.program, job.options)
    return injection(searched, first, task.subjects, query_batches(lengths, residues), job.program)


def _residues(queries: list[tuple[str, str]]) -> int:
    return sum(len(sequence) for _, sequence in queries)


def _alignments(task: PieceTask, plan: Plan, store: Store | None) -> tuple[tuple[bytes, ...], ...]:
    if task.alignments is not None:
        return task.alignments
    if store is None or task.stored is None:
        raise InternalError("internal: a piece's alignments are in a search store this rank has not")
    return store.alignments(plan.batches, plan.n_fragments, task.first_query, task.stored)


def _no_table(gid: int) -> bytes:
    """A database in place's kept alignments name their subjects as the whole database does: there is no
    fragment id to look up (one would be a bug: the group is regenerated by search instead)."""
    raise ValueError(f"subject {gid}: a fragment id in a database searched in place")


def serial_runner(job: Job, plan: Plan, workdir: Path, store: Store | None) -> Runner:
    """The runner of a job of one rank: the master's own rank does every task."""
    from paramedic.engine.core.runner import run_serial

    def run(master: Master, stats: RankStats) -> list[RankStats]:
        run_serial(master, lambda task: execute(task, job, plan, workdir, stats, store))
        return []

    return run
