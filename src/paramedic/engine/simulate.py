"""The predictor (`paramedic simulate`): the job's own scheduler objects driven in virtual time.

A pilot run's record (paramedic.report.record) holds every task's BLAST+ seconds with its query and
database residues. From it the predictor builds a cost model and runs a job of any size: a plan for N
queries made by the engine's own `make_plan` (query lengths sampled from the record), the engine's own
Master, or a Supermaster with PartitionMasters (paramedic.engine.hierarchy), handed fake results with no
hits (the merge then costs nothing here; its measured cost is charged in virtual time instead).

Virtual time, per task:
- a fragment search costs BLAST+'s start-up plus a rate sampled from the record's searches (seconds per
  query residue per database residue) times its query residues and its fragment's residues; a report
  piece costs start-up plus, per query, the per-query cost of a record piece sampled with the query's
  length; with query segmentation a piece is a search of the whole database, costed as a search;
- every master is one server: each message it handles (a result in, a task out, a segment request or
  answer) costs it `message_seconds`, a search result also the record's merge seconds per query and the
  unpickling of its merge keys (KEY_SECONDS each; the record's merged hits per query give their number), and
  with the `master` output strategy a report piece the record's write seconds per byte on rank 0 (the
  supermaster when there are partitions); messages wait while their master is busy;
- a task reaches its worker `latency_seconds` after its master sends it (ranks wait by probing);
- the job's fixed cost (start, commit, stopping the ranks) is the pilot's wall less its busiest worker.

Efficiency is the BLAST+ work (every task's seconds) over (ranks x wall), every rank counted: rank 0,
partition masters and workers.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramedic.blast.hits import FragmentSearch
from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import batch_residues, query_batches
from paramedic.blast.programs import PROGRAMS
from paramedic.db.fasta import read_fasta
from paramedic.engine.hierarchy import PartitionMaster, Supermaster, partitions
from paramedic.engine.master import Master, PieceResult, SearchResult
from paramedic.engine.plan import make_plan
from paramedic.engine.runner import Arrival, drive
from paramedic.engine.scheduler import PieceTask, Plan, Scheduler, SearchTask, Task
from paramedic.engine.virtual import VirtualTransport
from paramedic.errors import InputError, ParamedicError, UsageError
from paramedic.output.stitch import can_stitch
from paramedic.output.strategies import ROUND_BYTES
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord

# One MPI message handled by a master: receive and unpickle a result, or pickle and send a task (measured
# on this machine with mpi4py and the MPICH wheel between two ranks: bench/simulate.py --calibrate).
MESSAGE_SECONDS = 60e-6
# A task reaches an idle worker this long after its master sends it: the worker waits by probing, every
# 1 ms doubling up to 10 ms (paramedic.engine.ranks), and a worker that just sent a result is still short.
LATENCY_SECONDS = 0.002
# Unpickling one merge key (a Hit or a Candidate) in a master: a search result of 20 queries with 48 hits
# and 48 candidates each took 4.17 ms to unpickle (and as long to pickle) here: 2.2 us per key.
KEY_SECONDS = 2.2e-6


# -- output strategies -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputCost:
    """Where a report piece's bytes are written, in virtual time: seconds on rank 0 (the writer of the
    `master` strategy) and seconds on the worker that wrote the piece, for `size` bytes at `per_byte`
    seconds per byte (rank 0's rate in the pilot run)."""

    name: str
    on_rank0: Callable[[int, float], float]
    on_worker: Callable[[int, float], float]
    # collective rounds: once this many placed bytes are unwritten every worker stops after its task,
    # all write their shares together, then go on (None: no rounds)
    round_bytes: int | None = None


OUTPUT_COSTS: dict[str, OutputCost] = {}


def register_output(cost: OutputCost) -> OutputCost:
    """An output strategy the predictor knows (`--output-strategy`); a new strategy registers its cost."""
    OUTPUT_COSTS[cost.name] = cost
    return cost


# rank 0 writes every byte (today's engine): its write rate bounds the job
register_output(OutputCost("master", lambda size, per_byte: size * per_byte, lambda size, per_byte: 0.0))
# each worker writes its own pieces at their offsets, in parallel at rank 0's measured rate (no shared
# filesystem limit modelled); rank 0 handles only the message saying the piece is written
register_output(
    OutputCost("worker-individual", lambda size, per_byte: 0.0, lambda size, per_byte: size * per_byte)
)
# a writer per segment gathers its peers' pieces and writes them: costed as each piece written once by
# the worker that wrote it (the gathering messages are not modelled)
register_output(
    OutputCost("worker-merge", lambda size, per_byte: 0.0, lambda size, per_byte: size * per_byte)
)
# rounds in which every worker writes its share of the placed bytes (spread evenly): a round starts when
# ROUND_BYTES are placed and waits for the last task in flight anywhere (a barrier), and a last round
# writes what is left at the end
register_output(
    OutputCost(
        "worker-collective", lambda size, per_byte: 0.0, lambda size, per_byte: 0.0, round_bytes=ROUND_BYTES
    )
)


# -- settings --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimulateSettings:
    """`paramedic simulate`: predict a job of `queries` queries on `workers` ranks besides rank 0 (as
    `paramedic search --np`), from the record of a pilot run."""

    record: Path
    queries: int | None  # None: the queries of `query_file`
    workers: int
    partition_size: int | None = None  # ranks per partition (its master and workers); None: one master
    replica_group_size: int | None = None  # workers per copy of the database (--replica-group-size)
    output_strategy: str = "master"
    fragments: int | None = None  # the database cut into this many equal fragments (default: the pilot's)
    database_scale: float = 1.0  # a database this many times the pilot's (same cost per residue pair)
    batch: int | None = None  # queries per search task (default: the pilot's --batch, else sized)
    message_seconds: float = MESSAGE_SECONDS
    latency_seconds: float = LATENCY_SECONDS
    seed: int = 1
    # cores the ranks share (one machine): with more workers than cores a task takes workers/cores times
    # its cost (the cores shared out evenly); None: a core per rank, as on a cluster
    cores: int | None = None
    query_file: Path | None = None  # the job's own queries: their lengths instead of sampled ones

    def __post_init__(self) -> None:
        if (self.queries is None) == (self.query_file is None):
            raise UsageError("give --queries N or --query-file FASTA (one of them)")
        if self.queries is not None and self.queries < 1:
            raise UsageError("--queries must be at least 1")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.partition_size is not None:
            if self.partition_size < 2:
                raise UsageError("--partition-size must be at least 2 (a partition master and a worker)")
            if self.workers < self.partition_size:
                raise UsageError(
                    f"--workers {self.workers} is fewer than one partition of {self.partition_size} ranks"
                )
        if self.replica_group_size is not None and self.replica_group_size < 1:
            raise UsageError("--replica-group-size must be at least 1")
        if self.output_strategy not in OUTPUT_COSTS:
            raise UsageError(
                f"--output-strategy {self.output_strategy!r}: choose one of {', '.join(OUTPUT_COSTS)}"
            )
        if self.fragments is not None and self.fragments < 1:
            raise UsageError("--fragments must be at least 1")
        if not (self.database_scale > 0 and math.isfinite(self.database_scale)):
            raise UsageError("--database-scale must be a positive number")
        if self.batch is not None and self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.cores is not None and self.cores < 1:
            raise UsageError("--cores must be at least 1")
        if self.message_seconds < 0 or self.latency_seconds < 0:
            raise UsageError("--message-seconds and --latency-seconds must not be negative")


# -- the cost model --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuerySample:
    """A query of the predicted job, drawn from a pilot task: its length and its report's BLAST+ seconds
    (start-up excluded)."""

    length: int
    piece_seconds: float


@dataclass(frozen=True)
class CostModel:
    program: str
    strategy: str  # the pilot's: "fragments" or "queries"
    keep_alignments: bool
    alignments_stored: bool
    stitchable: bool
    startup: float  # BLAST+ start-up per task
    search_rates: tuple[float, ...]  # seconds per query residue per database residue, one per pilot task
    queries: tuple[QuerySample, ...]  # the pilot's queries, as samples
    fragment_residues: tuple[int, ...]
    merge_per_query: float  # the master's merge seconds per query of a search result
    keys_per_query: float  # merge keys per query in a search result (hits and candidates), estimated
    write_per_byte: float  # rank 0's write seconds per output byte
    output_per_query: float  # output bytes per query
    fixed_seconds: float  # the pilot's wall less its busiest worker (start, commit, stop)
    batch: int | None  # the pilot's --batch
    piece_queries: int | None  # the pilot's --regen-batch

    @classmethod
    def from_record(cls, record: RunRecord) -> CostModel:
        """The model of a pilot run; InputError when the record cannot give one."""
        try:
            costs = [(r, r.costs()) for r in record.ranks_stats]
        except ValueError as exc:
            raise InputError(f"run record: {exc}") from None
        tasks = [c for _, cs in costs for c in cs]
        if not tasks:
            raise InputError(
                "the run record has no per-task costs (task_costs): it was written by an older paramedic, "
                "or the run was resumed with nothing left to do; record a pilot run with this version"
            )
        startup = record.blast_startup_seconds
        searched = [t for t in tasks if t.kind in ("search", "whole") and t.query_residues > 0]
        if not searched:
            raise InputError("the run record holds no search task to take a search rate from")
        rates = tuple(
            max(0.0, t.seconds - startup) / (t.query_residues * max(1, t.database_residues)) for t in searched
        )
        # a query's length and report cost from the finest tasks that hold it: pieces (regeneration), or
        # with query segmentation the pieces that search and write at once (their report costs nothing more)
        pieces = [t for t in tasks if t.kind == "piece"] or [t for t in tasks if t.kind == "whole"]
        if not pieces:
            pieces = searched  # a record of searches only: lengths from them, reports free
        samples = tuple(
            QuerySample(
                max(1, round(t.query_residues / t.queries)),
                max(0.0, t.seconds - startup) / t.queries if t.kind == "piece" else 0.0,
            )
            for t in pieces
            for _ in range(t.queries)
        )
        fragments = {t.fragment: t.database_residues for t in tasks if t.kind == "search"}
        units = record.fragment_groups or record.fragments  # a task's fragment may be a group
        if record.strategy == "queries" or len(fragments) != units:
            whole = next((t.database_residues for t in tasks if t.kind == "whole"), 0) or sum(
                fragments.values()
            )
            fragment_residues = _equal_parts(whole, units)
        else:
            fragment_residues = tuple(fragments[f] for f in sorted(fragments))
        master = record.ranks_stats[0]
        search_queries = sum(t.queries for t in tasks if t.kind == "search")
        # the write rate: rank 0's with the master strategy, else the workers' MPI-IO seconds
        writers = [master] if record.output_strategy == "master" else record.ranks_stats[1:]
        writing = sum(r.seconds["write"] for r in writers)
        busiest = max(sum(c.seconds for c in cs) + len(cs) * LATENCY_SECONDS for r, cs in costs if cs)
        return cls(
            program=record.program,
            strategy=record.strategy,
            keep_alignments=record.alignments is not None,
            alignments_stored=record.alignments == "store",
            stitchable=can_stitch(_value(record.command, "-outfmt") or "0"),
            startup=startup,
            search_rates=rates,
            queries=samples,
            fragment_residues=fragment_residues,
            merge_per_query=master.seconds["merge"] / search_queries if search_queries else 0.0,
            # a fragment's share of the merged hits, and as many preliminary candidates
            keys_per_query=2 * (record.metadata_pairs or 0) / record.queries / units,
            write_per_byte=writing / record.output_bytes if record.output_bytes else 0.0,
            output_per_query=record.output_bytes / record.queries,
            fixed_seconds=max(0.0, record.wall_seconds - busiest),
            batch=_option(record.command, "--batch"),
            piece_queries=_option(record.command, "--regen-batch"),
        )

    def database(self, fragments: int | None, scale: float) -> tuple[int, ...]:
        """Fragment residues of the predicted job's database."""
        if fragments is None and scale == 1.0:
            return self.fragment_residues
        return _equal_parts(
            round(sum(self.fragment_residues) * scale), fragments or len(self.fragment_residues)
        )


def _equal_parts(total: int, parts: int) -> tuple[int, ...]:
    return tuple(total // parts + (1 if i < total % parts else 0) for i in range(parts))


def _value(command: Sequence[str], name: str) -> str | None:
    """An option's value on the pilot's command line (`--batch 5`, `--batch=5`, `-outfmt "6 std"`)."""
    for i, arg in enumerate(command):
        if arg == name and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _option(command: Sequence[str], name: str) -> int | None:
    """An engine option's integer value on the pilot's command line."""
    value = _value(command, name)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


# -- the simulation --------------------------------------------------------------------------------------
@dataclass
class Role:
    """Busy seconds of the ranks of one role."""

    ranks: int = 0
    busy: float = 0.0

    def report(self, wall: float) -> dict[str, float]:
        idle = max(0.0, self.ranks * wall - self.busy)
        return {
            "ranks": self.ranks,
            "busy_seconds": round(self.busy, 3),
            "idle_seconds": round(idle, 3),
            "idle_seconds_per_rank": round(idle / self.ranks, 3) if self.ranks else 0.0,
            "utilisation": round(self.busy / (self.ranks * wall), 4) if self.ranks and wall else 0.0,
        }


@dataclass
class Prediction:
    settings: SimulateSettings
    queries: int
    wall_seconds: float
    work_seconds: float
    ranks: int
    partitions: int
    plan_batches: int
    plan_pieces: int
    fragments: int
    tasks: int
    roles: dict[str, Role]
    fixed_seconds: float
    scheduler_seconds: float  # real CPU seconds the scheduler objects took in this simulation
    simulate_seconds: float
    last_segment_seconds: float | None = None  # virtual time the supermaster handed out its last segment
    output_rounds: int = 0  # worker-collective: the rounds, the last one included

    @property
    def efficiency(self) -> float:
        return self.work_seconds / (self.ranks * self.wall_seconds) if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "efficiency": round(self.efficiency, 4),
            "work_seconds": round(self.work_seconds, 3),
            "queries": self.queries,
            "workers": s.workers,
            "ranks": self.ranks,
            "partition_size": s.partition_size,
            "partitions": self.partitions,
            "output_strategy": s.output_strategy,
            "output_rounds": self.output_rounds,
            "fragments": self.fragments,
            "batches": self.plan_batches,
            "pieces": self.plan_pieces,
            "tasks": self.tasks,
            "fixed_seconds": round(self.fixed_seconds, 3),
            "roles": {name: role.report(self.wall_seconds) for name, role in self.roles.items()},
            "last_segment_seconds": None
            if self.last_segment_seconds is None
            else round(self.last_segment_seconds, 3),
            "scheduler_cpu_seconds": round(self.scheduler_seconds, 3),
            "simulate_seconds": round(self.simulate_seconds, 3),
            "record": str(s.record),
        }

    def summary(self) -> str:
        s = self.settings
        layout = (
            f"{self.partitions} partitions of {s.partition_size} ranks" if s.partition_size else "one master"
        )
        lines = [
            f"paramedic: predicted {self.queries:,} queries on {s.workers:,} workers ({layout}, "
            f"{self.ranks:,} ranks, output: {s.output_strategy}): wall {self.wall_seconds:,.1f} s, "
            f"efficiency {100 * self.efficiency:.1f}%",
            f"  plan: {self.plan_batches:,} batches x {self.fragments} fragments, {self.plan_pieces:,} "
            f"pieces, {self.tasks:,} tasks; BLAST+ work {self.work_seconds:,.1f} s; fixed "
            f"{self.fixed_seconds:.1f} s",
        ]
        for name, role in self.roles.items():
            r = role.report(self.wall_seconds)
            lines.append(
                f"  {name}: {r['ranks']:,} ranks, idle {r['idle_seconds_per_rank']:,.2f} s per rank "
                f"({100 * (1 - r['utilisation']):.1f}% of the wall)"
            )
        return "\n".join(lines)


class _Sink:
    """A master's sink in virtual time: counts the pieces, forwards them to the supermaster."""

    holds_pieces = False

    def __init__(self, plan: Plan, on_piece: Callable[[int], None]):
        self.plan = plan
        self.on_piece = on_piece

    def add(self, index: int, data: bytes) -> int:
        self.on_piece(index)
        return len(self.plan.pieces[index])

    def ship(self, tasks: list[PieceTask]) -> int:
        raise AssertionError("the predictor writes pieces")

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class MasterClock(VirtualTransport):
    """One master as a server in virtual time, over the runner's own loop (paramedic.engine.runner): each
    message it handles costs it `message_seconds` and messages wait while it is busy; a search result
    also costs the merge, a piece its write on rank 0 (the output strategy's); a task reaches its worker
    `latency_seconds` after it is sent; with collective output rounds no task starts before the round
    under way ends."""

    def __init__(
        self,
        workers: int,
        execute: Callable[[Task], SearchResult | PieceResult],
        cost: Callable[[Task], float],
        model: CostModel,
        output: OutputCost,
        plan: Plan,
        message: float,
        latency: float,
    ):
        super().__init__(workers, execute, cost, log=False)
        self.model = model
        self.output = output
        self.plan = plan
        self.message = message
        self.latency = latency
        self.free = 0.0  # the master's next free moment
        self.busy = 0.0
        self.end = 0.0
        self.work = 0.0  # BLAST+ seconds of every task
        self.worker_busy = 0.0
        self.tasks = 0
        self.unwritten = 0  # collective rounds: placed bytes not yet written
        self.round_until = 0.0  # ... no task starts before the round under way ends
        self.rounds = 0
        self.scheduler_seconds = 0.0  # real seconds in the master's code (the loop between arrivals)
        self._mark = time.perf_counter()

    def due(self, task: Task) -> float:
        self.free += self.message
        self.busy += self.message
        seconds = self.seconds(task)
        written = 0.0
        if isinstance(task, PieceTask):
            size = round(task.n_queries * self.model.output_per_query)
            written = self.output.on_worker(size, self.model.write_per_byte)
        self.work += seconds
        self.worker_busy += seconds + written
        self.tasks += 1
        return max(self.free, self.round_until) + self.latency + seconds + written

    def receive(self) -> Arrival:
        self.scheduler_seconds += time.perf_counter() - self._mark
        arrival = super().receive()
        self._mark = time.perf_counter()
        return arrival

    def arrived(self, task: Task) -> None:
        self.end = max(self.end, self.now)
        self.free = max(self.now, self.free) + self.message
        self.busy += self.message
        if isinstance(task, SearchTask):
            per_query = self.model.merge_per_query + self.model.keys_per_query * KEY_SECONDS
            merge = per_query * len(self.plan.batches[task.batch])
            self.free += merge
            self.busy += merge
        if self.output.round_bytes is not None and isinstance(task, PieceTask):
            self.unwritten += round(task.n_queries * self.model.output_per_query)
            if self.unwritten >= self.output.round_bytes:  # after the last task in flight
                self.write_round(max([self.now, *self.running]))

    def piece_written(self, index: int) -> None:
        """A piece the master wrote (its sink): rank 0's time, with the `master` strategy."""
        size = round(len(self.plan.pieces[index]) * self.model.output_per_query)
        work = self.output.on_rank0(size, self.model.write_per_byte)
        self.free += work
        self.busy += work

    def write_round(self, barrier: float) -> None:
        """Collective rounds: every worker writes its share of the unwritten bytes once all are in."""
        self.round_until = barrier + self.unwritten * self.model.write_per_byte / self.count
        self.worker_busy += self.unwritten * self.model.write_per_byte
        self.unwritten = 0
        self.rounds += 1

    def stall_error(self) -> ParamedicError:
        return UsageError("internal: the simulated job stalled (the scheduler handed out no task)")


def simulate(settings: SimulateSettings) -> Prediction:
    """Predict the job: load the record, build the plan, run the scheduler objects in virtual time."""
    try:
        record = RunRecord.load(settings.record)
    except FileNotFoundError:
        raise InputError(f"--record {settings.record}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"--record {settings.record}: not a run record: {exc}") from None
    return predict(CostModel.from_record(record), settings)


def predict(model: CostModel, settings: SimulateSettings) -> Prediction:
    started = time.perf_counter()
    rng = random.Random(settings.seed)
    if settings.query_file is not None:
        program = PROGRAMS[model.program]
        lengths = [len(r.sequence) for r in read_fasta(settings.query_file, program.query_type)]
    n = len(lengths) if settings.query_file is not None else settings.queries
    assert n is not None
    picks = [model.queries[rng.randrange(len(model.queries))] for _ in range(n)]
    if settings.query_file is None:
        lengths = [q.length for q in picks]
    residues = [0, *itertools.accumulate(lengths)]
    piece_cost = [0.0, *itertools.accumulate(q.piece_seconds for q in picks)]
    fragment_residues = model.database(settings.fragments, settings.database_scale)
    blast_residues = batch_residues(model.program, BlastOptions())
    plan = make_plan(
        program=model.program,
        query_lengths=lengths,
        fragment_residues=fragment_residues,
        workers=settings.workers,
        hitlist_size=500,
        startup_seconds=model.startup,
        stitchable=model.stitchable,
        batch=settings.batch or model.batch,
        piece_queries=model.piece_queries,
        query_segmentation=model.strategy == "queries",
        keep_alignments=model.keep_alignments,
        blast_batches=query_batches(lengths, blast_residues) if blast_residues else (),
    )
    whole_residues = sum(fragment_residues)
    output = OUTPUT_COSTS[settings.output_strategy]
    message = settings.message_seconds
    latency = settings.latency_seconds

    def cost(task: Task) -> float:
        return shared * blast_seconds(task)

    def blast_seconds(task: Task) -> float:
        if isinstance(task, SearchTask):
            batch = plan.batches[task.batch]
            q = residues[batch.stop] - residues[batch.start]
            rate = model.search_rates[rng.randrange(len(model.search_rates))]
            return model.startup + rate * q * fragment_residues[task.fragment]
        stop = task.first_query + task.n_queries
        if task.subjects is None:  # query segmentation: the whole database searched
            rate = model.search_rates[rng.randrange(len(model.search_rates))]
            return model.startup + rate * (residues[stop] - residues[task.first_query]) * whole_residues
        return model.startup + piece_cost[stop] - piece_cost[task.first_query]

    nothing: dict[int, FragmentSearch] = {}

    def result(task: Task) -> SearchResult | PieceResult:
        if isinstance(task, SearchTask):
            n = len(plan.batches[task.batch])
            if n not in nothing:
                nothing[n] = FragmentSearch([[] for _ in range(n)], [None] * n)
            return SearchResult(task, nothing[n], stored=model.alignments_stored)
        return PieceResult(task, b"", 0.0)

    ranks = settings.workers + 1
    if settings.partition_size is None:  # one master: the runner's own loop over a costed clock
        shared = max(1.0, settings.workers / settings.cores) if settings.cores else 1.0
        clock = MasterClock(settings.workers, result, cost, model, output, plan, message, latency)
        scheduler = Scheduler(
            plan,
            keep_alignments=model.keep_alignments,
            alignments_stored=model.alignments_stored,
            replica_group=settings.replica_group_size,
        )
        sink = _Sink(plan, clock.piece_written)
        drive(Master(scheduler, sink, Progress(0, quiet=True), RankStats(0, "master")), clock)
        end = max(clock.end, clock.free)
        if output.round_bytes is not None and clock.unwritten:
            clock.write_round(end)
        wall = max(end, clock.round_until) + model.fixed_seconds
        return Prediction(
            settings=settings,
            queries=n,
            wall_seconds=wall,
            work_seconds=clock.work,
            ranks=ranks,
            partitions=0,
            plan_batches=len(plan.batches),
            plan_pieces=len(plan.pieces),
            fragments=plan.n_fragments,
            tasks=clock.tasks,
            roles={
                "master": Role(1, clock.busy),
                "workers": Role(settings.workers, clock.worker_busy),
            },
            fixed_seconds=model.fixed_seconds,
            scheduler_seconds=clock.scheduler_seconds,
            simulate_seconds=time.perf_counter() - started,
            output_rounds=clock.rounds,
        )

    # partitions of a master and its workers, rank 0 the supermaster
    if settings.partition_size is None:
        groups = [list(range(1, ranks))]
    else:
        try:
            groups = partitions(ranks, settings.partition_size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    partitioned = settings.partition_size is not None
    try:
        supermaster = Supermaster(plan) if partitioned else None
    except ValueError:
        raise UsageError(
            "--partition-size: the pilot's -outfmt is written in one piece (not stitched), which cannot "
            "be cut into query segments"
        ) from None
    unwritten = 0  # worker-collective: placed bytes not yet written in a round
    round_until = 0.0  # ... no task starts before the round under way ends
    rounds = 0
    free0 = 0.0  # rank 0's next free moment (the supermaster, or the only master)
    busy0 = 0.0
    end = 0.0
    last_segment: float | None = None
    scheduler_seconds = 0.0

    def piece_written(p: int, index: int) -> None:
        """A partition's piece reaches rank 0 (its bytes with the master strategy): rank 0's time."""
        nonlocal free0, busy0, end
        size = round(len(plan.pieces[index]) * model.output_per_query)
        if supermaster is not None:
            supermaster.piece_done(index)
            work = message + output.on_rank0(size, model.write_per_byte)
            start = max(free[p] + latency, free0)
            free0 = start + work
            busy0 += work
            end = max(end, free0)
        else:  # the only master writes: charged to its own time (rank 0)
            work = output.on_rank0(size, model.write_per_byte)
            free[p] += work
            busy[p] += work

    masters: list[Master] = []
    pms: list[PartitionMaster] = []
    for p, group in enumerate(groups):
        scheduler = Scheduler(
            plan,
            keep_alignments=model.keep_alignments,
            alignments_stored=model.alignments_stored,
            assigned=set() if partitioned else None,
            replica_group=settings.replica_group_size,
        )
        sink = _Sink(plan, functools.partial(piece_written, p))
        master = Master(scheduler, sink, Progress(0, quiet=True), RankStats(group[0], "master"))
        masters.append(master)
        if partitioned:
            pms.append(PartitionMaster(master, len(group) - 1))
    worker_ranks = [group[1:] if partitioned else group for group in groups]
    searching = sum(len(ws) for ws in worker_ranks)  # the ranks running BLAST+ (masters use little CPU)
    shared = max(1.0, searching / settings.cores) if settings.cores else 1.0
    free = [0.0] * len(groups)  # each master's next free moment
    busy = [0.0] * len(groups)
    # a master numbers its workers from 1 (their ranks in its communicator), as the engine's runners do
    idle: list[deque[int]] = [deque(range(1, len(ws) + 1)) for ws in worker_ranks]
    events: list[tuple[float, int, int, int, Any]] = []  # (time, sequence, kind, partition, payload)
    DONE, SEGMENT, REQUEST = 0, 1, 2
    sequence = itertools.count()
    work = 0.0
    worker_busy = 0.0
    tasks = 0

    def write_round(barrier: float) -> None:
        """worker-collective: every worker writes its share of the unwritten bytes once all are in."""
        nonlocal unwritten, round_until, rounds, worker_busy
        seconds = unwritten * model.write_per_byte / searching
        round_until = barrier + seconds
        worker_busy += unwritten * model.write_per_byte
        unwritten = 0
        rounds += 1

    def dispatch(p: int) -> None:
        nonlocal scheduler_seconds, work, worker_busy, tasks
        master = masters[p]
        t0 = time.perf_counter()
        while idle[p]:
            task = master.next_task(idle[p][0])
            if task is None:
                break
            worker = idle[p].popleft()
            free[p] += message
            busy[p] += message
            seconds = cost(task)
            written = 0.0
            if isinstance(task, PieceTask):
                size = round(task.n_queries * model.output_per_query)
                written = output.on_worker(size, model.write_per_byte)
            work += seconds
            worker_busy += seconds + written
            tasks += 1
            done = max(free[p], round_until) + latency + seconds + written
            heapq.heappush(events, (done, next(sequence), DONE, p, (worker, task)))
        if partitioned and pms[p].wants_segment():
            pms[p].requested = True
            free[p] += message
            busy[p] += message
            heapq.heappush(events, (free[p] + latency, next(sequence), REQUEST, p, None))
        scheduler_seconds += time.perf_counter() - t0

    for master in masters:
        master.start()
    for p in range(len(groups)):
        dispatch(p)
    while events:
        now, _, kind, p, payload = heapq.heappop(events)
        end = max(end, now)
        if kind == REQUEST:  # at rank 0: the next segment for partition p
            assert supermaster is not None
            start = max(now, free0)
            free0 = start + message
            busy0 += message
            t0 = time.perf_counter()
            segment = supermaster.next_segment(groups[p][0])
            scheduler_seconds += time.perf_counter() - t0
            if segment is not None:
                last_segment = free0
            heapq.heappush(events, (free0 + latency, next(sequence), SEGMENT, p, segment))
            continue
        start = max(now, free[p])
        free[p] = start + message
        busy[p] += message
        t0 = time.perf_counter()
        if kind == SEGMENT:
            pms[p].receive(payload)
        else:
            worker, task = payload
            if isinstance(task, SearchTask):
                per_query = model.merge_per_query + model.keys_per_query * KEY_SECONDS
                merge = per_query * len(plan.batches[task.batch])
                free[p] += merge
                busy[p] += merge
            masters[p].accept(result(task))  # a piece: its output costs (piece_written)
            idle[p].append(worker)
            if output.round_bytes is not None and isinstance(task, PieceTask):
                unwritten += round(task.n_queries * model.output_per_query)
                if unwritten >= output.round_bytes:  # after the last task in flight anywhere
                    write_round(max([now, *(t for t, _, k, _, _ in events if k == DONE)]))
        scheduler_seconds += time.perf_counter() - t0
        dispatch(p)
        end = max(end, free[p])
    finished = supermaster.finished if supermaster is not None else masters[0].finished
    if not finished:
        raise UsageError("internal: the simulated job stalled (the scheduler handed out no task)")
    if output.round_bytes is not None and unwritten:
        write_round(max(end, free0))
    wall = max(end, free0, round_until) + model.fixed_seconds
    roles: dict[str, Role] = {}
    if partitioned:
        roles["supermaster"] = Role(1, busy0)
        roles["partition masters"] = Role(len(groups), sum(busy))
    else:
        roles["master"] = Role(1, sum(busy))
    roles["workers"] = Role(sum(len(ws) for ws in worker_ranks), worker_busy)
    return Prediction(
        settings=settings,
        queries=n,
        wall_seconds=wall,
        work_seconds=work,
        ranks=ranks,
        partitions=len(groups) if partitioned else 0,
        plan_batches=len(plan.batches),
        plan_pieces=len(plan.pieces),
        fragments=plan.n_fragments,
        tasks=tasks,
        roles=roles,
        fixed_seconds=model.fixed_seconds,
        scheduler_seconds=scheduler_seconds,
        simulate_seconds=time.perf_counter() - started,
        last_segment_seconds=last_segment,
        output_rounds=rounds,
    )


def run_simulate(settings: SimulateSettings, as_json: bool) -> int:
    """`paramedic simulate`: the prediction on standard output, as text or JSON."""
    prediction = simulate(settings)
    if as_json:
        print(json.dumps(prediction.as_dict(), indent=2))
    else:
        print(prediction.summary())
    sys.stdout.flush()
    return 0
