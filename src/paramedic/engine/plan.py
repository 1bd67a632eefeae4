"""Sizing the work: query batches for the search, query groups for regeneration.

Search batches are made large enough that BLAST+ process start-up (measured at job start) stays under 5%
of a task's time, estimated from query and fragment residues with a per-program rate calibrated on this
machine kind; and small enough that every worker gets several tasks. Regeneration groups are small: the
cost of a regeneration run is start-up plus (queries x union of their subjects), and measured on the
mmseqs2 data a group of about 10 queries minimised it (batch 1: 7.6 s, 5: 4.5 s, 10: 4.3 s, 25: 5.0 s,
100: 7.6 s for 100 queries). Reports written from the search's own alignments (`archive_render`) cost
the same per query however queries are grouped, so there a group is half a search batch: few runs.
Formats whose pieces cannot be stitched are regenerated as one piece.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from paramedic.engine.scheduler import Plan

STARTUP_SHARE = 0.05
# Seconds per (query residue x database residue), single thread, BLAST+ 2.12 (blastp measured: 100
# mmseqs2 queries, 38,939 residues, against 9,055,569 residues in 18.8 s). blastn is far cheaper per
# residue pair: its word size is 11-28, so scans are sparser.
RATE = {"blastp": 5.3e-11, "blastx": 1.6e-10, "tblastn": 1.6e-10, "tblastx": 5e-10, "blastn": 2e-13}
DEFAULT_REGEN_GROUP = 10


def make_plan(
    program: str,
    query_lengths: Sequence[int],
    fragment_residues: Sequence[int],
    workers: int,
    hitlist_size: int,
    startup_seconds: float,
    stitchable: bool,
    batch: int | None = None,
    regen_group: int | None = None,
    direct: bool = False,
    archive_render: bool = False,
) -> Plan:
    n = len(query_lengths)
    if direct:
        # Query segmentation: a piece is one search of the whole database. BLAST+ gets cheaper per query
        # as its query batch grows (500 mmseqs2 queries on 2 workers: batches of 9, 63 and 125 took 64.8,
        # 59.0 and 55.5 s), so pieces are as large as two per worker allow, and never below the start-up rule.
        whole = [sum(fragment_residues)]
        wanted = search_batch_size(program, query_lengths, whole, workers, startup_seconds)
        size = batch or max(wanted, math.ceil(n / (2 * max(1, workers))))
        size = size if stitchable else n
        pieces = tuple(range(s, min(n, s + size)) for s in range(0, n, size))
        return Plan(pieces, 1, pieces, hitlist_size, direct=True)
    if batch is None:
        batch = search_batch_size(program, query_lengths, fragment_residues, workers, startup_seconds)
        if archive_render:
            # BLAST+ scans a fragment once per batch, so larger batches cost less search (500 queries, 4
            # fragments, 2 workers: batches of 14, 63, 125 took 106.4, 101.2, 100.0 s of search); with
            # metadata shipped instead, small batches keep it flowing early, so only here are batches
            # as large as two per worker allow.
            batch = max(batch, math.ceil(n / (2 * max(1, workers))))
    batch = max(1, min(batch, n))
    # From archives a group costs the same per query however large; half a batch keeps the last batch's
    # reports on two workers instead of one.
    group = max(1, regen_group or (math.ceil(batch / 2) if archive_render else DEFAULT_REGEN_GROUP))
    if stitchable:
        group = min(group, batch)
        batch = math.ceil(batch / group) * group  # whole groups per batch
    batches = tuple(range(s, min(n, s + batch)) for s in range(0, n, batch))
    pieces = tuple(range(s, min(n, s + group)) for s in range(0, n, group)) if stitchable else (range(0, n),)
    return Plan(batches, len(fragment_residues), pieces, hitlist_size)


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
    per_query = RATE.get(program, RATE["blastp"]) * mean_query * mean_fragment
    wanted = math.ceil(startup_seconds / (STARTUP_SHARE * per_query)) if per_query > 0 else n
    # At least ~4 tasks per worker so the last tasks do not leave workers idle for long.
    tasks_per_batch = len(fragment_residues)
    cap = max(1, math.ceil(n * tasks_per_batch / (4 * max(1, workers))))
    return max(1, min(wanted, cap, n))
