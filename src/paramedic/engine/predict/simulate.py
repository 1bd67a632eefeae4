"""The predictor (`paramedic simulate`): the job's own scheduler objects driven in virtual time.

A pilot run's record (paramedic.report.record) holds every task's BLAST+ seconds with its query and
database residues. From it the predictor builds a cost model and runs a job of any size: a plan for N
queries made by the engine's own `make_plan` (query lengths sampled from the record), the engine's own
Master, or a Supermaster with PartitionMasters (paramedic.engine.core.hierarchy), handed fake results with no
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
- the job's fixed cost (start, commit, stopping the ranks) is the pilot's wall less its busiest worker;
- for a database described by its size (`--database-profile nr`, `--db-bytes 364G --db-volumes 176`), its
  start-up (paramedic.engine.predict.startup): rank 0's resolution of -db and, in a first job, its digest of every
  byte, before any worker searches; each rank's first use of a volume (its files opened; with `--stage`
  the node's copy and the rank's digest of it), charged to the task that uses it.

Efficiency is the BLAST+ work (every task's seconds) over (ranks x wall), every rank counted: rank 0,
partition masters and workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramedic.blast.hits import FragmentSearch
from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import batch_residues, query_batches
from paramedic.blast.programs import PROGRAMS
from paramedic.db.fasta import read_fasta
from paramedic.engine.core.hierarchy import (
    Answer,
    PartitionMaster,
    Segment,
    SegmentMaster,
    Supermaster,
    partitions,
)
from paramedic.engine.core.master import Master, PieceResult, Result, SearchResult, Sink
from paramedic.engine.core.plan import make_plan
from paramedic.engine.core.scheduler import PieceTask, Plan, Scheduler, SearchTask, Task
from paramedic.engine.predict.startup import DatabaseShape, Startup, StartupRates
from paramedic.engine.predict.virtual import ForwardSink, PartitionsLink, VirtualNetwork, WorkersLink
from paramedic.errors import InputError, ParamedicError, UsageError
from paramedic.output.stitch import can_stitch
from paramedic.output.strategies import ROUND_BYTES
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord

# One MPI message handled by a master: receive and unpickle a result, or pickle and send a task (measured
# on this machine with mpi4py and the MPICH wheel between two ranks: bench/simulate.py --calibrate).
MESSAGE_SECONDS = 60e-6
# A task reaches an idle worker this long after its master sends it: the worker waits by probing, every
# 1 ms doubling up to 10 ms (paramedic.engine.runtime.ranks), and a worker that just sent a result is still short.
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
    # the job's cores this many times as fast as the pilot's (a cluster's cores, or a pilot measured on a
    # loaded machine): every BLAST+ second of the pilot's rates divided by it
    core_speed: float = 1.0
    query_file: Path | None = None  # the job's own queries: their lengths instead of sampled ones
    # a database described by its size (paramedic.engine.predict.startup), searched in place: its start-up is
    # predicted; None: the pilot's database (scaled), whose start is in the pilot's fixed cost
    database: DatabaseShape | None = None
    first_job: bool = True  # no digest remembered yet (and with --stage, empty node caches)
    stage: bool = False  # --stage: volumes copied to each node's disk
    node_ranks: int = 1  # ranks per node (a node copies a volume once)
    rates: StartupRates = StartupRates()

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
        self._check_database()

    def _check_database(self) -> None:
        if self.node_ranks < 1:
            raise UsageError("--node-ranks must be at least 1")
        if not (self.core_speed > 0 and math.isfinite(self.core_speed)):
            raise UsageError("--core-speed must be a positive number")
        if self.database is not None and self.database_scale != 1.0:
            raise UsageError(
                "--database-scale scales the pilot's database; --database-profile or --db-bytes describe "
                "another one: give one of them"
            )
        if self.database is None and self.stage:
            raise UsageError("--stage needs the database described: --database-profile or --db-bytes")


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
    startup: Startup | None = None  # a described database's start-up
    spent: dict[str, float] = dataclasses.field(default_factory=dict)  # rank-seconds by what they did

    @property
    def efficiency(self) -> float:
        return self.work_seconds / (self.ranks * self.wall_seconds) if self.wall_seconds else 0.0

    def where(self) -> dict[str, dict[str, float]]:
        """Where the allocation's time goes (ranks x wall): rank-seconds and their share, by what the
        ranks did; the ranks that wait for rank 0's start count as spent on it."""
        total = self.ranks * self.wall_seconds
        spent = dict(self.spent)
        spent["idle"] = max(0.0, total - sum(spent.values()))
        return {
            name: {"rank_seconds": round(seconds, 3), "share": round(seconds / total, 4) if total else 0.0}
            for name, seconds in spent.items()
        }

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
            "startup": self.startup.report() if self.startup is not None else None,
            "where": self.where(),
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
        if self.startup is not None:
            st, shape = self.startup, self.startup.shape
            lines.append(
                f"  start-up ({'first' if st.first_job else 'second'} job on {shape.name}: "
                f"{shape.bytes / 1e9:,.1f} GB, {shape.volumes:,} volumes, {shape.residues:,} letters"
                f"{', staged' if st.stage else ''}): rank 0 {st.rank0_seconds:,.1f} s before the first "
                f"search (resolve {st.resolve_seconds:.2f} s, verify {st.verify_seconds:,.1f} s, stamps "
                f"{st.stamp_seconds:.3f} s); opens {st.open_seconds:.2f} s and staging "
                f"{st.copy_seconds + st.stage_digest_seconds:,.1f} s over all ranks"
            )
        lines.append(
            "  where the time goes (share of ranks x wall): "
            + ", ".join(f"{name} {100 * v['share']:.1f}%" for name, v in self.where().items())
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

    def placement(self) -> None:
        return None


@dataclass
class _Shared:
    """What every master's costs share in one prediction: the cost model, the BLAST+ work handed out,
    and the collective output rounds (a round waits for the last task in flight anywhere)."""

    model: CostModel
    output: OutputCost
    plan: Plan
    message: float
    latency: float
    searching: int  # the ranks running BLAST+
    work: float = 0.0  # BLAST+ seconds of every task
    worker_busy: float = 0.0
    tasks: int = 0
    unwritten: int = 0  # collective rounds: placed bytes not yet written
    round_until: float = 0.0  # ... no task starts before the round under way ends
    rounds: int = 0
    startup: Startup | None = None  # a described database's start-up: first uses of volumes
    volumes: range = range(0)  # the volumes a report piece reads (a mask over the whole database)
    spent: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("search", "report pieces", "merge", "messages", "output"), 0.0)
    )

    def write_round(self, barrier: float) -> None:
        """Every worker writes its share of the unwritten bytes once all are in."""
        self.round_until = barrier + self.unwritten * self.model.write_per_byte / self.searching
        self.worker_busy += self.unwritten * self.model.write_per_byte
        self.spent["output"] += self.unwritten * self.model.write_per_byte
        self.unwritten = 0
        self.rounds += 1


class MasterCosts(WorkersLink):
    """A master (the only one, or a partition's) as a server in virtual time: each message it handles
    costs it `message_seconds` and messages wait while it is busy; a search result also costs the merge,
    and the only master's written piece its write (the output strategy's); a task reaches its worker
    `latency_seconds` after it is sent, and no task starts before a collective round under way ends."""

    def __init__(
        self,
        shared: _Shared,
        workers: int,
        execute: Callable[[Task], Result],
        cost: Callable[[Task], float],
        up: RankZeroCosts | None = None,
        ranks: Sequence[int] = (),
    ):
        super().__init__(workers, execute, cost, up)
        self.shared = shared
        self.free = 0.0  # the master's next free moment
        self.busy = 0.0
        self.ranks = ranks  # the global rank of each (the master first, then its workers 1..workers)

    def _handle(self, seconds: float, at: float | None = None) -> None:
        """The master handles something that came at `at` (None: right after what it does now)."""
        self.free = (self.free if at is None else max(at, self.free)) + seconds
        self.busy += seconds

    def due(self, worker: int, task: Task) -> float:
        s = self.shared
        self._handle(s.message)
        s.spent["messages"] += s.message
        seconds = self.seconds(task)
        written = 0.0
        if isinstance(task, PieceTask):
            size = round(task.n_queries * s.model.output_per_query)
            written = s.output.on_worker(size, s.model.write_per_byte)
            s.spent["output"] += written
        s.spent["search" if isinstance(task, SearchTask) else "report pieces"] += seconds
        s.work += seconds
        s.worker_busy += seconds + written
        s.tasks += 1
        start = max(self.free, s.round_until) + s.latency
        if s.startup is not None:  # the rank's first use of the task's volumes
            volumes = (
                s.startup.shape.volumes_of(task.fragment, s.plan.n_fragments)
                if isinstance(task, SearchTask)
                else s.volumes
            )
            begin = s.startup.first_use(self.ranks[worker], volumes, start, isinstance(task, SearchTask))
            s.worker_busy += begin - start
            start = begin
        return start + seconds + written

    def arrived(self, task: Task) -> None:
        s = self.shared
        self._handle(s.message, at=self.now)
        s.spent["messages"] += s.message
        if isinstance(task, SearchTask):
            per_query = s.model.merge_per_query + s.model.keys_per_query * KEY_SECONDS
            self._handle(per_query * len(s.plan.batches[task.batch]))
            s.spent["merge"] += per_query * len(s.plan.batches[task.batch])
        if s.output.round_bytes is not None and isinstance(task, PieceTask):
            s.unwritten += round(task.n_queries * s.model.output_per_query)
            if s.unwritten >= s.output.round_bytes:  # after the last task in flight anywhere
                s.write_round(max([self.now, *self.network.due("done")]))

    def asking(self) -> float:
        self._handle(self.shared.message)
        self.shared.spent["messages"] += self.shared.message
        return self.free + self.shared.latency

    def answered(self) -> None:
        self._handle(self.shared.message, at=self.now)
        self.shared.spent["messages"] += self.shared.message

    def forwarding(self, index: int) -> float:
        return self.free + self.shared.latency

    def piece_written(self, index: int) -> None:
        """The only master wrote a piece (its sink): rank 0's time, with the `master` strategy."""
        s = self.shared
        size = round(len(s.plan.pieces[index]) * s.model.output_per_query)
        self._handle(s.output.on_rank0(size, s.model.write_per_byte))
        s.spent["output"] += s.output.on_rank0(size, s.model.write_per_byte)

    def stall_error(self) -> ParamedicError:
        return UsageError("internal: the simulated job stalled (the scheduler handed out no task)")


class RankZeroCosts(PartitionsLink):
    """Rank 0 over partitions in virtual time: a request and its answer cost it one message, a piece one
    message and its write (the output strategy's); messages wait while it is busy."""

    def __init__(self, shared: _Shared):
        super().__init__()
        self.shared = shared
        self.free = 0.0
        self.busy = 0.0
        self.last_segment: float | None = None  # when the last segment was handed out

    def _handle(self, seconds: float) -> None:
        self.free = max(self.now, self.free) + seconds
        self.busy += seconds

    def requested(self, partition: int) -> None:
        self._handle(self.shared.message)
        self.shared.spent["messages"] += self.shared.message

    def answer_due(self, answer: Answer) -> float:
        if isinstance(answer, Segment):
            self.last_segment = self.free
        return self.free + self.shared.latency

    def piece_arrived(self, index: int) -> None:
        s = self.shared
        size = round(len(s.plan.pieces[index]) * s.model.output_per_query)
        self._handle(s.message + s.output.on_rank0(size, s.model.write_per_byte))
        s.spent["messages"] += s.message
        s.spent["output"] += s.output.on_rank0(size, s.model.write_per_byte)

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


def predict(
    model: CostModel, settings: SimulateSettings, scheduler: type[Scheduler] = Scheduler
) -> Prediction:
    """The job of `settings` in virtual time; `scheduler`: the scheduling policy (a subclass of the
    engine's, docs/CONTRIBUTING.md "Add a scheduler policy")."""
    started = time.perf_counter()
    rng = random.Random(settings.seed)
    lengths, picks = _workload(model, settings, rng)
    shape = settings.database
    if shape is not None and not shape.dbtype:  # given by size: the pilot's program's molecule
        shape = shape.typed(PROGRAMS[model.program].db_type)
    if shape is None:
        fragment_residues = model.database(settings.fragments, settings.database_scale)
    else:  # searched in place: fragments as paramedic.db.blastdb.fragment_ranges cuts it, or as asked
        if PROGRAMS[model.program].db_type != shape.dbtype:
            kind = {"prot": "protein", "nucl": "nucleotide"}[shape.dbtype]
            raise UsageError(
                f"{shape.name} is a {kind} database, and the pilot ran {model.program}: record a pilot with "
                "a program that searches it"
            )
        fragment_residues = _equal_parts(shape.residues, settings.fragments or shape.fragments())
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
    output = OUTPUT_COSTS[settings.output_strategy]
    tasks = _TaskCosts(model, plan, lengths, picks, fragment_residues, rng)
    # the ranks: rank 0 (the only master, or the supermaster over partitions of a master and workers),
    # each master's loop the runner's own (paramedic.engine.core.runner) on one virtual clock
    ranks = settings.workers + 1
    groups, supermaster = _partition_groups(settings, plan, ranks)
    searching = sum(len(group) - 1 for group in groups)  # the ranks running BLAST+
    tasks.shared = max(1.0, searching / settings.cores) if settings.cores else 1.0
    tasks.shared /= settings.core_speed
    costs = _Shared(model, output, plan, settings.message_seconds, settings.latency_seconds, searching)
    startup = None
    if shape is not None:
        startup = Startup(
            shape,
            settings.rates,
            settings.first_job,
            settings.stage,
            settings.node_ranks,
            plan.n_fragments,
            nodes=-(-ranks // settings.node_ranks),
        )
        costs.startup, costs.volumes = startup, range(shape.volumes)
    network = VirtualNetwork()
    zero = RankZeroCosts(costs) if supermaster is not None else None
    links, masters = _masters(model, settings, plan, scheduler, groups, network, costs, tasks, zero)
    segments = None
    if supermaster is not None and zero is not None:
        rank0 = _Sink(plan, lambda index: None)  # its cost is charged as the piece arrives
        segments = SegmentMaster(supermaster, rank0, Progress(0, quiet=True), RankStats(0, "supermaster"))
        network.join(segments, zero)
    network.run()
    if not (segments.finished if segments is not None else masters[0].finished):
        raise UsageError("internal: the simulated job stalled (the scheduler handed out no task)")
    end = max(network.now, *(link.free for link in links), zero.free if zero is not None else 0.0)
    if output.round_bytes is not None and costs.unwritten:
        costs.write_round(end)
    before = startup.rank0_seconds if startup is not None else 0.0  # every rank waits for rank 0
    wall = before + max(end, costs.round_until) + model.fixed_seconds
    spent: dict[str, float] = {}
    if startup is not None:
        spent["start: rank 0 resolves -db, stamps"] = ranks * (
            startup.resolve_seconds + startup.stamp_seconds
        )
        spent["start: verification"] = ranks * startup.verify_seconds
        spent["start: volume opens"] = startup.open_seconds
        spent["start: staging"] = startup.copy_seconds + startup.stage_digest_seconds
    spent.update(costs.spent)
    spent["fixed (pilot's start, commit, stop)"] = ranks * model.fixed_seconds
    roles = _roles(zero, links, searching, costs)
    next(iter(roles.values())).busy += before  # rank 0 starts the job
    return Prediction(
        settings=settings,
        queries=len(lengths),
        wall_seconds=wall,
        work_seconds=costs.work,
        ranks=ranks,
        partitions=len(groups) if supermaster is not None else 0,
        plan_batches=len(plan.batches),
        plan_pieces=len(plan.pieces),
        fragments=plan.n_fragments,
        tasks=costs.tasks,
        roles=roles,
        fixed_seconds=model.fixed_seconds,
        scheduler_seconds=network.loop_seconds,
        simulate_seconds=time.perf_counter() - started,
        last_segment_seconds=zero.last_segment if zero is not None else None,
        output_rounds=costs.rounds,
        startup=startup,
        spent=spent,
    )


def _workload(
    model: CostModel, settings: SimulateSettings, rng: random.Random
) -> tuple[list[int], list[QuerySample]]:
    """The job's query lengths (its query file's, or the pilot's sampled) and a pilot query sampled for
    each, whose costs it takes."""
    n = settings.queries
    lengths: list[int] = []
    if settings.query_file is not None:
        program = PROGRAMS[model.program]
        lengths = [len(r.sequence) for r in read_fasta(settings.query_file, program.query_type)]
        n = len(lengths)
    assert n is not None
    picks = [model.queries[rng.randrange(len(model.queries))] for _ in range(n)]
    if settings.query_file is None:
        lengths = [q.length for q in picks]
    return lengths, picks


class _TaskCosts:
    """A task's virtual seconds (the pilot's rates, sampled per search; `shared`: how much slower each
    BLAST+ run goes with more running ranks than cores) and the empty result a simulated task returns."""

    def __init__(
        self,
        model: CostModel,
        plan: Plan,
        lengths: Sequence[int],
        picks: Sequence[QuerySample],
        fragment_residues: Sequence[int],
        rng: random.Random,
    ):
        self.model = model
        self.plan = plan
        self.rng = rng
        self.residues = [0, *itertools.accumulate(lengths)]
        self.piece_cost = [0.0, *itertools.accumulate(q.piece_seconds for q in picks)]
        self.fragment_residues = fragment_residues
        self.whole_residues = sum(fragment_residues)
        self.shared = 1.0
        self._nothing: dict[int, FragmentSearch] = {}

    def cost(self, task: Task) -> float:
        return self.shared * self.blast_seconds(task)

    def _rate(self) -> float:
        return self.model.search_rates[self.rng.randrange(len(self.model.search_rates))]

    def blast_seconds(self, task: Task) -> float:
        model, residues = self.model, self.residues
        if isinstance(task, SearchTask):
            batch = self.plan.batches[task.batch]
            q = residues[batch.stop] - residues[batch.start]
            return model.startup + self._rate() * q * self.fragment_residues[task.fragment]
        stop = task.first_query + task.n_queries
        if task.subjects is None:  # query segmentation: the whole database searched
            q = residues[stop] - residues[task.first_query]
            return model.startup + self._rate() * q * self.whole_residues
        return model.startup + self.piece_cost[stop] - self.piece_cost[task.first_query]

    def result(self, task: Task) -> SearchResult | PieceResult:
        if isinstance(task, SearchTask):
            n = len(self.plan.batches[task.batch])
            if n not in self._nothing:
                self._nothing[n] = FragmentSearch([[] for _ in range(n)], [None] * n)
            return SearchResult(task, self._nothing[n], stored=self.model.alignments_stored)
        return PieceResult(task, b"", 0.0)


def _partition_groups(
    settings: SimulateSettings, plan: Plan, ranks: int
) -> tuple[list[list[int]], Supermaster | None]:
    """The ranks of each master (the first of each group; one group without partitions), and the
    supermaster over the partitions."""
    if settings.partition_size is None:
        return [list(range(ranks))], None
    try:
        groups = partitions(ranks, settings.partition_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        return groups, Supermaster(plan)
    except ValueError:
        raise UsageError(
            "--partition-size: the pilot's -outfmt is written in one piece (not stitched), which "
            "cannot be cut into query segments"
        ) from None


def _masters(
    model: CostModel,
    settings: SimulateSettings,
    plan: Plan,
    scheduler: type[Scheduler],
    groups: list[list[int]],
    network: VirtualNetwork,
    costs: _Shared,
    tasks: _TaskCosts,
    zero: RankZeroCosts | None,
) -> tuple[list[MasterCosts], list[Master]]:
    """Each group's master, as the engine builds it, joined to the network with its workers' costs."""
    partitioned = zero is not None
    links: list[MasterCosts] = []
    masters: list[Master] = []
    for group in groups:
        link = MasterCosts(costs, len(group) - 1, tasks.result, tasks.cost, zero, group)
        policy = scheduler(
            plan,
            keep_alignments=model.keep_alignments,
            alignments_stored=model.alignments_stored,
            assigned=set() if partitioned else None,
            replica_group=settings.replica_group_size,
        )
        sink: Sink = ForwardSink(link) if partitioned else _Sink(plan, link.piece_written)
        master = Master(policy, sink, Progress(0, quiet=True), RankStats(group[0], "master"))
        if partitioned:
            link.partition = PartitionMaster(master, len(group) - 1)
        network.join(master, link)
        links.append(link)
        masters.append(master)
    return links, masters


def _roles(
    zero: RankZeroCosts | None, links: list[MasterCosts], searching: int, costs: _Shared
) -> dict[str, Role]:
    """Each kind of rank's count and busy seconds."""
    roles: dict[str, Role] = {}
    if zero is not None:
        roles["supermaster"] = Role(1, zero.busy)
        roles["partition masters"] = Role(len(links), sum(link.busy for link in links))
    else:
        roles["master"] = Role(1, links[0].busy)
    roles["workers"] = Role(searching, costs.worker_busy)
    return roles


def run_simulate(settings: SimulateSettings, as_json: bool) -> int:
    """`paramedic simulate`: the prediction on standard output, as text or JSON."""
    prediction = simulate(settings)
    if as_json:
        print(json.dumps(prediction.as_dict(), indent=2))
    else:
        print(prediction.summary())
    sys.stdout.flush()
    return 0
