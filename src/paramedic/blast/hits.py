"""A subject's merge key for one query, read from a fragment search (see paramedic.blast.archive).

The merge needs, per query and subject, the best e-value at full precision and the raw score of the first
HSP. Tabular output prints e-values too coarsely for blastp (composition-based statistics give different
real e-values the same printed value), so fragment searches write archives, whose e-values are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Fragment databases name each sequence `lcl|g<global ordinal id>`; BLAST+ reports it as a local id.
FRAGMENT_ID_PREFIX = "g"


@dataclass(frozen=True, slots=True)
class Hit:
    """One subject's merge key for one query, and optionally its alignments (archive text)."""

    evalue: float
    score: int
    gid: int
    alignment: bytes = field(default=b"", compare=False, repr=False)
