"""`paramedic ship`: a finished file (a CLOG2 trace) shipped to a storage site, its run record and summary
line; the shipping options and the shipping itself are `paramedic trace --site`'s too."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paramedic.cli.parsing import command_parser
from paramedic.cli.signals import stop_on_signals
from paramedic.errors import InputError, UsageError


def ship_options(parser: argparse.ArgumentParser, required: bool) -> None:
    """--site, --keys, --ship, --streams, --ship-timeout, --record: shipping a finished file."""
    parser.add_argument(
        "--site", required=required, help="the storage site: tls://HOST:PORT or file:///inbox"
    )
    parser.add_argument("--keys", type=Path, help="this compute site's keys (from `paramedic keys`)")
    parser.add_argument("--ship", default="metadata", help="metadata (default), compressed, direct or auto")
    parser.add_argument("--streams", type=int, default=4, help="parallel TLS streams (default 4)")
    parser.add_argument("--ship-timeout", type=float, default=300.0, help="seconds to retry a lost site")
    parser.add_argument("--record", type=Path, help="write the run record (its `ship` section) here")
    parser.add_argument(
        "--trace-precision",
        default="lossless",
        help="a trace's time precision at the site: lossless (default), or e.g. 1us (times rounded to it)",
    )


def ship_finished_file(
    args: argparse.Namespace, path: Path, out: str, extra: dict[str, object] | None = None
) -> None:
    import json

    from paramedic.durable import write_output
    from paramedic.ship.apps import app_for_file
    from paramedic.ship.destination import ShipSettings
    from paramedic.ship.file_ship import read_input, ship_file
    from paramedic.trace import precision

    settings = ShipSettings.build(args.site, args.keys, args.ship, out, args.streams, args.ship_timeout)
    quantum = precision.parse(args.trace_precision)
    data = read_input(path)  # a regular file, bounded: a FIFO or /dev/zero is refused
    app = app_for_file(data[:1024])
    if app is None:
        raise InputError(f"{path}: not the output of an application paramedic ships (a CLOG2 trace?)")
    if quantum and app.name != "trace":
        raise UsageError("--trace-precision applies to traces only")
    if quantum:  # the file that ships, and that the site regenerates, is the reduced one
        data = precision.reduce(data, quantum)
    report = ship_file(settings, app, data, precision.label(quantum))
    record = {
        "kind": "paramedic-ship",
        "version": 1,
        "application": app.name,
        "file": str(path),
        "ship": report,
        **(extra or {}),  # `paramedic trace`: the trace's summary (its untraced calls among it)
    }
    if args.record is not None:
        write_output(args.record, json.dumps(record, indent=1).encode() + b"\n", shared=False)
    if report.get("already_at_site"):
        print(
            f"paramedic: {path} is already at {settings.site} as {out} (an earlier run of this command "
            "shipped it; the site's copy is identical)",
            file=sys.stderr,
        )
        return
    print(
        f"paramedic: {path} shipped to {settings.site} as {out} ({report['mode']}: "
        f"{report['shipped_payload_bytes']} bytes for {report['output_bytes']}; "
        + (
            f"the site's copy is identical to the file with times rounded to {precision.label(quantum)})"
            if quantum
            else "the site's copy is identical)"
        ),
        file=sys.stderr,
    )


def ship_command(argv: list[str]) -> int:
    parser = command_parser("ship", "Ship a finished output file (a CLOG2 trace) to a storage site.")
    parser.add_argument(
        "file",
        type=Path,
        help="the file (a CLOG2 trace, from paramedic trace or MPE2): a regular file of at most 16 GiB and "
        "half this machine's memory",
    )
    parser.add_argument("-out", required=True, help="its path under the storage site's root")
    ship_options(parser, required=True)
    args = parser.parse_args(argv)
    stop_on_signals()  # the site job opened is cancelled on the way out (ship.file_ship)
    ship_finished_file(args, args.file, args.out)
    return 0
