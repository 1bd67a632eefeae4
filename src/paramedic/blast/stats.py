"""Per-query statistics for a report that `blast_formatter` wrote from an archive.

An archive keeps one set of Karlin-Altschul parameters and one effective search space per request, so
`blast_formatter` prints the first query's values under every query (and the text reports lose the
a/alpha/sigma columns). Everything else in the report comes from the alignments and the database and
is exact. A search of the same queries with the same options against an empty mask finds nothing,
costs only the queries' set-up, and prints each query's own statistics; `splice_stats` moves them
into the formatted report, block by block.

Each format's statistics block, one per query in both reports:

* pairwise and query-anchored text reports (0-4): from the `Lambda` line to `Effective search space used`;
* XML (5): `<Iteration_stat>`; JSON (15): `"stat"`; XML2 (16): `<stat>`;
* tabular (6, 7, 10): none.

Both reports must have exactly one block per query, or ValueError is raised (the caller then falls back
to regenerating by search). Formats not listed here are not written from archives at all.
"""

from __future__ import annotations

import re

_BLOCKS: dict[int, re.Pattern[bytes] | None] = {
    **dict.fromkeys(
        (0, 1, 2, 3, 4), re.compile(rb"^Lambda .*?^Effective search space used: \d+\n", re.M | re.S)
    ),
    5: re.compile(rb"^  <Iteration_stat>\n.*?^  </Iteration_stat>\n", re.M | re.S),
    15: re.compile(rb'^          "stat": \{\n.*?^          \}', re.M | re.S),  # then "," or not
    16: re.compile(rb"^              <stat>\n.*?^              </stat>\n", re.M | re.S),
    6: None,
    7: None,
    10: None,
}

ARCHIVE_FORMATS = frozenset(_BLOCKS)


def has_stats(outfmt: int) -> bool:
    """Whether reports in this format print per-query statistics (tabular ones do not)."""
    return _BLOCKS.get(outfmt) is not None


def splice_stats(outfmt: int, formatted: bytes, empty_search: bytes, n_queries: int) -> bytes:
    """`formatted` with each query's statistics block replaced by the one in `empty_search`."""
    pattern = _BLOCKS[outfmt]
    if pattern is None:
        return formatted
    wrong = list(pattern.finditer(formatted))
    right = list(pattern.finditer(empty_search))
    if len(wrong) != n_queries or len(right) != n_queries:
        raise ValueError(
            f"outfmt {outfmt}: {len(wrong)} and {len(right)} statistics blocks for {n_queries} queries"
        )
    out: list[bytes] = []
    position = 0
    for old, new in zip(wrong, right, strict=True):
        out.append(formatted[position : old.start()])
        out.append(new.group(0))
        position = old.end()
    out.append(formatted[position:])
    return b"".join(out)
