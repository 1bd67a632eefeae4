"""A worker's part of a job: one task run with BLAST+, its result as a typed value for the master."""

from __future__ import annotations

from pathlib import Path

from paramedic.blast.render import Unrenderable, render
from paramedic.blast.run import regenerate, search_fragment
from paramedic.db.manifest import fragment_members
from paramedic.db.seqids import seqid_table
from paramedic.engine.job import Job
from paramedic.engine.master import PieceResult, Result, SearchResult
from paramedic.engine.scheduler import Plan, SearchTask, Task
from paramedic.report.record import RankStats


def execute(task: Task, job: Job, plan: Plan, workdir: Path, stats: RankStats) -> Result:
    """Run one task on this rank."""
    if isinstance(task, SearchTask):
        batch = plan.batches[task.batch]
        queries = job.queries[batch.start : batch.stop]
        gids = fragment_members(job.db.directory, len(job.db.fragments))[task.fragment]
        found, run = search_fragment(
            job.program, job.options, job.db, task.fragment, queries, workdir, job.keep_alignments, gids
        )
        stats.add("search", run.seconds)
        stats.tasks["search"] += 1
        stats.fragments.append(task.fragment)
        stats.search_output_bytes += run.output_bytes
        return SearchResult(task, found)
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
    return PieceResult(task, data, run.seconds)
