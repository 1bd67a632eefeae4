"""Sizing the work: query batches for the search, query groups for regeneration.

Search batches are made large enough that a search's fixed cost (BLAST+'s start-up, measured at job
start, and for blastn its scan of the database, SCAN) stays under 5% of a task's time, estimated from
query and fragment residues with a per-program rate calibrated on this machine kind; and small enough
that every worker gets several tasks. Regeneration groups are small: the
cost of a regeneration run is start-up plus (queries x union of their subjects), and measured on the
mmseqs2 data a group of about 10 queries minimised it (batch 1: 7.6 s, 5: 4.5 s, 10: 4.3 s, 25: 5.0 s,
100: 7.6 s for 100 queries). Reports written from the search's own alignments (`keep_alignments`) cost
the same per query however queries are grouped, so there a group is half a search batch: few runs.
Formats whose pieces cannot be stitched are regenerated as one piece.

When nothing is shipped early (query segmentation, reports from archives), batches shrink instead of
being equal (`decreasing_pieces`): large ones first for few BLAST+ runs, small ones last so that the
workers finish together.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence

from paramedic.engine.core.scheduler import Plan

STARTUP_SHARE = 0.05
# Seconds per (query residue x database residue), single thread, BLAST+ 2.12 (blastp measured: 100
# mmseqs2 queries, 38,939 residues, against 9,055,569 residues in 18.8 s). blastn (megablast) is far
# cheaper per residue pair: 500 bigdb queries (1,007,191 bp) against 306 Mbp took 4.49 s of CPU in one
# run, 20 (34,586 bp) 0.52 s: 1.2-2.4e-14 once its per-search cost (SCAN) is taken out.
RATE = {"blastp": 5.3e-11, "blastx": 1.6e-10, "tblastn": 1.6e-10, "tblastx": 5e-10, "blastn": 2e-14}
# Seconds per database residue that every search pays however few its queries, beyond its start: blastn
# scans each subject's words against its lookup table, and with more than a few queries that table
# outgrows the caches. Measured (bench/RESULTS.md, "blastn's per-search scan"): the same 500 queries
# against 306 Mbp as 1, 2, 4 and 8 runs took 4.49, 5.65, 6.93 and 8.07 s of CPU, 0.5-1.2 s more per run;
# one query's whole run 0.27 s. The other programs' scans are per query (their work is RATE's).
SCAN = {"blastn": 1.3e-9}
DEFAULT_REGEN_GROUP = 10
# Share of the remaining query residues each round of shrinking pieces hands out. Simulated on measured
# per-query costs of the mmseqs2 queries (bench/plan_sim.py), 2/3 came closest to a perfect split on 2
# workers (2.5% over it on average, against 3.3% for halving): a piece costs a BLAST+ run and a database
# scan on top of its queries, so fewer, larger early pieces pay off until the tail grows.
ROUND_SHARE = 2 / 3
# The same where pieces are whole BLAST+ batches (`decreasing_batches`): a piece cannot be smaller than
# one batch (blastp: 10,000 residues, a twenty-fourth of the 500-query benchmark's work), so the rounds
# must shrink faster to reach single batches before the end. Simulated on measured per-query costs with
# the 500-query benchmark's 24 batches under per-query noise (bench/plan_sim.py, bench/RESULTS.md): 1/2 of
# the rest a round came to about 1% over a perfect split on 2 workers, 2/3 to 2.3%.
BATCH_ROUND_SHARE = 1 / 2


def make_plan(
    program: str,
    query_lengths: Sequence[int],
    fragment_residues: Sequence[int],
    workers: int,
    hitlist_size: int,
    startup_seconds: float,
    stitchable: bool,
    batch: int | None = None,
    piece_queries: int | None = None,
    query_segmentation: bool = False,
    keep_alignments: bool = False,
    blast_batches: Sequence[range] = (),
    search_filled_again: bool = True,
    traceback_once: bool = False,
) -> Plan:
    """The plan; every search batch and every piece (a BLAST+ run that writes part of the report) is cut
    only where BLAST+ itself starts a batch of the user's query file (`blast_batches`,
    paramedic.blast.prelim): a query's answer can depend on the other queries of its batch (tblastx
    found a subject for a query searched with its batch that it missed for the query alone).

    With `traceback_once` a piece's regeneration is the only traceback of its queries, against the union
    of their whole preliminary lists: pieces are as small as BLAST+'s batches allow (one batch each), so
    that union stays small."""
    if traceback_once and blast_batches and piece_queries is None:
        piece_queries = 1  # each cut moves forward to the next BLAST+ batch: one piece per batch
    plan = _make_plan(
        program,
        query_lengths,
        fragment_residues,
        workers,
        hitlist_size,
        startup_seconds,
        stitchable,
        batch,
        piece_queries,
        query_segmentation,
        keep_alignments,
    )
    if not blast_batches:
        return Plan(
            plan.batches,
            plan.n_fragments,
            plan.pieces,
            plan.hitlist_size,
            plan.query_segmentation,
            search_filled_again,
            traceback_once and not plan.query_segmentation,
        )
    if plan.query_segmentation and stitchable and batch is None:
        smallest = smallest_piece_residues(
            program, sum(fragment_residues), startup_seconds, sum(query_lengths), workers
        )
        pieces = decreasing_batches(query_lengths, blast_batches, workers, smallest)
    else:
        pieces = aligned(plan.pieces, blast_batches)
    batches = pieces if plan.query_segmentation else aligned(plan.batches, blast_batches)
    return Plan(
        batches,
        plan.n_fragments,
        pieces,
        plan.hitlist_size,
        plan.query_segmentation,
        search_filled_again,
        traceback_once and not plan.query_segmentation,
    )


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What a job's plan is made from (every rank makes the same plan from them, for its own number of
    workers): the job's queries and fragments in residues, and the choices `prepare_job` made."""

    program: str
    query_lengths: list[int]
    fragment_residues: list[int]
    hitlist_size: int
    startup_seconds: float  # a BLAST+ start, measured on this machine (paramedic.blast.tools)
    stitchable: bool  # the report's pieces can be joined (paramedic.output.stitch)
    batch: int | None  # --batch
    piece_queries: int | None  # --regen-batch
    query_segmentation: bool
    keep_alignments: bool
    # pieces cut at BLAST+'s own query batches where it fixes them (paramedic.blast.prelim)
    blast_batches: list[range]
    search_filled_again: bool
    traceback_once: bool
    # consecutive fragments searched together in one BLAST+ run (--fragment-groups)
    group_fragments: bool

    def plan(self, workers: int, one_machine: bool = False) -> Plan:
        """The plan for `workers` (`one_machine`: worker threads of one process, equal workers)."""
        plan = make_plan(
            program=self.program,
            query_lengths=self.query_lengths,
            fragment_residues=self.fragment_residues,
            workers=workers,
            hitlist_size=self.hitlist_size,
            startup_seconds=self.startup_seconds,
            stitchable=self.stitchable,
            batch=self.batch,
            piece_queries=self.piece_queries,
            query_segmentation=self.query_segmentation,
            keep_alignments=self.keep_alignments,
            blast_batches=self.blast_batches,
            search_filled_again=self.search_filled_again,
            traceback_once=self.traceback_once,
        )
        if not self.group_fragments:
            return plan
        even = (
            one_machine
            and len(plan.batches) == 1
            and one_search_per_worker(
                self.program,
                sum(self.query_lengths),
                sum(self.fragment_residues),
                workers,
                self.startup_seconds,
            )
        )
        return grouped(plan, self.fragment_residues, workers, even)


def grouped(plan: Plan, fragment_residues: Sequence[int], workers: int, even: bool = False) -> Plan:
    """`plan` with consecutive fragments searched together (`fragment_groups`; the whole database fits in
    each worker's memory), as few searches as keep the workers busy (`search_units`; `even`: one search
    per worker and batch)."""
    if plan.query_segmentation:
        return plan
    groups = fragment_groups(
        fragment_residues, search_units(len(fragment_residues), len(plan.batches), workers, even)
    )
    if len(groups) == plan.n_fragments:
        return plan
    return dataclasses.replace(plan, n_fragments=len(groups), groups=groups)


def search_units(fragments: int, batches: int, workers: int, even: bool = False) -> int:
    """How many searches a batch's fragments are grouped into: enough that every worker has a search of
    every batch, never more than the fragments. Each search pays a BLAST+ start and the lookup table of
    its batch's queries (0.2 s for 12 proteins; megablast's is 64 MB); a fragment searched alone pays
    them once per fragment. Over the job, twice as many searches as workers, so a slow worker's share
    moves to the others; `even` (`one_search_per_worker`): one search per worker and batch."""
    spread = workers if even else math.ceil(2 * workers / max(1, batches))
    return max(1, min(fragments, max(workers, spread)))


def one_search_per_worker(
    program: str, batch_residues: int, database_residues: int, workers: int, startup_seconds: float
) -> bool:
    """Whether worker threads of one machine (equal workers) search a batch in one search each rather
    than two: when a search's start would be over STARTUP_SHARE of the smaller search (RATE). Measured,
    two threads, one batch, medians (bench/RESULTS.md): blastn 20 queries against 306 Mbp, whose
    searches are short and each builds megablast's 64 MB table, 0.705 s in 2 searches against 0.745 s
    in 4; blastp 1 query against 178 M residues, 2.5 s searches, 2.96 s against 2.89 s (the halves'
    own speeds differ by up to 0.25 s on this machine, which 4 searches even out)."""
    smaller = _seconds_per_query_residue(program, database_residues) * batch_residues / (2 * workers)
    return startup_seconds > STARTUP_SHARE * smaller


def fragment_groups(fragment_residues: Sequence[int], units: int) -> tuple[tuple[int, ...], ...]:
    """`units` groups of consecutive fragments, each cut at the fragment boundary nearest its even share
    of the residues. (Cutting only once the share was reached gave 3, 1, 2 and 2 fragments for 8
    fragments in 4 groups whenever the first fragments were a few residues short of an eighth: a
    worker then searched 5 of the 8 while the other waited.)"""
    n = len(fragment_residues)
    units = max(1, min(units, n))
    total = sum(fragment_residues)
    ends = list(itertools.accumulate(fragment_residues))  # residues up to and including each fragment
    cuts = [0]
    for k in range(1, units):
        target = total * k / units
        # a cut after fragment i - 1 (i fragments before it), leaving a fragment for each later group
        choices = range(cuts[-1] + 1, n - (units - k) + 1)
        cuts.append(min(choices, key=lambda i: (abs(ends[i - 1] - target), i)))
    cuts.append(n)
    return tuple(tuple(range(a, b)) for a, b in zip(cuts, cuts[1:], strict=False) if b > a)


def aligned(pieces: Sequence[range], blast_batches: Sequence[range]) -> tuple[range, ...]:
    """`pieces` with each cut moved forward to the next start of a BLAST+ batch (pieces may merge)."""
    n = pieces[-1].stop
    starts = sorted({b.start for b in blast_batches if 0 < b.start < n} | {n})
    cuts: list[int] = []
    for piece in pieces:
        stop = starts[bisect.bisect_left(starts, piece.stop)]
        if not cuts or stop > cuts[-1]:
            cuts.append(stop)
    return tuple(range(a, b) for a, b in zip([0, *cuts], cuts, strict=False))


def _make_plan(
    program: str,
    query_lengths: Sequence[int],
    fragment_residues: Sequence[int],
    workers: int,
    hitlist_size: int,
    startup_seconds: float,
    stitchable: bool,
    batch: int | None,
    piece_queries: int | None,
    query_segmentation: bool,
    keep_alignments: bool,
) -> Plan:
    n = len(query_lengths)
    pieces: tuple[range, ...]
    if query_segmentation:
        # Query segmentation: a piece is one search of the whole database, writing its own report.
        whole = sum(fragment_residues)
        if not stitchable:
            pieces = (range(0, n),)
        elif batch:
            pieces = _split(range(0, n), batch)
        else:
            smallest = smallest_piece_residues(program, whole, startup_seconds, sum(query_lengths), workers)
            pieces = decreasing_pieces(query_lengths, workers, smallest)
        return Plan(pieces, 1, pieces, hitlist_size, query_segmentation=True)
    if keep_alignments and batch is None:
        # BLAST+ scans a fragment once per batch, so larger batches cost less search (500 queries, 4
        # fragments, 2 workers: batches of 14, 63, 125 took 106.4, 101.2, 100.0 s of search); batches
        # shrink as for query segmentation so the last fragment searches are short; each batch's reports
        # are written in two groups (from archives a group costs the same per query however large, and
        # two keep the last batch's reports on two workers). With metadata shipped instead, small
        # batches keep it flowing early, so only here are batches this large.
        mean_fragment = sum(fragment_residues) / len(fragment_residues)
        smallest = smallest_piece_residues(
            program, mean_fragment, startup_seconds, sum(query_lengths), workers
        )
        batches = decreasing_pieces(query_lengths, workers, smallest)
        if not stitchable:
            pieces = (range(0, n),)
        else:
            pieces = tuple(
                group for b in batches for group in _split(b, piece_queries or math.ceil(len(b) / 2))
            )
        return Plan(batches, len(fragment_residues), pieces, hitlist_size)
    if batch is None:
        batch = search_batch_size(program, query_lengths, fragment_residues, workers, startup_seconds)
    batch = max(1, min(batch, n))
    group = max(1, piece_queries or (math.ceil(batch / 2) if keep_alignments else DEFAULT_REGEN_GROUP))
    if stitchable:
        group = min(group, batch)
        batch = math.ceil(batch / group) * group  # whole groups per batch
    batches = _split(range(0, n), batch)
    pieces = _split(range(0, n), group) if stitchable else (range(0, n),)
    return Plan(batches, len(fragment_residues), pieces, hitlist_size)


def _split(queries: range, size: int) -> tuple[range, ...]:
    """Consecutive ranges of `size` queries (the last may be shorter)."""
    return tuple(range(s, min(queries.stop, s + size)) for s in range(queries.start, queries.stop, size))


def smallest_piece_residues(
    program: str,
    database_residues: float,
    startup_seconds: float,
    total: int | None = None,
    workers: int = 1,
) -> int:
    """Query residues of the smallest search of `database_residues` whose fixed cost (BLAST+ start-up and
    the program's per-search scan, `task_seconds`) is <= 5%.

    Given the `total` query residues, never more than an even share of them per worker, unless that
    share's own work would cost less than its fixed cost: the fixed cost is then paid on every worker at
    once, which costs less wall than the whole work on one. blastn's scan made the 5% rule ask for one
    piece of 500 queries against 306 Mbp (measured: 2 pieces 5.65 s of CPU against one run's 4.49 s, and
    half the wall); 20 queries' share costs less than its scan, so they stay one piece (the
    fragments strategy splits the database instead)."""
    per_residue = _seconds_per_query_residue(program, database_residues)
    if per_residue <= 0:
        return 1
    fixed = task_seconds(program, database_residues, startup_seconds)
    smallest = math.ceil(fixed / (STARTUP_SHARE * per_residue))
    if total is None:
        return smallest
    return min(smallest, max(math.ceil(total / max(1, workers)), math.ceil(fixed / per_residue)))


def task_seconds(program: str, database_residues: float, startup_seconds: float) -> float:
    """What one search of `database_residues` costs however few its queries: BLAST+'s start (measured at
    the job's start) and the program's scan of the database (SCAN)."""
    return startup_seconds + SCAN.get(program, 0.0) * database_residues


def _seconds_per_query_residue(program: str, database_residues: float) -> float:
    """Estimated single-thread search time per query residue against `database_residues` (RATE)."""
    return RATE.get(program, RATE["blastp"]) * database_residues


def decreasing_pieces(
    query_lengths: Sequence[int], workers: int, smallest: int, share: float = ROUND_SHARE
) -> tuple[range, ...]:
    """Consecutive query ranges of decreasing size ("factoring"), handed out in order.

    Each round cuts `workers` pieces of `share` of the remaining residues between them, down to `smallest`:
    the first pieces are large (few BLAST+ runs), the last small, so when one worker takes its last piece
    the others are not left idle for long. Cost is estimated by residues; a wrong estimate on an early
    piece is absorbed by the smaller ones after it. 500 mmseqs2 queries on 2 workers in 25-query pieces
    took 52.3 s on one worker and 49.3 s on the other (the last piece was a slow one).
    """
    n = len(query_lengths)
    workers = max(1, workers)
    remaining = sum(query_lengths)
    pieces: list[range] = []
    start = 0
    while start < n:
        target = max(smallest, remaining * share / workers)
        for _ in range(workers):
            if start >= n:
                break
            stop, size = start + 1, query_lengths[start]
            # take the next query while that brings the piece closer to its target
            while stop < n and size + query_lengths[stop] / 2 <= target:
                size += query_lengths[stop]
                stop += 1
            if remaining - size < smallest / 2:  # a sliver left over joins this piece
                stop, size = n, remaining
            pieces.append(range(start, stop))
            start, remaining = stop, remaining - size
    return tuple(pieces)


def decreasing_batches(
    query_lengths: Sequence[int],
    blast_batches: Sequence[range],
    workers: int,
    smallest: int,
    share: float = BATCH_ROUND_SHARE,
) -> tuple[range, ...]:
    """`decreasing_pieces` with BLAST+'s query batches as the items: each piece is whole batches, cut
    where BLAST+ starts one (cutting by queries and moving each cut to the next batch start merged the
    last small pieces into larger ones)."""
    residues = [sum(query_lengths[b.start : b.stop]) for b in blast_batches]
    groups = decreasing_pieces(residues, workers, smallest, share)
    return tuple(range(blast_batches[g.start].start, blast_batches[g.stop - 1].stop) for g in groups)


def search_batch_size(
    program: str,
    query_lengths: Sequence[int],
    fragment_residues: Sequence[int],
    workers: int,
    startup_seconds: float,
) -> int:
    """Smallest batch whose estimated task time makes start-up <= 5%, capped so work spreads out."""
    n = len(query_lengths)
    mean_query = sum(query_lengths) / n
    mean_fragment = sum(fragment_residues) / len(fragment_residues)
    per_query = _seconds_per_query_residue(program, mean_fragment) * mean_query
    fixed = task_seconds(program, mean_fragment, startup_seconds)
    wanted = math.ceil(fixed / (STARTUP_SHARE * per_query)) if per_query > 0 else n
    # At least ~4 tasks per worker so the last tasks do not leave workers idle for long.
    tasks_per_batch = len(fragment_residues)
    cap = max(1, math.ceil(n * tasks_per_batch / (4 * max(1, workers))))
    return max(1, min(wanted, cap, n))
