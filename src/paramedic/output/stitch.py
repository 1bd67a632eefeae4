"""Joining the outputs of consecutive query batches into the bytes of one BLAST+ run.

The engine regenerates a report in several BLAST+ runs, each over a consecutive batch of the queries, all
against the same database with the same options. Every run writes its own header and footer and numbers
its queries from 1, so the pieces cannot just be concatenated. This module knows, per output format, what
a run puts around its queries and what in a query's block depends on the query's position in the run, and
rewrites exactly that. Every format claimed by `can_stitch` was checked byte for byte against a single
BLAST+ 2.12 run (tests/integration/test_stitch.py); for any other format the engine regenerates the whole
report in one run instead.

What depends on a query's position (without -parse_deflines BLAST+ names every query `Query_<position>`
internally and prints the FASTA id only in deflines and tabular columns):

* XML (5): `<Iteration_iter-num>` and `<Iteration_query-ID>Query_N`; the header names the first query.
* JSON (15) and XML2 (16): the `query_id` / `<query-id>` of each report.
* XML, JSON and XML2: a warning BLAST+ writes into the query's message ("Query_N id: Could not
  calculate ungapped Karlin-Altschul parameters ..." for a query it cannot search) starts with `Query_N`.
* Query-anchored reports (1-4): the query's row label `Query_N`, and the label column is as wide as the
  longest label of the alignment plus two, so `Query_9` -> `Query_10` may widen every line of the block.
* Commented tabular (7): the closing `# BLAST processed N queries` line.
* Pairwise (0, also with -html) and tabular (6, 10): nothing. Tabular output prints the FASTA id; only a
  query without one would show `Query_N` there, and the FASTA reader refuses such queries.

With -parse_deflines the ids are the FASTA ids and are kept; which of the two cases a job is in is read
from the first piece that shows a query id, and the later pieces must agree (or the piece is refused).

Not stitchable: 8, 9, 11, 12 (one ASN.1/JSON Seq-annot or archive for the whole run), 13 and 14 (one file
per query, not stdout), 17 (SAM: the @SQ header lists every query with hits before any record, and @PG
holds the command line, which names the batch's query file) and 18 (the organism report concatenates
without taxonomy data, but could not be checked with real taxonomy names here).

Every piece is checked against the structure its format must have (header, one block per query, footer,
query count); anything unexpected raises ValueError instead of giving silently wrong output.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# Output format number -> how its pieces are joined.
_KINDS: dict[int, str] = {
    0: "report",
    1: "anchored",
    2: "anchored",
    3: "anchored",
    4: "anchored",
    5: "xml",
    6: "plain",
    7: "commented",
    10: "plain",
    15: "json",
    16: "xml2",
}

# A query's section in the text reports (0-4); -html writes the tag in bold.
_REPORT_QUERY = re.compile(rb"^(?:Query=|<b>Query=</b>)(?: |$)", re.M)
# The database summary that starts the footer of the text reports (0-4).
_REPORT_FOOTER = b"\n  Database: "
_XML_ITERATIONS = b"<BlastOutput_iterations>\n"
_XML_END = re.compile(rb"</BlastOutput_iterations>\n</BlastOutput>\n+\Z")
_XML_ITERATION = re.compile(rb"^<Iteration>\n", re.M)
_XML_ITER_NUM = re.compile(rb"^  <Iteration_iter-num>(\d+)</Iteration_iter-num>\n", re.M)
_XML_QUERY_ID = re.compile(rb"^  <Iteration_query-ID>([^<]*)</Iteration_query-ID>\n", re.M)
# Header lines of outfmt 5 that describe the run's first query.
_XML_FIRST_QUERY = re.compile(rb"^  <BlastOutput_query-(?:ID|def|len)>.*\n", re.M)
_JSON_START = b'{\n"BlastOutput2": [\n'
_JSON_END = b"]\n}\n"
_JSON_SEPARATOR = b",\n"
_JSON_REPORT = re.compile(rb'^\{\n    "report": \{\n', re.M)
_JSON_QUERY_ID = re.compile(rb'^          "query_id": "((?:[^"\\]|\\.)*)",\n', re.M)
_XML2_REPORT = re.compile(rb"^<BlastOutput2>\n", re.M)
_XML2_END = b"</BlastXML2>\n"
_XML2_SEPARATOR = b"\n"
_XML2_QUERY_ID = re.compile(rb"^              <query-id>([^<]*)</query-id>\n", re.M)
_COMMENT_QUERY = re.compile(rb"^# Query:", re.M)
_COMMENT_PROCESSED = re.compile(rb"# BLAST processed (\d+) queries\n\Z")
_COMMENT_PROGRAM = re.compile(rb"^# [A-Z]+ \S+\n", re.M)


def _format_number(outfmt: str) -> int | None:
    tokens = outfmt.split()
    if not tokens:
        return None
    try:
        return int(tokens[0])
    except ValueError:
        return None


def can_stitch(outfmt: str) -> bool:
    """True if batch outputs of this -outfmt can be joined into the bytes of one run (verified formats)."""
    return _format_number(outfmt) in _KINDS


class _QueryIds:
    """Decides whether query ids are BLAST+'s positional `Query_N` (renumbered) or FASTA ids (kept).

    Without -parse_deflines every id is `Query_<position in the run>`; with it they are the FASTA ids.
    The first piece that shows ids decides; a later piece that disagrees is refused rather than guessed.
    """

    def __init__(self) -> None:
        self.positional: bool | None = None

    def decide(self, found: list[tuple[int, bytes]], index: int) -> bool:
        """`found`: (1-based position in the piece, id as printed). Returns whether to renumber."""
        if not found:
            return bool(self.positional)
        matches = [ident == b"Query_%d" % pos for pos, ident in found]
        if all(matches):
            verdict = True
        elif not any(matches):
            verdict = False
        else:
            raise ValueError(
                f"piece {index}: some query ids are BLAST+'s positional Query_N and some are not; "
                "cannot tell how to renumber them"
            )
        if self.positional is None:
            self.positional = verdict
        elif self.positional != verdict:
            raise ValueError(
                f"piece {index}: query ids are {'positional Query_N' if verdict else 'FASTA ids'}, "
                "unlike the earlier pieces"
            )
        return verdict


class Stitcher:
    """Streams the outputs of consecutive query batches into the output of one BLAST+ run.

    Only the first piece's header, the footer and a few counters are kept, never the output itself.
    A job of one piece (how the engine regenerates formats `can_stitch` refuses) passes through as it is.
    """

    def __init__(self, outfmt: str, total_pieces: int):
        number = _format_number(outfmt)
        if total_pieces < 1:
            raise ValueError(f"total_pieces must be >= 1, got {total_pieces}")
        if number not in _KINDS and total_pieces > 1:
            raise ValueError(f"-outfmt {outfmt!r}: outputs of query batches cannot be stitched")
        self.outfmt = outfmt
        self.total_pieces = total_pieces
        # One piece is the whole run: its output is the report as it is, in any format.
        self._kind = "whole" if total_pieces == 1 or number is None else _KINDS[number]
        self._next_index = 0
        self._next_offset: int | None = 0  # None: this format cannot count its queries
        self._total_queries: int | None = None
        self._header: bytes | None = None  # first piece's header, to check that all runs agree
        self._footer: bytes | None = None
        self._ids = _QueryIds()

    def piece(self, index: int, data: bytes, query_offset: int, total_queries: int) -> bytes:
        """Return the bytes to append to the output for piece `index` (called in order 0,1,2,...,total_pieces-1).
        data = complete stdout of the BLAST run for that batch; query_offset = number of queries in all
        earlier pieces; total_queries = number of queries in the whole job."""
        self._check_call(index, query_offset, total_queries)
        first = index == 0
        last = index == self.total_pieces - 1
        joiner = getattr(self, f"_{self._kind}")
        out, count = joiner(
            index, data if isinstance(data, bytes) else bytes(data), query_offset, first, last
        )
        if count is None:
            self._next_offset = None
        else:
            if count < 1:
                raise ValueError(f"piece {index}: no query in the output of the batch")
            self._next_offset = query_offset + count
            if last and self._next_offset != total_queries:
                raise ValueError(
                    f"piece {index}: the pieces hold {self._next_offset} queries, the job has {total_queries}"
                )
            if self._next_offset > total_queries:
                raise ValueError(
                    f"piece {index}: {self._next_offset} queries so far, more than the job's {total_queries}"
                )
        self._next_index += 1
        return out

    def _check_call(self, index: int, query_offset: int, total_queries: int) -> None:
        if index != self._next_index:
            raise ValueError(f"piece {index} given, expected piece {self._next_index} (pieces come in order)")
        if index >= self.total_pieces:
            raise ValueError(f"piece {index} given, but the job has {self.total_pieces} pieces")
        if self._total_queries is None:
            if total_queries < 1:
                raise ValueError(f"total_queries must be >= 1, got {total_queries}")
            self._total_queries = total_queries
        elif total_queries != self._total_queries:
            raise ValueError(f"piece {index}: total_queries {total_queries}, earlier {self._total_queries}")
        if self._next_offset is not None and query_offset != self._next_offset:
            raise ValueError(
                f"piece {index}: query_offset {query_offset}, but the earlier pieces hold "
                f"{self._next_offset} queries"
            )
        if not 0 <= query_offset < total_queries:
            raise ValueError(f"piece {index}: query_offset {query_offset} outside 0..{total_queries - 1}")

    def _same(self, index: int, what: str, mine: bytes, slot: str) -> None:
        """Every run must write the same header/footer: a difference means different options or database."""
        kept = getattr(self, slot)
        if kept is None:
            setattr(self, slot, mine)
        elif mine != kept:
            raise ValueError(
                f"piece {index}: its {what} differs from the first piece's (other options or db?)"
            )

    # --- per format: each returns (bytes to write, number of queries in the piece or None) ---

    def _whole(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, None]:
        """A job regenerated in one run (any format, e.g. one can_stitch refuses): nothing to join."""
        return data, None

    def _plain(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, None]:
        """Tabular (6, 10): one line per hit, nothing per run; queries without hits print nothing."""
        if data and not data.endswith(b"\n"):
            raise ValueError(f"piece {index}: tabular output does not end with a newline (truncated?)")
        return data, None

    def _commented(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """Commented tabular (7): per-query comment blocks, then `# BLAST processed N queries`."""
        m = _COMMENT_PROCESSED.search(data)
        if m is None:
            raise ValueError(f"piece {index}: outfmt 7 output lacks its final '# BLAST processed' line")
        body = data[: m.start()]
        if body and not body.endswith(b"\n"):
            raise ValueError(f"piece {index}: unexpected text before '# BLAST processed'")
        count = int(m.group(1))
        seen = len(_COMMENT_QUERY.findall(body))
        blocks = _COMMENT_PROGRAM.findall(body)
        if seen != count or len(blocks) != count or not _COMMENT_PROGRAM.match(body):
            raise ValueError(
                f"piece {index}: '# BLAST processed {count} queries' but {seen} '# Query:' lines "
                f"and {len(blocks)} program lines"
            )
        out = body
        if last:
            out += b"# BLAST processed %d queries\n" % (offset + count)
        return out, count

    def _report(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """Pairwise text (0, also -html): run header, one section per query, database/parameter footer."""
        header, sections, footer = self._split_report(index, data)
        return self._join_report(index, header, sections, footer, first, last), len(sections)

    def _anchored(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """Query-anchored text (1-4): as 0, plus the query's row label `Query_N` in the alignment."""
        header, sections, footer = self._split_report(index, data)
        labels = [_anchored_label(section) for section in sections]
        found = [(pos, label) for pos, label in enumerate(labels, 1) if label is not None]
        if self._ids.decide(found, index) and offset:
            sections = [
                _relabel_anchored(index, section, b"Query_%d" % pos, b"Query_%d" % (pos + offset))
                if label is not None
                else section
                for pos, (section, label) in enumerate(zip(sections, labels, strict=True), 1)
            ]
        return self._join_report(index, header, sections, footer, first, last), len(sections)

    def _split_report(self, index: int, data: bytes) -> tuple[bytes, list[bytes], bytes]:
        starts = [m.start() for m in _REPORT_QUERY.finditer(data)]
        end = data.rfind(_REPORT_FOOTER) + 1
        if not starts or end <= starts[-1]:
            raise ValueError(
                f"piece {index}: not a BLAST+ text report (no 'Query=' section before the footer)"
            )
        header, footer = data[: starts[0]], data[end:]
        sections = [data[a:b] for a, b in zip(starts, starts[1:] + [end], strict=True)]
        return header, sections, footer

    def _join_report(
        self, index: int, header: bytes, sections: list[bytes], footer: bytes, first: bool, last: bool
    ) -> bytes:
        self._same(index, "header", header, "_header")
        self._same(index, "footer", footer, "_footer")
        return (header if first else b"") + b"".join(sections) + (footer if last else b"")

    def _xml(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """XML (5): BlastOutput header naming the first query, one <Iteration> per query."""
        start = data.find(_XML_ITERATIONS)
        end = _XML_END.search(data)
        if start < 0 or end is None:
            raise ValueError(f"piece {index}: not a complete BLAST XML document (outfmt 5)")
        start += len(_XML_ITERATIONS)
        header, body, footer = data[:start], data[start : end.start()], data[end.start() :]
        self._same(index, "header", _XML_FIRST_QUERY.sub(b"", header), "_header")
        self._same(index, "footer", footer, "_footer")
        units = _units(index, body, _XML_ITERATION, "<Iteration>")
        ids = []
        for pos, unit in enumerate(units, 1):
            num = _XML_ITER_NUM.search(unit)
            if num is None or int(num.group(1)) != pos:
                raise ValueError(f"piece {index}: iteration {pos} is not numbered {pos}")
            ident = _XML_QUERY_ID.search(unit)
            if ident is None:
                raise ValueError(f"piece {index}: iteration {pos} has no <Iteration_query-ID>")
            ids.append((pos, ident.group(1)))
        renumber_ids = self._ids.decide(ids, index)
        if offset:
            units = [
                _renumber_xml(unit, pos, pos + offset, renumber_ids) for pos, unit in enumerate(units, 1)
            ]
        out = (header if first else b"") + b"".join(units) + (footer if last else b"")
        return out, len(units)

    def _renumber(
        self,
        index: int,
        units: list[bytes],
        offset: int,
        pattern: re.Pattern[bytes],
        unit_name: str,
        field_name: str,
        template: bytes,
    ) -> list[bytes]:
        """Shift each per-query report's positional `Query_N` id by `offset` (JSON 15 and XML2 16)."""
        ids = []
        for pos, unit in enumerate(units, 1):
            found = pattern.findall(unit)
            if len(found) != 1:
                raise ValueError(f"piece {index}: {unit_name} {pos} has {len(found)} {field_name}")
            ids.append((pos, found[0]))
        if not (self._ids.decide(ids, index) and offset):
            return units
        return [
            _renumber_message(
                _replace_once(index, unit, template % pos, template % (pos + offset)), pos, pos + offset
            )
            for pos, unit in enumerate(units, 1)
        ]

    def _json(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """Single-file JSON (15): an array of one report per query."""
        if not data.startswith(_JSON_START) or not data.endswith(_JSON_END):
            raise ValueError(f"piece {index}: not a complete BlastOutput2 JSON document (outfmt 15)")
        body = data[len(_JSON_START) : len(data) - len(_JSON_END)]
        units = _separated_units(index, body, _JSON_REPORT, "JSON report", _JSON_SEPARATOR)
        units = self._renumber(
            index,
            units,
            offset,
            _JSON_QUERY_ID,
            "JSON report",
            "query_id fields",
            b'"query_id": "Query_%d",\n',
        )
        out = (_JSON_START if first else b"") + b"".join(units)
        if last:
            out = out[: -len(_JSON_SEPARATOR)] + _JSON_END
        return out, len(units)

    def _xml2(self, index: int, data: bytes, offset: int, first: bool, last: bool) -> tuple[bytes, int]:
        """Single-file XML2 (16): a BlastXML2 root holding one <BlastOutput2> per query."""
        m = _XML2_REPORT.search(data)
        if m is None or not data.endswith(_XML2_END):
            raise ValueError(f"piece {index}: not a complete BlastXML2 document (outfmt 16)")
        header, body = data[: m.start()], data[m.start() : len(data) - len(_XML2_END)]
        self._same(index, "header", header, "_header")
        units = _separated_units(index, body, _XML2_REPORT, "<BlastOutput2>", _XML2_SEPARATOR)
        units = self._renumber(
            index,
            units,
            offset,
            _XML2_QUERY_ID,
            "XML2 report",
            "<query-id> elements",
            b"<query-id>Query_%d</query-id>\n",
        )
        out = (header if first else b"") + b"".join(units)
        if last:
            out = out[: -len(_XML2_SEPARATOR)] + _XML2_END
        return out, len(units)


def _units(index: int, body: bytes, start: re.Pattern[bytes], what: str) -> list[bytes]:
    """Split a body into per-query units, each beginning where `start` matches; nothing may precede."""
    starts = [m.start() for m in start.finditer(body)]
    if not starts or starts[0] != 0:
        raise ValueError(f"piece {index}: expected the query blocks to start with {what}")
    return [body[a:b] for a, b in zip(starts, starts[1:] + [len(body)], strict=True)]


def _separated_units(index: int, body: bytes, start: re.Pattern[bytes], what: str, sep: bytes) -> list[bytes]:
    """Per-query units of a list whose items are separated by `sep`: each unit is returned with the
    separator after it, so the joined pieces need only the last one dropped."""
    units = _units(index, body, start, what)
    for pos, unit in enumerate(units, 1):
        if unit.endswith(b"\n" + sep) != (pos < len(units)):
            raise ValueError(f"piece {index}: unexpected text between {what} {pos} and the next")
    units[-1] += sep
    return units


def _replace_once(index: int, unit: bytes, old: bytes, new: bytes) -> bytes:
    if unit.count(old) != 1:
        raise ValueError(f"piece {index}: expected exactly one {old!r} in a query block")
    return unit.replace(old, new)


def _renumber_xml(unit: bytes, pos: int, number: int, renumber_id: bool) -> bytes:
    unit = unit.replace(
        b"  <Iteration_iter-num>%d</Iteration_iter-num>\n" % pos,
        b"  <Iteration_iter-num>%d</Iteration_iter-num>\n" % number,
        1,
    )
    if renumber_id:
        unit = unit.replace(
            b"  <Iteration_query-ID>Query_%d</Iteration_query-ID>\n" % pos,
            b"  <Iteration_query-ID>Query_%d</Iteration_query-ID>\n" % number,
            1,
        )
        unit = _renumber_message(unit, pos, number)
    return unit


# A query's message line (XML 5, JSON 15, XML2 16), where BLAST+ writes its warnings about the query.
_MESSAGE = re.compile(rb'^ *(?:<Iteration_message>|"message": "|<message>).*$', re.M)


def _renumber_message(unit: bytes, pos: int, number: int) -> bytes:
    """The query's warnings name it `Query_<pos> <id>:`, at the message's start and after two blanks."""
    prefix = re.compile(rb"(>|\"|  )Query_%d (?=\S)" % pos)
    return _MESSAGE.sub(lambda m: prefix.sub(rb"\1Query_%d " % number, m.group(0)), unit)


# --- query-anchored reports (outfmt 1-4) ---
#
# A query's alignment is printed in blocks of up to line-length columns, separated by blank lines. Each
# block starts with the query's row; subject rows follow, some with insertion markers (lines starting
# with blanks). A row is its label padded to W = longest label of the whole alignment + 2, the start
# coordinate (omitted for a row without residues in the block), the residues and the end coordinate.
# Marker lines are W + coordinate width blanks, then the markers, whatever the labels. So renaming the
# query's label to a longer one widens W for every line of the alignment when it becomes the longest.

# A row printing its start coordinate: label, blanks, digits, blanks, residues.
_ROW_START = re.compile(rb"^(\S+)( {2,})\d+ {2,}\S")
# Any row (the start coordinate may be omitted).
_ROW = re.compile(rb"^\S+ {2,}\S")


def _runs(lines: list[bytes]) -> list[tuple[int, int]]:
    """[start, end) line ranges of the runs of non-blank lines."""
    runs = []
    i = 0
    while i < len(lines):
        if lines[i]:
            j = i
            while j < len(lines) and lines[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def _is_block(run: list[bytes]) -> bool:
    return _ROW_START.match(run[0]) is not None and all(
        line.startswith(b" ") or _ROW.match(line) for line in run
    )


def _anchored_label(section: bytes) -> bytes | None:
    """The query's row label: first word of the section's last alignment block (the one before the
    statistics); None for a query without alignments."""
    lines = section.split(b"\n")
    label = None
    for a, b in _runs(lines):
        if _is_block(lines[a:b]):
            label = lines[a].split(b" ", 1)[0]
    return label


def _relabel_anchored(index: int, section: bytes, old: bytes, new: bytes) -> bytes:
    """Rename the query's row label `old` -> `new` in every alignment block of one query's section."""
    lines = section.split(b"\n")
    width = None  # W of the previous block: blocks of one alignment share it
    for a, b in _runs(lines):
        if not lines[a].startswith(old + b"  "):
            continue
        block = lines[a:b]
        if not all(line.startswith(b" ") or _ROW.match(line) for line in block):
            raise ValueError(f"piece {index}: unexpected line in an alignment block of {old.decode()}")
        width = _block_width(index, block, old, width)
        grow = max(0, len(new) + 2 - width)
        for k, row in enumerate(block):
            if row.startswith(b" "):
                lines[a + k] = b" " * grow + row
                continue
            head = row[:width]
            label = head.rstrip(b" ")
            if not head.endswith(b"  ") or b" " in label:
                raise ValueError(f"piece {index}: misaligned row in the alignment of {old.decode()}")
            if k == 0:
                label = new
            lines[a + k] = label.ljust(width + grow) + row[width:]
    if width is None:
        raise ValueError(f"piece {index}: cannot find the alignment blocks of {old.decode()}")
    return b"\n".join(lines)


def _block_width(index: int, block: list[bytes], old: bytes, previous: int | None) -> int:
    """W: where the start coordinates begin, read off the rows of the block that print one."""
    widths = {m.end(2) for row in block if (m := _ROW_START.match(row))}
    if len(widths) > 1:
        raise ValueError(f"piece {index}: rows of an alignment block of {old.decode()} are not aligned")
    width = widths.pop() if widths else previous
    if width is None or width < len(old) + 2:
        raise ValueError(f"piece {index}: cannot read the label width in the alignment of {old.decode()}")
    return width


# --- one piece at a time (parallel output: the worker that wrote a piece stitches it) ---


@dataclass(frozen=True)
class Agreement:
    """What a Stitcher checks across pieces, for a piece stitched on its own: digests of the run's header
    and footer as the piece wrote them, and whether its query ids were positional (None: it showed
    none). Whoever orders the pieces compares these (`AgreementCheck`) instead of the bytes."""

    header: str | None
    footer: str | None
    positional: bool | None


def stitch_alone(
    outfmt: str,
    total_pieces: int,
    index: int,
    data: bytes,
    query_offset: int,
    n_queries: int,
    total_queries: int,
) -> tuple[bytes, Agreement]:
    """The bytes piece `index` puts in the stitched output, computed without the earlier pieces: what a
    piece contributes depends only on its position (first, last, query offset), which the plan fixes;
    the checks between pieces are left to `AgreementCheck`, which sees every piece's `Agreement`."""
    stitcher = Stitcher(outfmt, total_pieces)
    stitcher._next_index = index
    stitcher._next_offset = query_offset
    out = stitcher.piece(index, data, query_offset, total_queries)
    if stitcher._next_offset is not None and stitcher._next_offset != query_offset + n_queries:
        raise ValueError(
            f"piece {index}: holds {stitcher._next_offset - query_offset} queries, the plan {n_queries}"
        )

    def digest(part: bytes | None) -> str | None:
        return None if part is None else hashlib.blake2b(part, digest_size=16).hexdigest()

    return out, Agreement(digest(stitcher._header), digest(stitcher._footer), stitcher._ids.positional)


class AgreementCheck:
    """The Stitcher's checks between pieces, over pieces stitched on their own (any order): every header
    and footer equal to the first seen, query ids positional in all pieces or in none."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, object]] = {}

    def add(self, index: int, agreement: Agreement) -> None:
        for what, value in (
            ("header", agreement.header),
            ("footer", agreement.footer),
            ("query ids", agreement.positional),
        ):
            if value is None:
                continue
            seen = self.first.setdefault(what, (index, value))
            if seen[1] != value:
                raise ValueError(
                    f"piece {index}: its {what} differ from piece {seen[0]}'s (other options or db?)"
                )
