"""The predictor's cost model (`paramedic simulate`): a pilot run's record as rates, a task's virtual seconds,
and what each output strategy's writes cost.

`CostModel.from_record` reads a pilot's per-task costs (paramedic.report.record); `TaskCosts` gives each task
of the predicted plan its BLAST+ seconds and the empty result a simulated task returns; `OUTPUT_COSTS`, filled
by `register_output` when this module is imported, is what `--output-strategy` may name.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paramedic.blast.hits import FragmentSearch
from paramedic.engine.core.master import PieceResult, SearchResult
from paramedic.engine.core.scheduler import Plan, SearchTask, Task
from paramedic.errors import InputError
from paramedic.output.stitch import can_stitch
from paramedic.output.strategies import ROUND_BYTES
from paramedic.report.record import RunRecord

# A task reaches an idle worker this long after its master sends it: the worker waits by probing, every
# 1 ms doubling up to 10 ms (paramedic.engine.runtime.ranks), and a worker that just sent a result is still short.
LATENCY_SECONDS = 0.002


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
            fragment_residues = equal_parts(whole, units)
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
        return equal_parts(
            round(sum(self.fragment_residues) * scale), fragments or len(self.fragment_residues)
        )


def equal_parts(total: int, parts: int) -> tuple[int, ...]:
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


class TaskCosts:
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
