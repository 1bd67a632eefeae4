"""A subject's merge key for one query, read from a fragment search (see paramedic.blast.archive).

The merge needs, per query and subject, the best e-value at full precision and the raw score of the first
HSP. Tabular output prints e-values too coarsely for blastp (composition-based statistics give different
real e-values the same printed value), so fragment searches write archives, whose e-values are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# Fragment databases name each sequence `lcl|g<global ordinal id>`; BLAST+ reports it as a local id.
FRAGMENT_ID_PREFIX = "g"


@dataclass(frozen=True, slots=True)
class Hit:
    """One subject's merge key for one query, and optionally its alignments (archive text)."""

    evalue: float
    score: int
    gid: int
    alignment: bytes = field(default=b"", compare=False, repr=False)


TINY_EVALUE = 1.0e-180  # BLAST+'s s_EvalueComp: e-values below this compare equal


class Candidate(NamedTuple):
    """One subject of a query's preliminary list: BLAST+'s ranking key, with the global ordinal id. A
    named tuple: every search makes one per subject of every query's list (tens of thousands), and a
    frozen dataclass cost three times as much to make."""

    evalue: float
    score: int
    gid: int

    def key(self) -> tuple[float, int, int]:
        """Sort key of BLAST+'s preliminary heap (s_EvalueCompareHSPLists): best first."""
        return (0.0 if self.evalue < TINY_EVALUE else self.evalue, -self.score, -self.gid)


@dataclass(frozen=True, slots=True)
class PrelimList:
    """A query's preliminary list from one search: its candidates and BLAST+'s limit N."""

    limit: int
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class FragmentSearch:
    """What one fragment search tells the merge, per query of its batch."""

    hits: list[list[Hit]]  # merge keys (and alignments), in BLAST order
    prelim: list[PrelimList | None]  # BLAST+'s preliminary list (paramedic.blast.prelim)
    # the kept lists whole, for the pieces that align them (prelim.whole_lists): b"" when none was
    # kept; None when they were not asked for or cannot be written back
    lists: bytes | None = None
