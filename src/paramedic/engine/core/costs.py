"""The cost model `--strategy auto` chooses a plan with: the predicted wall of each candidate (issue 44).

Three plans can run a search on one node: "blast", one BLAST+ process over the whole database with
`-num_threads` = the job's cores (in the faster `-mt_mode` that keeps BLAST+'s bytes); "queries", the
engine's query segmentation; "fragments", the engine's database segmentation (merge, reports written
again). Each is predicted from the job's shape (`Shape`) and measured costs, all kept here (`Costs`)
with the measurement each comes from (bench/plan_costs.py --calibrate measures them again on a machine,
and compares predicted with measured walls). `predict` is a pure function of those numbers: the unit
tests drive it with synthetic cost tables.

The model, for `cores` cores and W = RATE x query residues x database residues (single-thread CPU seconds
of the search, paramedic.engine.core.plan's measured rates), B BLAST+ query batches, S = SCAN x database
residues (a search's scan of the database beyond its queries' work):

- blast, mt_mode 0 (threads split the database): start + (W + B x S) / (cores x mt0_efficiency);
- blast, mt_mode 1 (threads split the query batches; only where it writes BLAST+'s bytes, tabular output
  without comments: in other formats each thread's batches get their own header and footer; and only with
  as many query letters per thread as BLAST+ says mode 1 needs): start + (W x busiest / cores +
  ceil(B / cores) x S) / mt1_efficiency, `busiest` the busiest thread's share of the batches' residues
  over an even one (each thread scans the database once per batch of its own);
- queries: engine + per task a BLAST+ start and a scan, the busiest worker's residues (its share over an
  even one: `Shape.queries_balance`);
- fragments: engine + (W x (1 + regeneration share) + searches x (start + scan)) / cores + merge per
  query: the reports are written again (from the alignments, or by searching again), which costs a
  share of the search measured per output kind.

Every plan also pays paramedic's own start (imports, the job's checks), which is spent before the choice
and the same for all: it is left out, and `engine_seconds` is what an engine plan adds to it (a fork
server per worker, the master's loop, stitching and the commit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paramedic.engine.core.plan import RATE, SCAN

PLANS = ("blast", "queries", "fragments")
# -outfmt numbers whose bytes `-mt_mode 1` leaves as BLAST+ 2.12 writes them with `-mt_mode 0`: rows
# only (measured here: 500 queries, outfmt 6 identical; 0, 5 and 7 get a report header, footer or
# "# BLAST processed N queries" line per thread batch)
MT_MODE_1_FORMATS = frozenset({6, 10})
# Programs that have -mt_mode in BLAST+ 2.12 (`-help`: blastn, blastp, blastx, tblastn; not tblastx)
MT_MODE_PROGRAMS = frozenset({"blastn", "blastp", "blastx", "tblastn"})
# The query letters per thread under which BLAST+ 2.12 says a set of queries is "too small to fully
# benefit from the -mt_mode=1 option" (and prints so on standard error, which mode 0 does not): 10,000
# residues for proteins, 2,500,000 bases for blastn (measured: 7,888 residues on 2 threads warned,
# 18,834 did not)
MT_MODE_1_LETTERS = {"blastn": 2_500_000}
MT_MODE_1_RESIDUES = 10_000


@dataclass(frozen=True)
class Costs:
    """Measured costs (seconds). Defaults: this machine kind (2 cores, BLAST+ 2.12), sources beside each."""

    # BLAST+'s threads against separate processes on the same cores: 500 mmseqs2 queries x 20,000
    # proteins as 2 processes of 2 fragments each took 45.7 and 47.2 s, blastp -num_threads 2 48.4 s
    # (mt_mode 0) and 48.0 s (mt_mode 1), same session (docs/DESIGN.md, "Regeneration"): 0.96 and 0.97
    mt0_efficiency: float = 0.96
    mt1_efficiency: float = 0.97
    # What an engine plan adds to paramedic's own start: a fork server per worker (one BLAST+ start
    # each, in parallel), the master's loop, the commit; bench/RESULTS.md ("Big databases": blastn, 1
    # query, 306 Mbp: 0.09 s for BLAST+, about 0.17 s of paramedic's start before the first search, of
    # which the fork servers and the job's own checks about 0.1 s)
    engine_seconds: float = 0.1
    # The share of the search the fragments strategy spends writing reports again: issue 44's first row
    # (30 proteins x 16,600, outfmt 0: 5.4 of 24 CPU-seconds regenerating a pairwise report);
    # tabular reports are rendered from the searches' alignments (blast_formatter, about 4% of the
    # search: docs/DESIGN.md, "Regeneration")
    regenerate_pairwise_share: float = 0.22
    regenerate_tabular_share: float = 0.04
    # The master's merge per query (keys of every fragment's hits, sorted): under a millisecond
    # (bench/RESULTS.md, "Big databases", the merge phase of the 20-query runs)
    merge_seconds_per_query: float = 0.001
    rates: dict[str, float] = field(default_factory=lambda: dict(RATE))
    scans: dict[str, float] = field(default_factory=lambda: dict(SCAN))


COSTS = Costs()


@dataclass(frozen=True)
class Shape:
    """What the model needs of a job."""

    program: str
    query_residues: int
    database_residues: int
    cores: int  # the job's cores (workers) on its one node
    blast_batches: tuple[int, ...]  # residues of each query batch BLAST+ makes (empty: one batch)
    outfmt: int
    startup_seconds: float  # one BLAST+ start, measured (paramedic.blast.tools.startup_seconds)
    queries: int = 1
    queries_tasks: int = 1  # query segmentation's tasks
    queries_balance: float = 1.0  # its busiest worker's residues over an even share
    fragment_searches: int = 1  # the fragments strategy's BLAST+ searches (batches x fragment groups)
    pairwise: bool = True  # a report the fragments strategy writes again by search (not rendered rows)


@dataclass(frozen=True)
class Prediction:
    plan: str
    seconds: float
    mt_mode: int | None = None  # blast: the thread mode


def busiest_share(batches: tuple[int, ...], threads: int) -> float:
    """BLAST+'s query batches placed longest first on `threads` threads: the busiest thread's residues
    over an even share (how -mt_mode 1 splits the work)."""
    if not batches:
        return float(max(1, threads))  # one batch: one thread works
    loads = [0] * max(1, threads)
    for residues in sorted(batches, reverse=True):
        loads[loads.index(min(loads))] += residues
    return max(loads) * len(loads) / max(1, sum(batches))


def mt_mode_allowed(program: str, outfmt: int) -> bool:
    """Whether `-mt_mode 1` exists for `program` and writes the same bytes as mode 0 in `outfmt`."""
    return program in MT_MODE_PROGRAMS and outfmt in MT_MODE_1_FORMATS


def predict(shape: Shape, costs: Costs = COSTS) -> dict[str, Prediction]:
    """The predicted wall of each plan on `shape` (seconds beyond paramedic's own start)."""
    cores = max(1, shape.cores)
    rate = costs.rates.get(shape.program, costs.rates.get("blastp", 5.3e-11))
    work = rate * shape.query_residues * shape.database_residues
    scan = costs.scans.get(shape.program, 0.0) * shape.database_residues
    batches = max(1, len(shape.blast_batches))
    start = shape.startup_seconds
    mt0 = start + (work + batches * scan) / (cores * costs.mt0_efficiency)
    blast = Prediction("blast", mt0, 0)
    enough = shape.query_residues >= cores * MT_MODE_1_LETTERS.get(shape.program, MT_MODE_1_RESIDUES)
    if cores > 1 and enough and mt_mode_allowed(shape.program, shape.outfmt):
        busiest = busiest_share(shape.blast_batches, cores)
        # each thread scans the database once per batch of its own: the busiest thread's batches
        scans = math.ceil(batches / cores)
        mt1 = start + (work * busiest / cores + scans * scan) / costs.mt1_efficiency
        if mt1 < mt0:
            blast = Prediction("blast", mt1, 1)
    per_worker = math.ceil(max(1, shape.queries_tasks) / cores)
    queries = costs.engine_seconds + per_worker * (start + scan) + work * shape.queries_balance / cores
    regenerate = costs.regenerate_pairwise_share if shape.pairwise else costs.regenerate_tabular_share
    fragments = (
        costs.engine_seconds
        + (work * (1 + regenerate) + max(1, shape.fragment_searches) * (start + scan)) / cores
        + costs.merge_seconds_per_query * shape.queries
    )
    return {
        "blast": blast,
        "queries": Prediction("queries", queries),
        "fragments": Prediction("fragments", fragments),
    }


def cheapest(predictions: dict[str, Prediction], candidates: list[str]) -> str:
    """The candidate predicted fastest (ties: the earlier in `candidates`)."""
    return min(candidates, key=lambda plan: (predictions[plan].seconds, candidates.index(plan)))
