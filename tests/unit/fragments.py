"""Fragment search results for scheduler tests: hits, and a preliminary list that holds exactly them."""

from __future__ import annotations

from paramedic.blast.hits import Candidate, FragmentSearch, Hit, PrelimList


def searched(hits: list[list[Hit]], limit: int = 1050) -> FragmentSearch:
    prelim = [
        PrelimList(limit, tuple(Candidate(h.evalue, h.score, h.gid) for h in q)) if q else None for q in hits
    ]
    return FragmentSearch(hits, prelim)
