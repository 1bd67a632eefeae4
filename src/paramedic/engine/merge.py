"""Merging per-fragment hit lists into what one BLAST+ run over the whole database would keep.

BLAST+ ranks subjects by best e-value ascending (equal within a relative 1e-6), then by the raw score of
the first HSP descending, then by ordinal id descending; the merge applies the same rule to the keys read
at full precision and keeps the first `hitlist_size` (-max_target_seqs). The result, the ordered global
ids of a query's subjects, is that query's metadata.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from paramedic.blast.hits import Hit

EVALUE_RELATIVE_TIE = 1e-6


def blast_order(a: Hit, b: Hit) -> int:
    """Comparator: negative when `a` ranks before `b` in BLAST+'s own order."""
    if not _evalues_equal(a.evalue, b.evalue):
        return -1 if a.evalue < b.evalue else 1
    if a.score != b.score:
        return -1 if a.score > b.score else 1
    return (a.gid < b.gid) - (a.gid > b.gid)  # higher ordinal id first


def _evalues_equal(x: float, y: float) -> bool:
    if x == y:
        return True
    return abs(x - y) <= EVALUE_RELATIVE_TIE * max(abs(x), abs(y))


def merge_hits(per_fragment: Iterable[list[Hit]], hitlist_size: int) -> list[Hit]:
    """Top `hitlist_size` hits of one query over all fragments, in BLAST+ order."""
    hits = [hit for fragment in per_fragment for hit in fragment]
    hits.sort(key=functools.cmp_to_key(blast_order))
    return hits[:hitlist_size]
