"""`paramedic trace`: an unmodified MPI program run traced into one merged CLOG2 file, its summary line
and record, and with --site the trace shipped as `paramedic ship` does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paramedic.cli.parsing import byte_size, command_parser
from paramedic.cli.ship import ship_finished_file, ship_options
from paramedic.cli.signals import stop_on_signals
from paramedic.errors import UsageError


def trace_command(argv: list[str]) -> int:
    from paramedic.trace.job import Interrupted

    stop_on_signals()
    try:
        return _run_trace(argv)
    except Interrupted as stopped:
        print(f"paramedic: interrupted: {stopped}", file=sys.stderr)
        return 130


def _run_trace(argv: list[str]) -> int:
    import tempfile

    from paramedic.engine.runtime.leftovers import remove_leftovers
    from paramedic.trace.run import summary_line, trace

    parser = _trace_parser()
    if "--" not in argv:
        if "-h" in argv or "--help" in argv:  # the help needs no program to trace
            parser.print_help()
            return 0
        raise UsageError(
            "paramedic trace: give the MPI command after --: trace -out FILE.clog2 -- mpiexec ..."
        )
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    if args.buffer < 4096 or args.buffer > 1 << 30:
        raise UsageError("--buffer must be between 4096 and 2^30 bytes")
    if args.site is None and args.trace_precision != "lossless":
        raise UsageError("--trace-precision is the precision of the site's copy: give --site too")
    if args.site is not None:  # the site settings are checked before the program runs
        from paramedic.durable import stream_target
        from paramedic.ship.destination import ShipSettings

        if stream_target(args.out):  # written through, it cannot be read back to ship
            raise UsageError(f"-out {args.out}: with --site the trace is shipped from -out, so give a file")
        from paramedic.trace.precision import parse

        parse(args.trace_precision)

        ShipSettings.build(args.site, args.keys, args.ship, str(args.out), args.streams, args.ship_timeout)
    remove_leftovers(Path(tempfile.gettempdir()))  # what launchers killed outright left (trace's too)
    summary = trace(argv[split + 1 :], args.out, args.buffer, args.max_trace_size)
    print(f"paramedic: trace written to {args.out}: {summary_line(summary)}", file=sys.stderr)
    if args.site is not None:
        ship_finished_file(args, args.out, str(args.out), {"trace": summary})
    elif args.record is not None:  # the trace's record alone: what was traced, and what could not be
        import json

        from paramedic.durable import write_output

        record = {"kind": "paramedic-trace", "version": 1, "file": str(args.out), "trace": summary}
        write_output(args.record, json.dumps(record, indent=1).encode() + b"\n", shared=False)
    return 0


def _trace_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "trace",
        "Run an unmodified MPI program traced (a PMPI library preloaded into its ranks, built at first use "
        "with the mpicc beside the launcher) and write one merged CLOG2 file (MPE2's format). Everything "
        "after -- is the launcher's command line, as it would be run untraced (Open MPI's or MPICH's "
        "mpiexec/mpirun). With --site the trace is also shipped to a storage site, as `paramedic ship`.",
        usage="paramedic trace -out FILE.clog2 [options] -- MPIEXEC [launcher options] PROGRAM [ARGS]",
    )
    parser.add_argument(
        "-out",
        required=True,
        type=Path,
        help="the merged CLOG2 file (with --site, also its name at the site)",
    )
    parser.add_argument(
        "--buffer", type=int, default=8 << 20, help="bytes each rank buffers before writing (default 8 MiB)"
    )
    parser.add_argument(
        "--max-trace-size",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="the most the merged file may hold (e.g. 500M, 2G; at least 128K): each rank logs an equal "
        "share and then stops recording, and the closing line and --record say what was left out "
        "(default: 40%% of the free space beside -out, at least 64M)",
    )
    ship_options(parser, required=False)
    return parser
