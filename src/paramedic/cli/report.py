"""`paramedic report`: a run record, or a CLOG2 trace as a timeline, drawn as one self-contained HTML
page."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from paramedic.cli.parsing import command_parser
from paramedic.errors import InputError, UsageError

# A CLOG2 file's preamble starts with its version string (MPE2's clog_preamble.h): "CLOG-02.xx".
CLOG2_MAGIC = b"CLOG-02"


def report_command(argv: list[str]) -> int:
    from paramedic.report.html import write_report

    parser = command_parser(
        "report",
        "Draw a run record (a search's <out>.run.json) as one self-contained HTML page: timeline of the "
        "tasks per rank, phase split, load balance, bytes moved and saved, the ParaMEDIC data-or-metadata "
        "chart, staging, and a `paramedic simulate --json` prediction beside the run. Given a CLOG2 trace "
        "(paramedic trace), draw it as a timeline: ranks as rows, calls as bars, messages as arrows.",
    )
    parser.add_argument("record", type=Path, help="the run record (e.g. hits.txt.run.json) or a CLOG2 trace")
    parser.add_argument(
        "-o", "-out", "--out", dest="out", type=Path, help="the page to write (default: the file with .html)"
    )
    parser.add_argument(
        "--prediction", type=Path, help="`paramedic simulate --json` output to show beside the run"
    )
    parser.add_argument(
        "--max-records",
        type=int,
        default=20000,
        help="a trace's single calls kept for zooming in (bounds the page)",
    )
    args = parser.parse_args(argv)
    out = args.out or args.record.with_suffix(".html")
    try:  # not blocking: a FIFO given as the record hung here
        with os.fdopen(os.open(args.record, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
            head = fh.read(len(CLOG2_MAGIC)) or b""
    except OSError:
        head = b""  # the run record's reader says what is wrong
    if head == CLOG2_MAGIC:
        return _trace_report(args.record, out, args.max_records)
    size = write_report(args.record, out, args.prediction)
    print(f"paramedic: report page {out} ({size / 1e6:.1f} MB, opens with no network)", file=sys.stderr)
    return 0


def _trace_report(source: Path, out: Path, max_records: int) -> int:
    """A CLOG2 trace as one page over the whole run: the file streamed once in chunks, its memory bounded
    whatever its size (paramedic.trace.overview)."""
    from paramedic.errors import OutputError
    from paramedic.trace.timeline import write

    if not 1 <= max_records <= 10**6:
        raise UsageError("--max-records must be between 1 and 1,000,000")
    try:
        size = write(source, out, max_records)
    except OSError as exc:
        if exc.filename == str(source):
            raise InputError(f"{source}: {exc.strerror}") from exc
        raise OutputError(f"{out}: {exc.strerror}") from exc
    print(f"paramedic: timeline of {source} written to {out} ({size / 1e6:.1f} MB)", file=sys.stderr)
    return 0
