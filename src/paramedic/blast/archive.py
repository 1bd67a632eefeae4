"""BLAST archives (outfmt 11): alignments out of fragment searches, and back into a report.

A fragment search writes its results as an archive: the request (queries, options) and every alignment
as text ASN.1 Seq-aligns. The merge keys are read from the alignments at full precision (`score`, and
`e_value` as an exact decimal mantissa and exponent), and each subject's Seq-aligns are kept, so that
the report can later be written by `blast_formatter` from the merged alignments instead of by searching
again: the alignments are the search's own, so nothing is re-aligned.

Only the layout that BLAST+ itself writes is accepted: the alignment list of the results section, one
Seq-align per HSP at a fixed indentation, a subject's HSPs consecutive. Anything else raises ValueError.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from paramedic.blast.hits import FRAGMENT_ID_PREFIX, Hit

_RESULTS = b"\n  results {\n    alignments {\n"
_RESULTS_END = b"\n    }"  # the line that closes the alignment list (4 spaces; Seq-aligns are deeper)
_ALIGN_OPEN = b"      {\n"
_ALIGN_CLOSE = b"\n      }"
_ALIGN_SEPARATOR = _ALIGN_CLOSE + b",\n" + _ALIGN_OPEN

_QUERY_ID = re.compile(rb'local str "Query_(\d+)"')
_SUBJECT_ID = re.compile(rb'local str "' + FRAGMENT_ID_PREFIX.encode() + rb'(\d+)"')
# A database in place made without -parse_seqids names each subject by its ordinal id in the search
_ORDINAL_ID = re.compile(rb'db "BL_ORD_ID",\s+tag id (\d+)')
_SCORE = re.compile(rb'id str "score",\s+value int (-?\d+)')
# Linked HSPs (sum statistics: tblastn, tblastx, some blastx) carry their set's e-value as "sum_e".
_EVALUE = re.compile(rb'id str "(?:e_value|sum_e)",\s+value real (?:\{ (-?\d+), 10, (-?\d+) \}|(0))')


def _alignment_list(data: bytes, at: int = 0) -> tuple[int, int] | None:
    """Start and end offsets of the Seq-aligns in the first results section from `at` (None: none)."""
    start = data.find(_RESULTS, at)
    if start < 0:
        return None
    start += len(_RESULTS)
    end = data.find(_RESULTS_END, start - 1)
    if end < 0:
        raise ValueError("BLAST archive: unterminated alignment list")
    return start, max(start, end)


def _seq_aligns(data: bytes) -> list[bytes]:
    """The Seq-aligns of every request's results, each with its braces, in the archive's order.

    BLAST+ splits a long query list into several requests (one `Blast4-archive` each); query ids
    (`Query_<n>`) count on across them.
    """
    if not data.startswith(b"Blast4-archive ::= {"):
        raise ValueError("not a BLAST archive")
    aligns: list[bytes] = []
    at = 0
    while (found := _alignment_list(data, at)) is not None:
        start, end = found
        at = end
        body = data[start:end]
        if not body:
            continue
        if not body.startswith(_ALIGN_OPEN) or not body.endswith(_ALIGN_CLOSE):
            raise ValueError("BLAST archive: unexpected alignment layout")
        inner = body[len(_ALIGN_OPEN) : -len(_ALIGN_CLOSE)].split(_ALIGN_SEPARATOR)
        aligns.extend(_ALIGN_OPEN + block + _ALIGN_CLOSE for block in inner)
    return aligns


def _evalue(block: bytes) -> float:
    values = [float(b"0" if zero else b"%se%s" % (m, e)) for m, e, zero in _EVALUE.findall(block)]
    if not values:
        raise ValueError("BLAST archive: an alignment without an e-value")
    return min(values)


def seq_aligns(data: bytes) -> list[bytes]:
    """The archive's Seq-aligns (one per HSP), each with its braces."""
    return _seq_aligns(data)


def parse_fragment_archive(
    data: bytes,
    n_queries: int,
    keep_alignments: bool = True,
    ordinal_offset: int | None = None,
    subject: Callable[[bytes], int] | None = None,
) -> list[list[Hit]]:
    """Hits per query (in batch order) from the archive of one fragment search.

    With `keep_alignments`, each hit carries its subject's Seq-aligns (for `fill_archive`). With
    `ordinal_offset` (a database in place), subjects are named by their ordinal id in the search
    (BL_ORD_ID), the global id being the offset plus it (the kept alignments are given the global id, as
    a search of the whole database names them); with `subject`, by their own ids, which it maps to global
    ids (paramedic.blast.seqid), and which the kept alignments keep; else by `lcl|g<global id>`.
    """
    subject_id = _SUBJECT_ID if ordinal_offset is None else _ORDINAL_ID
    offset = ordinal_offset or 0
    per_query: list[list[Hit]] = [[] for _ in range(n_queries)]
    current: tuple[int, int] | None = None
    seen: set[tuple[int, int]] = set()
    blocks: list[bytes] = []
    best = float("inf")
    score = 0

    def close() -> None:
        if current is not None:
            alignment = b",\n".join(blocks) if keep_alignments else b""
            per_query[current[0]].append(Hit(best, score, current[1], alignment))

    for block in _seq_aligns(data):
        query_match = _QUERY_ID.search(block)
        subject_match = subject_id.search(block) if subject is None else None
        score_match = _SCORE.search(block)
        if query_match is None or (subject is None and subject_match is None) or score_match is None:
            raise ValueError("BLAST archive: an alignment without query, subject or score")
        gid = subject(block) if subject is not None else offset + int(subject_match.group(1))  # type: ignore[union-attr]
        if keep_alignments and subject is None and ordinal_offset:  # the report names the whole database's id
            assert subject_match is not None
            block = block[: subject_match.start(1)] + b"%d" % gid + block[subject_match.end(1) :]
        key = (int(query_match.group(1)) - 1, gid)
        if not 0 <= key[0] < n_queries:
            raise ValueError(f"fragment search reported query {key[0] + 1} of {n_queries}")
        if key != current:
            if key in seen:
                raise ValueError("BLAST archive: a subject's alignments are not consecutive")
            close()
            seen.add(key)
            current, blocks = key, []
            best, score = float("inf"), int(score_match.group(1))
        blocks.append(block)
        best = min(best, _evalue(block))
    close()
    return per_query


def fill_archive(
    skeleton: bytes, alignments: Sequence[Sequence[bytes]], seqid: Callable[[int], bytes]
) -> bytes:
    """An archive with the request of `skeleton` (a search that found nothing) and the given alignments.

    `alignments[i]` are the Seq-aligns of the i-th query of the skeleton's request, one entry per
    subject in report order, as kept by `parse_fragment_archive`. Their query ids are renumbered to the
    request's positions, and fragment subject ids (`lcl|g<gid>`) become the database's own Seq-ids.
    """
    found = _alignment_list(skeleton)
    if found is None or skeleton.count(b"Blast4-archive ::= {") != 1:
        raise ValueError("the skeleton is not one BLAST archive request with results")
    start, end = found
    if start != end:
        raise ValueError("the skeleton archive already holds alignments")
    pieces: list[bytes] = []

    def subject(match: re.Match[bytes]) -> bytes:
        return seqid(int(match.group(1)))

    for position, subjects in enumerate(alignments, start=1):
        query_id = b'local str "Query_%d"' % position
        for text in subjects:
            pieces.append(_SUBJECT_ID.sub(subject, _QUERY_ID.sub(query_id, text)))
    if not pieces:
        return skeleton
    return skeleton[:start] + b",\n".join(pieces) + b"\n" + skeleton[start:]
