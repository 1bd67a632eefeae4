"""Reading merge keys from a fragment search.

The merge needs, per query and subject, the best e-value at full precision and the raw score of the first
HSP. Tabular output prints e-values too coarsely for blastp (composition-based statistics give different
real e-values the same printed value), so fragment searches write XML (outfmt 5). The XML is scanned line
by line instead of parsed into a tree: a fragment's XML holds every alignment and can be large, and only
four elements per hit are needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Fragment databases name each sequence `lcl|g<global ordinal id>`; BLAST+ reports it as the accession.
FRAGMENT_ID_PREFIX = "g"


@dataclass(frozen=True, slots=True)
class Hit:
    """One subject's merge key for one query."""

    evalue: float
    score: int
    gid: int


def parse_fragment_xml(lines: Iterable[bytes], n_queries: int) -> list[list[Hit]]:
    """Hits per query (in batch order) from the outfmt 5 output of one fragment search."""
    per_query: list[list[Hit]] = [[] for _ in range(n_queries)]
    query = -1
    gid = -1
    score = -1
    best = float("inf")

    def close_hit() -> None:
        if gid >= 0:
            per_query[query].append(Hit(best, score, gid))

    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"<"):
            continue
        if line.startswith(b"<Iteration_iter-num>"):
            close_hit()
            gid = -1
            query = int(_text(line)) - 1
            if not 0 <= query < n_queries:
                raise ValueError(f"fragment search reported query {query + 1} of {n_queries}")
        elif line.startswith(b"<Hit_accession>"):
            close_hit()
            accession = _text(line)
            if not accession.startswith(FRAGMENT_ID_PREFIX):
                raise ValueError(f"unexpected subject id {accession!r} in a fragment search")
            gid = int(accession[len(FRAGMENT_ID_PREFIX) :])
            score = -1
            best = float("inf")
        elif line.startswith(b"<Hsp_score>"):
            if score < 0:
                score = int(float(_text(line)))
        elif line.startswith(b"<Hsp_evalue>"):
            best = min(best, float(_text(line)))
    close_hit()
    return per_query


def _text(line: bytes) -> str:
    return line[line.index(b">") + 1 : line.rindex(b"<")].decode()
