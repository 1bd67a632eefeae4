"""The "blast" plan: one BLAST+ run over the whole database, on the job's cores (issue 44).

On one node BLAST+'s own threads already run near the physical limit; where the cost model
(paramedic.engine.core.costs) predicts it fastest and its output is exactly what the job asks for
(paramedic.engine.core.strategy `blast_refusal`), `--strategy auto` runs BLAST+ itself: the user's options and
-db, the job's queries as the engine searches them, `-num_threads` = the job's cores and the thread mode
the model chose. The guarantees are the other plans': the report is written under a temporary name beside
-out and renamed only when BLAST+ succeeded and the database is the digested one (a stream, standard
output included, is written through, as BLAST+ writes it); a failure is one line with its exit code;
the run record says the plan, the candidates and their predicted times.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from pathlib import Path

from paramedic.blast.run import search_whole, write_queries
from paramedic.db.manifest import check_stamps
from paramedic.engine.job.job import Job
from paramedic.output.writer import LocalFile
from paramedic.report.record import RankStats, RunRecord, TaskCost


def run_whole(job: Job, command: list[str], cwd: Path, ranks: int = 1) -> RunRecord:
    """Run `job` as one BLAST+ process (its strategy is the blast plan); the run record."""
    choice = job.strategy
    assert choice is not None and choice.whole_blast
    start = time.perf_counter()
    stats = RankStats(rank=0, role="master+worker")
    sink = LocalFile(job.target.out)
    try:
        fd = sink.fh.fileno()
        sink.fh.flush()  # standard output: what Python holds goes first
        before = _position(fd)
        with tempfile.TemporaryDirectory(prefix="paramedic-blast-") as tmp:
            queries = Path(tmp) / "queries.fasta"
            write_queries(queries, job.queries)
            seconds = search_whole(job.program, job.options, queries, choice.threads, choice.mt_mode, fd, cwd)
        after = _position(fd)
        if job.verified is not None:
            job.verified()  # the database's digest: a damaged one is refused, nothing published
        check_stamps(job.db.directory, job.volume_stamps)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    stats.seconds["search"] = round(seconds, 3)
    stats.tasks["search"] = 1
    residues = sum(len(s) for _, s in job.queries)
    stats.task_costs.append(
        list(TaskCost("whole", 0, -1, len(job.queries), residues, job.db.length, round(seconds, 3)))
    )
    stats.python_cpu_seconds = round(time.process_time(), 3)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats.peak_rss_mb = usage.ru_maxrss / 1024
    stats.peak_blast_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    n = len(job.queries)
    return RunRecord(
        program=job.program,
        command=command,
        database=job.db.arg,
        manifest_sha256=job.manifest_checksum,
        queries=n,
        ranks=ranks,
        workers=choice.threads,
        batches=1,
        fragments=1,
        pieces=1,
        strategy=choice.strategy,
        search_batch_queries=n,
        regen_group_queries=n,
        blast_startup_seconds=job.plan_inputs.startup_seconds,
        wall_seconds=round(time.perf_counter() - start, 3),
        output=job.target.describe(),
        output_bytes=max(0, after - before) if before >= 0 and after >= 0 else 0,
        metadata_pairs=None,
        queries_with_hits=None,
        searched_again=None,
        ranks_stats=[stats],
        strategy_reason=choice.record(),
        runner="local",
        restriction=job.restriction,
    )


def _position(fd: int) -> int:
    """Where `fd` is (BLAST+ writes through the same open file, so the difference is its bytes); -1 for a
    pipe or a device."""
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return -1
