"""Rank 0's job shell: the output, journal and progress around whatever drives the job to its end.

`JobShell` is the one shell: it ends the output (volumes checked, committed, metadata saved) or aborts
it, closes the progress bar and the journal, for one master (`run_master`, here) and for the supermaster
of partitions (paramedic.engine.runtime.partitions) alike. The runner is what differs between ways of running
one master: MPI ranks (paramedic.engine.runtime.ranks), threads of one process (paramedic.engine.runtime.local), or the
master's own rank doing every task.

`JobShell.open_output` is rank 0's output at the job's start, for both too: the output already published
by the storage site for an earlier run of the search, the `--ship auto` chooser, or the sink opened now.
`new_scheduler` is a master's scheduler, the one master's and a partition master's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramedic.blast.forkserver import close_fork_servers
from paramedic.db.manifest import check_stamps
from paramedic.engine.core.master import Master, Replay
from paramedic.engine.core.scheduler import Plan, Scheduler
from paramedic.engine.job.job import Job
from paramedic.engine.job.outcome import run_record
from paramedic.engine.job.sinks import (
    AutoChooser,
    Output,
    PublishedSink,
    measure_site,
    open_sink,
    published_earlier,
)
from paramedic.engine.rank.journal import Journal
from paramedic.engine.rank.metadata import save_metadata
from paramedic.engine.rank.staging import scheduling
from paramedic.engine.rank.store import Store
from paramedic.errors import ParamedicError
from paramedic.report.progress import Progress
from paramedic.report.publish import finish
from paramedic.report.record import RankStats, RunRecord

# Drives the master to the end with its workers; returns the workers' figures. Gets the master and the
# master's own figures (the runner counts the bytes of the results there).
Runner = Callable[[Master, RankStats], list[RankStats]]


class JobShell:
    """What rank 0 does around an output and its driver, whichever the driver is."""

    def __init__(self, job: Job, journal: Journal | None, progress: Progress):
        self.job = job
        self.journal = journal
        self.progress = progress

    @contextmanager
    def running(self, abort: Callable[[], None]) -> Iterator[None]:
        """The job's run: on any error the output is aborted (the error of a volume changed under the search
        told first); the progress bar closes either way, the journal goes once the output is complete."""
        try:
            yield
        except BaseException as exc:
            abort()
            if isinstance(exc, ParamedicError):  # a BLAST+ run that failed on a volume being rewritten, say:
                check_stamps(
                    self.job.db.directory, self.job.volume_stamps, self.journal
                )  # then that is the error
            raise
        finally:
            self.progress.close()
        if self.journal is not None:
            self.journal.close(complete=True)  # the output is complete: the journal goes

    def complete(self, commit: Callable[[], None], merged: list[list[int]]) -> None:
        """Every piece is in: the volumes searched must be the digested ones, then the output is made final
        and the merged subjects saved (--save-metadata)."""
        check_stamps(self.job.db.directory, self.job.volume_stamps, self.journal)
        commit()
        self.progress.finish()
        if self.job.target.save_metadata is not None:
            save_metadata(self.job.target.save_metadata, self.job.identity, merged)

    def open_output(self, plan: Plan) -> JobOutput:
        """The job's output, chosen once for one master and for partitions: the storage site's file when an
        earlier run of this search had it published (then every piece is done), else the --ship auto
        chooser (the output is opened by the first probe), else the sink opened now."""
        job, journal = self.job, self.journal
        # --restart: the journal's site job is the discarded run's, cancelled; whatever it published is not
        # this search's output (the search may have changed)
        published = None if journal is not None and journal.restarted else published_earlier(job, journal)
        if published is not None:
            if not job.quiet:
                print(
                    f"paramedic: the storage site already holds {job.target.ship.out if job.target.ship else ''} "
                    "from an earlier run of this search, stopped before it heard so: nothing left to do",
                    file=sys.stderr,
                )
            return JobOutput(PublishedSink(job, published), None, published=True)
        if job.target.ship is not None and job.target.ship.mode == "auto":
            return JobOutput(None, AutoChooser(job, plan, measure_site(job), journal))
        return JobOutput(
            open_sink(job, plan, job.target.ship.mode if job.target.ship else None, journal), None
        )


@dataclass
class JobOutput:
    """Rank 0's output at the job's start (`JobShell.open_output`): a sink, or the --ship auto chooser that
    opens one from the first probe."""

    sink: Output | None
    chooser: AutoChooser | None
    published: bool = False  # the storage site already holds the output: every piece is done

    def done_pieces(self, plan: Plan) -> range:
        """The pieces nothing is left to do for at the start."""
        return range(len(plan.pieces) if self.published else 0)

    @property
    def output(self) -> Output:
        """The output the job wrote: the sink, or the one the chooser opened."""
        output = self.sink or (self.chooser.chosen if self.chooser is not None else None)
        assert output is not None  # given at start, or opened by the first probe (--ship auto)
        return output


def new_scheduler(job: Job, plan: Plan, store: Store | None, ranks: Sequence[int], **kw: Any) -> Scheduler:
    """A master's scheduler over `ranks` (their nodes matter under --stage): the one master's, and a
    partition master's (paramedic.engine.runtime.partitions, given `assigned`)."""
    return Scheduler(
        plan,
        keep_alignments=job.keep_alignments,
        alignments_stored=store is not None,
        replica_group=job.replica_group_size,
        **kw,
        **scheduling(job.stage, job.stage_nodes, ranks),
    )


def run_master(
    job: Job,
    plan: Plan,
    ranks: int,
    runner: Runner,
    command: list[str],
    journal: Journal | None,
    replay: Replay,
    store: Store | None,
) -> RunRecord:
    """The master's side of a job of `ranks` ranks (the master's included), driven by `runner`."""
    start = time.perf_counter()
    stats = RankStats(rank=0, role="master" if ranks > 1 else "master+worker")
    progress = Progress(
        len(job.queries),
        quiet=job.quiet,
        searches=0
        if plan.query_segmentation or job.preloaded is not None
        else len(plan.batches) * plan.n_fragments,
        pieces=len(plan.pieces),
    )
    shell = JobShell(job, journal, progress)
    master: Master | None = None
    with shell.running(lambda: master.abort() if master is not None else None):
        opened = shell.open_output(plan)
        master = Master(
            new_scheduler(job, plan, store, range(ranks)),
            opened.sink,
            progress,
            stats,
            journal,
            replay,
            opened.chooser,
            job.verified,
        )
        for piece in opened.done_pieces(plan):  # an earlier run's job finished at the site
            master.scheduler.mark_piece_done(piece)
        if job.preloaded is not None:
            master.scheduler.preload(job.preloaded)
        worker_stats = runner(master, stats)
        merged = [master.scheduler.metadata(q) or [] for q in range(len(job.queries))]
        shell.complete(master.commit, merged)
    close_fork_servers()  # their BLAST+ runs then count in this rank's peak memory
    stats.measure_memory()
    return run_record(
        job,
        plan,
        command,
        wall_seconds=time.perf_counter() - start,
        ranks=ranks,
        workers=max(1, ranks - 1),
        sink=opened.output,
        merged=merged,
        searched_again=master.scheduler.searched_again,
        journal=journal,
        store=store,
        ranks_stats=[stats, *worker_stats],
    )


def conclude(record: RunRecord, job: Job, report: Path | None) -> None:
    """After the output is complete: the run record, the summary, and the page (--report)."""
    finish(record, job.target.record, job.quiet, report)
