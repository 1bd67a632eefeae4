"""The run record of a finished job, from what rank 0 knows at the end (one master or a supermaster)."""

from __future__ import annotations

from paramedic.engine.core.scheduler import Plan
from paramedic.engine.job.job import Job
from paramedic.engine.job.sinks import Output
from paramedic.engine.rank.journal import Journal
from paramedic.engine.rank.staging import summary
from paramedic.engine.rank.store import Store
from paramedic.report.record import RankStats, RunRecord


def run_record(
    job: Job,
    plan: Plan,
    command: list[str],
    *,
    wall_seconds: float,
    ranks: int,
    workers: int,
    sink: Output,
    merged: list[list[int]],
    searched_again: int,
    journal: Journal | None,
    store: Store | None,
    ranks_stats: list[RankStats],
    partitions: int = 1,
) -> RunRecord:
    segmented = plan.query_segmentation
    return RunRecord(
        program=job.program,
        command=command,
        database=job.db.arg,
        manifest_sha256=job.manifest_checksum,
        queries=len(job.queries),
        ranks=ranks,
        workers=workers,
        batches=len(plan.batches),
        fragments=plan.database_fragments,
        fragment_groups=plan.n_fragments if plan.groups else None,
        pieces=len(plan.pieces),
        strategy="queries" if segmented else "fragments",
        search_batch_queries=len(plan.batches[0]),
        regen_group_queries=len(plan.pieces[0]),
        blast_startup_seconds=job.plan_inputs.startup_seconds,
        wall_seconds=round(wall_seconds, 3),
        output=job.target.describe(),
        output_bytes=sink.output_bytes,
        metadata_pairs=None if segmented else sum(len(m) for m in merged),
        queries_with_hits=None if segmented else sum(1 for m in merged if m),
        searched_again=None if segmented else searched_again,
        resumed={"searches": journal.kept_searches, "pieces": journal.kept_pieces} if journal else None,
        alignments=("store" if store is not None else "tasks") if job.keep_alignments else None,
        ranks_stats=ranks_stats,
        ship=sink.report(),
        strategy_reason=job.strategy.record() if job.strategy else None,
        partitions=partitions,
        output_strategy=job.target.output_strategy,
        output_writes=sink.output_writes(),
        stage=summary(job.stage, [r.stage for r in ranks_stats]),
        traceback=None if segmented else "once" if plan.traceback_once else "per-fragment",
        traceback_reason=job.traceback_reason,
        restriction=job.restriction,
        first_digest=job.first_digest,
    )
