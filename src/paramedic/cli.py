"""Command line: each command's options parsed into typed settings and handed to the library (USAGE is
the user's help), and what the command line owns around them: SIGTERM and SIGHUP as interrupts, one line
and a documented exit code per error (docs/ERRORS.md), a run record and a summary line for `paramedic
ship` and `paramedic trace`, and the process's end (`run`). No search, shipping or tracing logic."""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic import __version__
from paramedic.errors import InputError, ParamedicError, UsageError

if TYPE_CHECKING:  # the engine is imported by the commands that run it
    from collections.abc import Callable

    from paramedic.engine.core.settings import SearchSettings

USAGE = """\
paramedic: parallel NCBI BLAST+ on MPI, with ParaMEDIC's metadata shipping to a storage site.

usage: paramedic COMMAND [options]     (paramedic COMMAND --help for a command's options)

commands:
  format   make a BLAST+ database of a FASTA file (makeblastdb, one copy); search takes any BLAST+ database
             paramedic format --in db.fasta --dbtype prot --fragments 8 --out dbs/uniprot
  search   search with BLAST+ in parallel (BLAST+ options keep their single dash)
             paramedic search blastp -query q.fasta -db dbs/uniprot -out hits.txt -evalue 1e-5
             mpiexec -n 64 paramedic search blastp -query q.fasta -db dbs/uniprot -out hits.tsv -outfmt 6
  keys     make a private CA and TLS certificates for a storage site and its compute sites
             paramedic keys --out keys --server storage.example.org --client compute-a
  serve    storage site: receive output or metadata and write the output under --root
             paramedic serve --replica dbs/uniprot --root /data/results --keys keys/server
  simulate predict a search's wall time and efficiency at any scale from a pilot run's record
             paramedic simulate --record pilot/hits.txt.run.json --queries 250000 \\
                 --workers 32768 --partition-size 128
  trace    run an unmodified MPI program traced (PMPI); write one merged CLOG2 file (MPE2's format)
             paramedic trace -out run.clog2 -- mpiexec -n 4 lmp -in in.melt
  ship     ship a finished trace to a storage site (its metadata by default; the site regenerates it)
             paramedic ship run.clog2 -out traces/run.clog2 --site tls://storage:7700 --keys keys/compute-a
  verify   digest every file of a BLAST+ database again and remember the digests (after an update)
             paramedic verify -db nr
  report   draw a run record, or a CLOG2 trace as a timeline, as one self-contained HTML page
             paramedic report hits.txt.run.json -o hits.html
  convert  convert a CLOG2 trace to OTF2 (an archive directory) for Vampir, ViTE and Score-P's tools
             paramedic convert run.clog2 --otf2 run-otf2

exit codes: 0 success, 1 internal error, 2 usage, 3 input data, 4 database, 5 BLAST+, 6 output,
7 the parallel job failed on some rank (or a rank was killed), 8 storage site, 130 interrupted,
141 standard output closed by its reader."""


def run() -> None:
    """The `paramedic` command: `main`, then the end of the process. By then the work is done and every
    file closed; finalizing the interpreter (the objects of 200 modules) cost 15-30 ms of a small
    search's wall, so the process ends with os._exit once Python's exit handlers have run. Not under MPI
    (MPI_Finalize runs as the interpreter ends) nor while another thread runs: then the usual exit."""
    code = main()
    if "mpi4py.MPI" in sys.modules or threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of standard output went away
        from paramedic.pipes import stdout_closed

        code = stdout_closed()
    except (OSError, ValueError):
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except ParamedicError as exc:
        from paramedic.engine.runtime.launch import another_rank

        if not another_rank():  # under mpiexec/srun every rank finds the same refusal: rank 0 says it
            print(f"paramedic: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("paramedic: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed by its reader (`| head -1`): quiet, as BLAST+
        from paramedic.pipes import stdout_closed

        return stdout_closed()
    except Exception as exc:  # never a traceback for the user; PARAMEDIC_DEBUG=1 shows it
        if os.environ.get("PARAMEDIC_DEBUG"):
            raise
        print(
            f"paramedic: internal error: {type(exc).__name__}: {exc} (PARAMEDIC_DEBUG=1 shows more)",
            file=sys.stderr,
        )
        return 1


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"paramedic {__version__} ({_blast_version()})")
        return 0
    command, rest = argv[0], argv[1:]
    handler = commands().get(command)
    if handler is None:
        raise UsageError(f"unknown command {command!r} (commands: {', '.join(commands())})")
    return handler(rest)


def commands() -> dict[str, Callable[[list[str]], int]]:
    """Every command and the function that runs it: the one list read by the dispatch, its refusal and
    the help test (tests/unit/test_help.py)."""
    return {
        "format": _format,
        "search": _search_command,
        "keys": _keys,
        "serve": _serve,
        "simulate": _simulate,
        "trace": _trace,
        "ship": _ship,
        "report": _report,
        "convert": _convert,
        "verify": _verify,
    }


def _blast_version() -> str:
    """BLAST+'s version for `--version` (a bug report needs both). Asked of blastn directly, not through
    blast.tools, which would build and start a fork server; an install without BLAST+ still answers."""
    import shutil
    import subprocess

    exe = shutil.which("blastn") or shutil.which("blastp")
    if exe is None:
        return "BLAST+ not found"
    try:
        out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    first = out.splitlines()[0] if out else ""
    return f"BLAST+ {first.split(':', 1)[1].strip()}" if ":" in first else "BLAST+ not found"


def _search_command(argv: list[str]) -> int:
    from paramedic.engine.runtime.launch import under_mpi

    if not under_mpi():
        # the launching process: SIGTERM or SIGHUP before the job's supervisor takes them over (while
        # the modules load and the job is checked) is an interrupt too (exit 130, one line)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)
    return _search(argv)


def _ship_options(parser: argparse.ArgumentParser, required: bool) -> None:
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


def _ship_file(
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


def _ship(argv: list[str]) -> int:
    parser = _parser("ship", "Ship a finished output file (a CLOG2 trace) to a storage site.")
    parser.add_argument(
        "file",
        type=Path,
        help="the file (a CLOG2 trace, from paramedic trace or MPE2): a regular file of at most 16 GiB and "
        "half this machine's memory",
    )
    parser.add_argument("-out", required=True, help="its path under the storage site's root")
    _ship_options(parser, required=True)
    args = parser.parse_args(argv)
    _stop_on_signals()  # the site job opened is cancelled on the way out (ship.file_ship)
    _ship_file(args, args.file, args.out)
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


def _trace(argv: list[str]) -> int:
    from paramedic.trace.job import Interrupted

    _stop_on_signals()
    try:
        return _run_trace(argv)
    except Interrupted as stopped:
        print(f"paramedic: interrupted: {stopped}", file=sys.stderr)
        return 130


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP interrupt, as Ctrl-C does, once: a second signal does not cut short the stop
    (the traced job's end, the site job's cancel), which is bounded in time."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt_once)


def _interrupt_once(signum: int, _frame: object) -> None:
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt


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
        _ship_file(args, args.out, str(args.out), {"trace": summary})
    elif args.record is not None:  # the trace's record alone: what was traced, and what could not be
        import json

        from paramedic.durable import write_output

        record = {"kind": "paramedic-trace", "version": 1, "file": str(args.out), "trace": summary}
        write_output(args.record, json.dumps(record, indent=1).encode() + b"\n", shared=False)
    return 0


def _trace_parser() -> argparse.ArgumentParser:
    parser = _parser(
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
        type=_size,
        default=None,
        metavar="SIZE",
        help="the most the merged file may hold (e.g. 500M, 2G; at least 128K): each rank logs an equal "
        "share and then stops recording, and the closing line and --record say what was left out "
        "(default: 40%% of the free space beside -out, at least 64M)",
    )
    _ship_options(parser, required=False)
    return parser


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _keys(argv: list[str]) -> int:
    from paramedic.site.keys import make_keys

    parser = _parser("keys", "Make a private CA and TLS certificates for a storage site and compute sites.")
    parser.add_argument("--out", required=True, type=Path, help="new directory for the keys")
    parser.add_argument("--server", required=True, help="the storage site's host name or IP address")
    parser.add_argument("--client", action="append", required=True, help="a compute site's name (repeatable)")
    parser.add_argument("--days", type=int, default=825, help="validity of the certificates (default 825)")
    args = parser.parse_args(argv)
    make_keys(args.out, args.server, args.client, args.days)
    print(
        f"paramedic: keys in {args.out}: give {args.out}/server to the storage site and "
        + ", ".join(f"{args.out}/{c} to {c}" for c in args.client)
        + f"; keep {args.out}/ca private",
        file=sys.stderr,
    )
    return 0


def _serve(argv: list[str]) -> int:
    from paramedic.site.receivers import receivers
    from paramedic.site.server import ServeSettings, serve
    from paramedic.site.space import Quota

    parser = _parser(
        "serve",
        "Storage site: receive output or metadata over TLS (or from a shared --inbox directory) and write "
        "the output.",
    )
    parser.add_argument(
        "--replica",
        type=Path,
        help="the site's copy of the formatted database (needed for BLAST metadata; a site without one "
        "serves traces and plain output)",
    )
    parser.add_argument("--root", required=True, type=Path, help="directory that receives the output files")
    parser.add_argument("--listen", default="0.0.0.0:7700", help="HOST:PORT (default 0.0.0.0:7700)")
    parser.add_argument(
        "--keys",
        type=Path,
        help="the server's keys (from paramedic keys): the TLS listener's certificate and CA; with --inbox "
        "the inbox then also requires jobs signed by a compute site's certificate from that CA",
    )
    parser.add_argument("--io-workers", type=int, default=2, help="regeneration workers (default 2)")
    for receiver in receivers():  # the other transports' storage sides (site.receivers)
        parser.add_argument(
            receiver.option, type=receiver.parse, metavar=receiver.metavar, help=receiver.help
        )
    parser.add_argument("--state", type=Path, help="job state directory (default <root>/.paramedic-state)")
    parser.add_argument(
        "--expire-after",
        type=float,
        default=168.0,
        metavar="HOURS",
        help="how long the record of a done or failed job is kept, so a compute site that lost the last "
        "reply can still ask for it (default 168 = 7 days)",
    )
    parser.add_argument(
        "--open-idle",
        type=float,
        default=1.0,
        metavar="HOURS",
        help="an open job with no request this long fails as expired and its data is removed (default 1; "
        "a live compute site keeps its job alive every 30 s; never more than --expire-after)",
    )
    parser.add_argument(
        "--regen-timeout",
        type=float,
        default=1.0,
        metavar="HOURS",
        help="the most one chunk's regeneration (BLAST+ writing its pieces) may take: then its job fails "
        "and the BLAST+ run is killed (default 1)",
    )
    parser.add_argument(
        "--job-quota",
        type=_size,
        metavar="BYTES",
        help="bytes one job may hold (e.g. 50G; default: no bound)",
    )
    parser.add_argument(
        "--site-quota",
        type=_size,
        metavar="BYTES",
        help="bytes all the jobs of one compute site may hold, the outputs they published here included "
        "(e.g. 500G; default: half of the free space above --reserve plus what the compute site holds: "
        "whoever comes next finds half of what is free)",
    )
    parser.add_argument(
        "--reserve",
        type=_size,
        default=256 * 2**20,
        metavar="BYTES",
        help="free space kept on the file systems of --root and the state (default 256M); a job that "
        "would go below it fails and its data is removed",
    )
    parser.add_argument(
        "--max-setup",
        type=_size,
        default=64 * 2**20,
        metavar="BYTES",
        help="the most a job's queries may take, uncompressed (default 64M): the site holds them on disk, "
        "but parses them in memory once per job and once per restart",
    )
    parser.add_argument(
        "--trace-memory",
        type=_size,
        metavar="BYTES",
        help="the most memory the regeneration of traces from their metadata may hold at once (about 10 "
        "bytes per byte of trace; default: half of this machine's memory); a trace that needs more is "
        "refused, to be shipped compressed",
    )
    parser.add_argument(
        "--no-replica-reads",
        action="store_true",
        help="do not serve the replica's fragment volumes to compute sites (by default an authenticated "
        "compute site may read them, read-only, to mirror the database: search --mirror tls://...)",
    )
    args = parser.parse_args(argv)  # the settings check their own values (ServeSettings)
    return serve(
        ServeSettings(
            args.replica,
            args.root,
            args.listen,
            args.keys,
            args.io_workers,
            {r.name: getattr(args, r.name.replace("-", "_")) for r in receivers()},
            args.state,
            args.expire_after,
            quota=Quota(job_bytes=args.job_quota, peer_bytes=args.site_quota, reserve_bytes=args.reserve),
            open_idle_seconds=args.open_idle * 3600,
            replica_reads=not args.no_replica_reads,
            regen_seconds=args.regen_timeout * 3600,
            max_setup_bytes=args.max_setup,
            trace_memory_bytes=args.trace_memory,
        )
    )


def _simulate(argv: list[str]) -> int:
    from paramedic.engine.predict.simulate import OUTPUT_COSTS, SimulateSettings, run_simulate
    from paramedic.engine.predict.startup import DATABASES, DatabaseShape, StartupRates, parse_bytes, profile

    parser = _parser(
        "simulate",
        "Predict a search's wall time, efficiency and idle time per role for any number of queries and "
        "workers: the engine's own schedulers run in virtual time, with task costs from a pilot run's "
        "record (its <out>.run.json).",
    )
    parser.add_argument("--record", required=True, type=Path, help="the pilot run's record")
    parser.add_argument("--queries", type=int, help="queries of the predicted job (lengths sampled)")
    parser.add_argument(
        "--query-file", type=Path, help="or the predicted job's own queries (FASTA): their lengths"
    )
    parser.add_argument(
        "--workers", required=True, type=int, help="ranks besides rank 0, as `paramedic search --np`"
    )
    parser.add_argument(
        "--partition-size", type=int, help="ranks per partition (a partition master and its workers)"
    )
    parser.add_argument(
        "--replica-group-size", type=int, help="workers per copy of the database, as in search"
    )
    parser.add_argument(
        "--output-strategy",
        choices=sorted(OUTPUT_COSTS),
        default="master",
        help="who writes the report (default master: rank 0)",
    )
    parser.add_argument(
        "--fragments", type=int, help="cut the database into this many fragments (default: the pilot's)"
    )
    parser.add_argument(
        "--database-scale",
        type=float,
        default=1.0,
        help="a database this many times the pilot's (default 1; same cost per residue pair)",
    )
    parser.add_argument("--batch", type=int, help="queries per search task (default: as the pilot)")
    parser.add_argument(
        "--cores",
        type=int,
        help="cores the ranks share on one machine: more workers than cores slow every task in "
        "proportion (default: a core per rank)",
    )
    parser.add_argument(
        "--core-speed",
        type=float,
        default=1.0,
        help="the job's cores this many times as fast as the pilot's: its BLAST+ seconds divided by it "
        "(default 1)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the query sampling (default 1)")
    described = parser.add_argument_group(
        "a database searched in place, described by its size (its start-up and verification predicted)"
    )
    described.add_argument(
        "--database-profile",
        choices=sorted(DATABASES),
        help="one of NCBI's databases: "
        + "; ".join(f"{name} {about}" for name, (_, _, _, about) in DATABASES.items()),
    )
    described.add_argument("--db-bytes", help="or its files' size: 364G (10^9 bytes), 1.07TiB (2^40)")
    described.add_argument("--db-volumes", type=int, help="and its number of volumes")
    described.add_argument(
        "--db-residues", type=int, help="its letters (blastdbcmd -info; default: estimated from the bytes)"
    )
    described.add_argument(
        "--second-job",
        action="store_true",
        help="every digest remembered from an earlier job (default: the first job, which digests all)",
    )
    described.add_argument(
        "--stage", action="store_true", help="volumes copied to each node's disk (as search --stage)"
    )
    described.add_argument(
        "--node-ranks",
        type=int,
        default=1,
        help="ranks per node: a node copies a volume once and digests a share of a first job's files (default 1)",
    )
    described.add_argument(
        "--digest-rate", help="bytes per second a first job digests at (default 2.1G: this machine, cold)"
    )
    described.add_argument(
        "--copy-rate", help="bytes per second a stage copy reads at (default 770M: this machine's disk)"
    )
    parser.add_argument("--json", action="store_true", help="the prediction as JSON")
    args = parser.parse_args(argv)
    database = None
    if args.database_profile is not None:
        if args.db_bytes is not None or args.db_volumes is not None:
            raise UsageError("--database-profile or --db-bytes with --db-volumes: one of them")
        database = profile(args.database_profile, args.db_residues)
    elif args.db_bytes is not None or args.db_volumes is not None:
        if args.db_bytes is None or args.db_volumes is None:
            raise UsageError("--db-bytes and --db-volumes go together (the database's size and volumes)")
        size = parse_bytes(args.db_bytes)  # its molecule type: the pilot's program's
        database = DatabaseShape.of("the database", "", size, args.db_volumes, args.db_residues)
    elif args.db_residues is not None:
        raise UsageError("--db-residues describes a database given by --database-profile or --db-bytes")
    rates = StartupRates()
    if args.digest_rate is not None:
        rates = dataclasses.replace(rates, digest_rate=parse_bytes(args.digest_rate, "--digest-rate"))
    if args.copy_rate is not None:
        rates = dataclasses.replace(rates, copy_rate=parse_bytes(args.copy_rate, "--copy-rate"))
    settings = SimulateSettings(
        record=args.record,
        queries=args.queries,
        workers=args.workers,
        partition_size=args.partition_size,
        replica_group_size=args.replica_group_size,
        output_strategy=args.output_strategy,
        fragments=args.fragments,
        database_scale=args.database_scale,
        batch=args.batch,
        seed=args.seed,
        cores=args.cores,
        query_file=args.query_file,
        database=database,
        first_job=not args.second_job,
        stage=args.stage,
        node_ranks=args.node_ranks,
        rates=rates,
        core_speed=args.core_speed,
    )
    return run_simulate(settings, args.json)


def _report(argv: list[str]) -> int:
    from paramedic.report.html import write_report

    parser = _parser(
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


def _convert(argv: list[str]) -> int:
    from paramedic.errors import OutputError
    from paramedic.trace.otf2_out import convert, summary_line

    parser = _parser(
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


# A CLOG2 file's preamble starts with its version string (MPE2's clog_preamble.h): "CLOG-02.xx".
CLOG2_MAGIC = b"CLOG-02"


_SIZE = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(text: str) -> int:
    """A byte count: 1000000, 500M, 50G, 2T (binary units)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _SIZE and value[-1:] else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 50G)") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 50G)")
    return int(number * _SIZE[unit])


def _format(argv: list[str]) -> int:
    from paramedic.db.blastdb import DEFAULT_FRAGMENTS
    from paramedic.db.format import LAYOUTS, FormatSettings, format_database

    parser = _parser(
        "format",
        "Make a BLAST+ database of a FASTA file (makeblastdb, one copy of the sequences), to be searched in "
        "--fragments pieces.",
    )
    parser.add_argument("--in", dest="input", required=True, type=Path, help="FASTA file, plain or gzip")
    parser.add_argument("--dbtype", required=True, choices=["prot", "nucl"])
    parser.add_argument(
        "--fragments", type=int, default=DEFAULT_FRAGMENTS,
        help=f"how many pieces a search cuts it into (default {DEFAULT_FRAGMENTS}; at least one per volume)",
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, help="database name, e.g. dbs/uniprot")
    parser.add_argument("--title", help="database title (default: the --in path, as makeblastdb does)")
    parser.add_argument("--force", action="store_true", help="replace an existing database")
    parser.add_argument(
        "--taxid-map", type=Path, help="lines 'id taxid', as makeblastdb -taxid_map (for -taxids and staxids)"
    )
    parser.add_argument(
        "--no-parse-seqids", dest="parse_seqids", action="store_false",
        help="keep the ids as titles, as makeblastdb does without -parse_seqids (default: -parse_seqids)",
    )  # fmt: skip
    parser.add_argument(
        "--layout", choices=LAYOUTS, default="blastdb",
        help="blastdb (default): one plain BLAST+ database; fragments: the layout of earlier versions (a "
        "whole copy and a copy in fragments, about twice the disk)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress lines, no summary (errors still)")
    args = parser.parse_args(argv)
    say = (lambda _: None) if args.quiet else (lambda msg: print(f"paramedic: {msg}", file=sys.stderr))
    settings = FormatSettings(
        args.input, args.dbtype, args.fragments, args.out, args.title, args.force,
        taxid_map=args.taxid_map, parse_seqids=args.parse_seqids, layout=args.layout,
    )  # fmt: skip
    made = format_database(settings, say)
    if not args.quiet:
        print(
            f"paramedic: formatted {made.nseq:,} sequences ({made.length:,} letters), searched in "
            f"{made.fragments} fragments: {args.out}",
            file=sys.stderr,
        )
    return 0


def _verify(argv: list[str]) -> int:
    """Digest a database's files afresh (a cron job after update_blastdb.pl), so that the next search
    trusts remembered digests that were just made, and say whether any was wrong."""
    from paramedic.db.locate import resolve_database
    from paramedic.db.manifest import in_place_files, verify_volumes
    from paramedic.db.trust import verify
    from paramedic.errors import DatabaseError

    parser = _parser("verify", "Digest every file of a BLAST+ database again and remember the digests.")
    parser.add_argument("-db", required=True, help="the database, as BLAST+'s -db names it")
    parser.add_argument("-dbtype", choices=["prot", "nucl"], help="its molecule type (default: found)")
    args = parser.parse_args(argv)
    database, manifest = resolve_database(args.db, Path.cwd(), digest=False, dbtype=args.dbtype)
    if not manifest.in_place:  # made by `paramedic format`: its manifest holds the digests
        verify_volumes(database.directory, manifest)
        print(f"paramedic: {args.db}: every volume matches its manifest", file=sys.stderr)
        return 0
    total, wrong = verify(in_place_files(manifest))
    if wrong:
        names = ", ".join(p.name for p in wrong[:5]) + (" ..." if len(wrong) > 5 else "")
        raise DatabaseError(
            f"{args.db}: {len(wrong)} file(s) changed although their size and times did not ({names}): "
            "the new digests are remembered; check the disk, or who writes the database"
        )
    print(
        f"paramedic: {args.db}: {len(database.spans)} volume(s), {manifest.nseq:,} sequences, {total:,} bytes "
        f"digested; database digest {manifest.checksum()[:16]}",
        file=sys.stderr,
    )
    return 0


SEARCH_USAGE = "paramedic search PROGRAM -query FILE -db NAME [BLAST+ options] [engine options]"


def _search(argv: list[str]) -> int:
    from paramedic.blast.programs import PROGRAMS

    parser = _search_parser()
    if argv and argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if not argv or argv[0].startswith("-"):
        raise UsageError(f"usage: {SEARCH_USAGE} (paramedic search --help)")
    program, rest = argv[0], argv[1:]
    if program not in PROGRAMS:
        raise UsageError(f"unknown program {program!r}: choose one of {', '.join(PROGRAMS)}")
    if rest and rest[0] in ("-h", "-help", "-version"):
        os.execvp(program, [program, rest[0]])  # BLAST+'s own help or version for a BLAST+ program
    engine_args, blast_args = split_engine_options(rest, parser)
    args = parser.parse_args(engine_args)
    return _run_search(program, args, blast_args, argv)


def _search_parser() -> argparse.ArgumentParser:
    from paramedic.engine.core.settings import FRAGMENT_GROUP_CHOICES, RUNNER_CHOICES, TRACEBACK_CHOICES
    from paramedic.output.strategies import MASTER, OUTPUT_STRATEGIES, output_strategy_names

    parser = _parser(
        "search",
        "Search with BLAST+ in parallel over any BLAST+ database, searched where it lies (or one made by "
        "`paramedic format`). BLAST+ options keep their own single-dash spelling and meaning (PROGRAM is "
        "blastn, blastp, blastx, tblastn or tblastx; `paramedic search PROGRAM -help` shows them); the "
        "engine's options below use double dashes.",
        usage=SEARCH_USAGE,
    )
    parser.add_argument(
        "--np",
        type=int,
        help="worker processes when paramedic starts MPI itself (default: all local cores); "
        "ignored under mpiexec/srun, which give the ranks",
    )
    parser.add_argument(
        "--strategy",
        choices=["auto", "fragments", "queries"],
        default="auto",
        help="fragments: search fragments, merge, regenerate; queries: whole database per task; "
        "auto (default): queries when the whole database fits in half the memory per worker and no "
        "metadata is asked, else fragments; on one node, one BLAST+ run with a thread per core instead "
        "when its cost model predicts it faster and nothing asks for the engine (the run record's "
        "strategy_reason says why, with each plan's predicted seconds)",
    )
    parser.add_argument(
        "--traceback",
        choices=list(TRACEBACK_CHOICES),
        default="auto",
        help="fragments strategy: once: fragment searches stop after BLAST+'s preliminary stage and each "
        "query is aligned once, against the whole database's list; per-fragment: every fragment search "
        "aligns its own hits; auto (default): once when the lists are a small share of the database "
        "(large databases) and no metadata is asked",
    )
    parser.add_argument(
        "--fragment-groups",
        choices=list(FRAGMENT_GROUP_CHOICES),
        default="auto",
        help="fragments strategy: auto (default): when the whole database fits in each worker's memory, "
        "consecutive fragments are searched together in one BLAST+ run (as few runs as keep every worker "
        "busy; each run costs a BLAST+ start and a lookup table); off: one BLAST+ run per fragment",
    )
    parser.add_argument(
        "--runner",
        choices=list(RUNNER_CHOICES),
        default="auto",
        help="without an MPI launcher: local: the workers are threads of this process, each running "
        "BLAST+ (no MPI start-up); mpi: start mpiexec with one rank per worker; auto (default): local "
        "unless --partition-size, a worker --output-strategy or --stage needs MPI ranks. Under mpiexec "
        "or srun the ranks given are used",
    )
    parser.add_argument(
        "--partition-size",
        type=int,
        help="ranks per partition: rank 0 hands query segments to partition masters, each with its own "
        "workers (mpiBLAST's hierarchical scheduling, for many ranks; default: one master for all)",
    )
    parser.add_argument(
        "--replica-group-size",
        type=int,
        help="workers that together hold one copy of the database: each prefers its share of the "
        "fragments (default: any worker any fragment, by cache affinity)",
    )
    parser.add_argument(
        "--output-strategy",
        choices=output_strategy_names(),
        default=MASTER,
        help="who writes the report file: "
        + "; ".join(f"{cls.name}: {cls.help}" for cls in OUTPUT_STRATEGIES.values())
        + " (default master; the others write a file on a filesystem every rank sees: not with -out - "
        "or --site)",
    )
    parser.add_argument("--batch", type=int, help="queries per search task (default: sized automatically)")
    parser.add_argument(
        "--regen-batch",
        type=int,
        help="queries per regeneration run (default: half a search batch when the report is written "
        "from the search's alignments, else 10)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        help="run record path (default: <out>.run.json; with --site, "
        "<out>.run.json under the current directory)",
    )
    parser.add_argument("--metadata", type=Path, help="also save the merged subjects per query (JSON)")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="PAGE.html",
        help="also draw the run record as a self-contained HTML page (as `paramedic report`)",
    )
    parser.add_argument(
        "--from-metadata", type=Path, help="do not search: regenerate the output from saved --metadata"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="discard the finished work an interrupted run of this search kept (its journal, "
        ".<out>.journal) and start afresh; by default the same command continues where it stopped",
    )
    parser.add_argument(
        "--no-journal",
        action="store_true",
        help="keep no journal of finished work (saves its disk space; a stopped run then starts afresh)",
    )
    parser.add_argument(
        "--site",
        help="storage site: tls://HOST:PORT or file:///shared/inbox; -out is then a path under the "
        "site's --root and the run record is written here at that same relative path",
    )
    parser.add_argument(
        "--ship",
        metavar="MODE",
        # checked against the codecs' registry when --site is given (ShipSettings.build): a search
        # without --site imports none of the shipping side
        help="what crosses the link to --site: metadata, compressed or direct (the codecs' modes), or "
        "auto (default: measured choice by the ParaMEDIC rule; only with --site)",
    )
    parser.add_argument("--streams", type=int, default=4, help="parallel TLS streams with --site (default 4)")
    parser.add_argument(
        "--ship-timeout", type=float, default=300.0, help="seconds to keep retrying a lost site (default 300)"
    )
    parser.add_argument(
        "--keys",
        type=Path,
        help="this compute site's keys (from paramedic keys): the TLS client certificate for tls://, "
        "and for file:// the key that signs the inbox jobs (needed when the site's inbox uses --keys)",
    )
    parser.add_argument(
        "--stage",
        type=Path,
        help="node-local cache directory: each fragment is copied there from -db (or a --mirror) the first "
        "time a worker on the node needs it, verified, and reused by later runs (fragments strategy)",
    )
    parser.add_argument(
        "--stage-limit",
        help="bound of the --stage cache, e.g. 500M or 200G: least recently used fragments are evicted; "
        "one that does not fit is searched in place (default: unbounded)",
    )
    parser.add_argument(
        "--stage-copies",
        type=int,
        help="fragment copies from shared storage in flight at once, over the job (each partition's with "
        "--partition-size; default 2), as mpiBLAST's --concurrent",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        help="another replica of the -db database to copy fragments from with --stage: a directory or a "
        "storage site URL (repeatable; its manifest must equal -db's). For a makeblastdb database, the "
        "directory holds it under -db's name (or give its -db path): the same volumes, digests equal",
    )
    return parser


def _run_search(program: str, args: argparse.Namespace, blast_args: list[str], argv: list[str]) -> int:
    if args.np is not None and args.np < 1:
        raise UsageError("--np must be at least 1")  # the launcher's, not the job's: not in the settings

    from paramedic.blast.options import typed_value
    from paramedic.engine.core.settings import SearchSettings
    from paramedic.engine.runtime.launch import launch_or_run

    ship = None
    if args.site is not None:
        from paramedic.ship.destination import ShipSettings

        out = typed_value(blast_args, "out")
        _check_site_db(blast_args)
        ship = ShipSettings.build(
            args.site, args.keys, args.ship or "auto", out, args.streams, args.ship_timeout
        )
    elif args.ship is not None:
        raise UsageError(
            f"--ship {args.ship} says what crosses the link to a storage site: give --site tls://HOST:PORT "
            "(or file:///DIR), or drop --ship to write -out here"
        )

    stage = None
    if args.stage is not None:
        from paramedic.db.stage import parse_size
        from paramedic.engine.core.settings import DEFAULT_STAGE_COPIES, StageSettings

        stage = StageSettings(
            directory=args.stage.absolute(),
            limit=parse_size(args.stage_limit) if args.stage_limit is not None else None,
            mirrors=tuple(args.mirror),
            keys=args.keys,
            copies=DEFAULT_STAGE_COPIES if args.stage_copies is None else args.stage_copies,
        )
    else:
        for flag, value in (("--stage-limit", args.stage_limit), ("--stage-copies", args.stage_copies)):
            if value is not None:
                raise UsageError(f"{flag} bounds the --stage cache: give --stage DIR")
        if args.mirror:
            raise UsageError("--mirror is read into the --stage cache: give --stage DIR")

    settings = SearchSettings(
        program=program,
        blast_args=blast_args,
        batch=args.batch,
        piece_queries=args.regen_batch,
        quiet=args.quiet,
        record=args.record,
        save_metadata=args.metadata,
        from_metadata=args.from_metadata,
        strategy=args.strategy,
        traceback=args.traceback,
        fragment_groups=args.fragment_groups,
        ship=ship,
        restart=args.restart,
        journal=not args.no_journal,
        partition_size=args.partition_size,
        replica_group_size=args.replica_group_size,
        output_strategy=args.output_strategy,
        stage=stage,
        report=_report_page(args.report),
        runner=args.runner,
    )
    settings, argv = _descriptor_query(settings, argv)
    return launch_or_run(settings, workers=args.np, argv=["search", *argv])


def _descriptor_query(settings: SearchSettings, argv: list[str]) -> tuple[SearchSettings, list[str]]:
    """`-query /dev/fd/63` (a process substitution) names a descriptor of this process, which mpiexec
    does not pass on: when this process starts mpiexec, the descriptor becomes its standard input, which
    mpiexec forwards to rank 0, and the query `-` (read once there), in the settings and in the command
    line the ranks are given (`argv`). The local runner and ranks under the
    user's own mpiexec read it where it is."""
    from paramedic.blast.options import typed_value
    from paramedic.durable import through_descriptor
    from paramedic.engine.runtime.launch import under_mpi

    query = typed_value(settings.blast_args, "query")
    starts_mpiexec = settings.runner == "mpi" or (
        settings.runner == "auto" and settings.needs_mpi is not None
    )
    if query in (None, "-") or not starts_mpiexec or under_mpi() or not through_descriptor(Path(query)):
        return settings, argv
    try:
        fd = os.open(query, os.O_RDONLY)
    except OSError as exc:
        raise InputError(f"{query}: cannot read: {exc.strerror}") from exc
    os.dup2(fd, 0)
    os.close(fd)
    return dataclasses.replace(settings, blast_args=_stdin_query(settings.blast_args)), _stdin_query(argv)


def _stdin_query(args: list[str]) -> list[str]:
    """`args` with the value of their (first) -query made `-`."""
    changed = list(args)
    changed[changed.index("-query") + 1] = "-"
    return changed


def _check_site_db(blast_args: list[str]) -> None:
    """With --site the -db string goes to the storage site, which names its own replica with it (outfmt 5
    and 7 print it) and refuses a '..' in it: said here, before the search, with what to give instead."""
    from paramedic.blast.options import typed_value

    db = typed_value(blast_args, "db")
    if db is not None and ".." in Path(db).parts:
        raise UsageError(
            f"-db {db}: with --site the -db string is sent to the storage site, which refuses '..' in it; "
            f"give it without '..' (e.g. -db {os.path.normpath(os.path.abspath(db))}, or run from the "
            "database's parent directory)"
        )


def _report_page(page: Path | None) -> Path | None:
    """--report's page, checked before the search: its directory must be there."""
    if page is None:
        return None
    if not page.absolute().parent.is_dir():
        raise UsageError(f"--report {page}: no directory {page.absolute().parent}")
    return page.absolute()


def split_engine_options(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[list[str], list[str]]:
    """Double-dash options are the engine's, everything else is BLAST+'s (order kept). Which engine
    options take a value is read from the search parser, where each option is declared once."""
    parser = parser or _search_parser()
    takes_value = {name for action in parser._actions if action.nargs != 0 for name in action.option_strings}
    engine: list[str] = []
    blast: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            engine.append(arg)
            if name in takes_value and "=" not in arg and i + 1 < len(argv):
                engine.append(argv[i + 1])
                i += 1
        else:
            blast.append(arg)
        i += 1
    return engine, blast


class _Parser(argparse.ArgumentParser):
    examples: list[str] = []

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")

    def format_help(self) -> str:
        """argparse's help, then the command's examples as written (argparse would rewrap them)."""
        if not self.examples:
            return super().format_help()
        title = "examples:" if len(self.examples) > 1 else "example:"
        return super().format_help() + f"\n{title}\n" + "".join(f"  {e}\n" for e in self.examples)


def _parser(command: str, description: str, usage: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog=f"paramedic {command}", description=description, usage=usage, allow_abbrev=False)
    parser.examples = examples(command)
    return parser


def examples(command: str) -> list[str]:
    """The command's examples, from USAGE (one place for them): the indented lines under its name, a line
    ending in a backslash joined with the next."""
    lines = USAGE.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"  {command} ")), len(lines))
    found: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 13):
            break
        if found and found[-1].endswith("\\"):
            found[-1] += "\n    " + line.strip()
        else:
            found.append(line.strip())
    return found


if __name__ == "__main__":
    sys.exit(main())
