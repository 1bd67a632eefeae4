"""Merging per-fragment hit lists into what one BLAST+ run over the whole database would keep.

A fragment search is BLAST+ on less data, and BLAST+ is not a filter: its preliminary stage keeps at most
N candidates per query, and its composition-based traceback skips subjects once every query of a batch
has filled its hit list (docs/DESIGN.md, "Preliminary list"). `merge_query` therefore works from
each fragment's preliminary list too (paramedic.blast.prelim): the whole database's list is the top N of
their union, and the fragments' hits restricted to it are the whole database's hits whenever no hit list
can have filled (no fragment reached `hitlist_size`, fewer than `hitlist_size` hits kept). Otherwise the
query is not `exact` and its report is written by searching again against its whole preliminary list,
which reproduces BLAST+'s own traceback, skips included (the search runs BLAST+'s own query batch).

BLAST+ ranks subjects by best e-value ascending (s_EvalueComp: exact, or both below 1e-180), then by the
raw score of the first HSP descending, then by ordinal id descending; the merge applies the same rule to
the keys read at full precision (the archive's 15 significant digits; sum statistics make e-values of
equal alignments differ from the eighth digit on, with the subject's length) and keeps the first `hitlist_size` (-max_target_seqs). The result, the ordered global
ids of a query's subjects, is that query's metadata.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from paramedic.blast.hits import Candidate, Hit, PrelimList
from paramedic.errors import BlastError

TINY_EVALUE = 1.0e-180  # s_EvalueComp: two e-values below this are equal


def blast_order(a: Hit, b: Hit) -> int:
    """Comparator: negative when `a` ranks before `b` in BLAST+'s own order."""
    if not _evalues_equal(a.evalue, b.evalue):
        return -1 if a.evalue < b.evalue else 1
    if a.score != b.score:
        return -1 if a.score > b.score else 1
    return (a.gid < b.gid) - (a.gid > b.gid)  # higher ordinal id first


def _evalues_equal(x: float, y: float) -> bool:
    return x == y or (x < TINY_EVALUE and y < TINY_EVALUE)


def merge_hits(per_fragment: Iterable[list[Hit]], hitlist_size: int) -> list[Hit]:
    """Top `hitlist_size` hits of one query over all fragments, in BLAST+ order."""
    hits = [hit for fragment in per_fragment for hit in fragment]
    hits.sort(key=functools.cmp_to_key(blast_order))
    return hits[:hitlist_size]


@dataclass(frozen=True)
class MergedQuery:
    """One query's merge: its hits when `exact`, and the subjects a regeneration searches against
    (the metadata): the hits themselves, or the whole preliminary list when the hits alone would let a
    regeneration rank other candidates than BLAST+ kept."""

    hits: list[Hit]
    subjects: list[int]
    exact: bool


def merge_query(
    hits: Sequence[list[Hit]],
    prelims: Sequence[PrelimList | None],
    hitlist_size: int,
    search_filled_again: bool = True,
) -> MergedQuery:
    """Merge one query's per-fragment hits and preliminary lists (same fragment order in both).

    `search_filled_again`: a filled hit list is searched again against the whole list, because which
    subjects BLAST+ keeps then depends on what the hits do not show: the traceback may skip subjects once
    hit lists are full (composition-based statistics), or rank subjects by HSPs a filter then removed
    (-qcov_hsp_perc). Otherwise every listed subject is aligned and ranked on its own, so the fragments'
    hits on the whole list are the whole database's, filled or not."""
    for fragment_hits, prelim in zip(hits, prelims, strict=True):
        listed = {c.gid for c in prelim.candidates} if prelim else set()
        if any(h.gid not in listed for h in fragment_hits):
            raise BlastError("a fragment reported a hit outside its preliminary list: unexpected BLAST+")
    whole = whole_list(prelims)
    if whole is None:
        return MergedQuery([], [], exact=True)
    allowed = {c.gid for c in whole.candidates}
    kept = [h for fragment_hits in hits for h in fragment_hits if h.gid in allowed]
    merged = merge_hits([kept], hitlist_size)
    filled = any(len(f) >= hitlist_size for f in hits) or len(kept) >= hitlist_size
    filled = filled and search_filled_again
    saturated = sum(len(p.candidates) for p in prelims if p) > whole.limit
    subjects = [c.gid for c in whole.candidates] if filled or saturated else [h.gid for h in merged]
    return MergedQuery(merged, subjects, exact=not filled)


def whole_list(per_fragment: Sequence[PrelimList | None]) -> PrelimList | None:
    """The whole database's preliminary list: the top N of the union of the fragments' lists."""
    lists = [p for p in per_fragment if p is not None]
    if not lists:
        return None
    limit = lists[0].limit
    if any(p.limit != limit for p in lists):
        raise BlastError("fragment searches disagree on BLAST+'s preliminary list size")
    union = sorted((c for p in lists for c in p.candidates), key=Candidate.key)
    return PrelimList(limit, tuple(union[:limit]))


def whole_subjects(per_fragment: Sequence[PrelimList | None]) -> list[int]:
    """A query's subjects when fragments stop after the preliminary stage: the whole database's list in
    BLAST+'s preliminary order. A search against exactly these aligns what one BLAST+ run over the whole
    database aligns, and in the same order, so its report is that run's (docs/DESIGN.md, "Preliminary
    list")."""
    whole = whole_list(per_fragment)
    return [] if whole is None else [c.gid for c in whole.candidates]
