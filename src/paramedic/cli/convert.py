"""`paramedic convert`: a CLOG2 trace converted to an OTF2 archive."""

from __future__ import annotations

import sys
from pathlib import Path

from paramedic.cli.parsing import command_parser
from paramedic.errors import InputError


def convert_command(argv: list[str]) -> int:
    from paramedic.errors import OutputError
    from paramedic.trace.otf2_out import convert, summary_line

    parser = command_parser(
        "convert",
        "Convert a CLOG2 trace (paramedic trace, or MPE2's) to an OTF2 archive, which Vampir, ViTE and "
        "Score-P's tools open: every MPI call as Enter/Leave of its region on its rank's location, messages "
        "as MpiSend/MpiRecv, blocking collectives; the trace is streamed, and the archive is written beside "
        "DIR and renamed to it when complete (open DIR/traces.otf2).",
    )
    parser.add_argument("trace", type=Path, help="the CLOG2 file")
    parser.add_argument(
        "--otf2", type=Path, required=True, metavar="DIR", help="the archive's directory (new, or empty)"
    )
    args = parser.parse_args(argv)
    try:
        counts = convert(args.trace, args.otf2)
    except OSError as exc:
        if exc.filename == str(args.trace):
            raise InputError(f"{args.trace}: {exc.strerror}") from exc
        raise OutputError(f"{args.otf2}: {exc.strerror or exc}") from exc
    size = sum(p.stat().st_size for p in args.otf2.rglob("*") if p.is_file())
    print(
        f"paramedic: OTF2 of {args.trace} written to {args.otf2}/traces.otf2 ({size / 1e6:.1f} MB): "
        f"{summary_line(counts)}",
        file=sys.stderr,
    )
    return 0
