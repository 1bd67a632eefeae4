"""`paramedic keys` and `paramedic serve`: the storage site's certificates, and the storage site itself."""

from __future__ import annotations

import sys
from pathlib import Path

from paramedic.cli.parsing import byte_size, command_parser
from paramedic.cli.signals import stop_site_on_signals


def keys_command(argv: list[str]) -> int:
    from paramedic.site.keys import make_keys

    parser = command_parser(
        "keys", "Make a private CA and TLS certificates for a storage site and compute sites."
    )
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


def serve_command(argv: list[str]) -> int:
    from paramedic.site.receivers import receivers
    from paramedic.site.server import ServeSettings, serve
    from paramedic.site.space import Quota

    parser = command_parser(
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
        type=byte_size,
        metavar="BYTES",
        help="bytes one job may hold (e.g. 50G; default: no bound)",
    )
    parser.add_argument(
        "--site-quota",
        type=byte_size,
        metavar="BYTES",
        help="bytes all the jobs of one compute site may hold, the outputs they published here included "
        "(e.g. 500G; default: half of the free space above --reserve plus what the compute site holds: "
        "whoever comes next finds half of what is free)",
    )
    parser.add_argument(
        "--reserve",
        type=byte_size,
        default=256 * 2**20,
        metavar="BYTES",
        help="free space kept on the file systems of --root and the state (default 256M); a job that "
        "would go below it fails and its data is removed",
    )
    parser.add_argument(
        "--max-setup",
        type=byte_size,
        default=64 * 2**20,
        metavar="BYTES",
        help="the most a job's queries may take, uncompressed (default 64M): the site holds them on disk, "
        "but parses them in memory once per job and once per restart",
    )
    parser.add_argument(
        "--trace-memory",
        type=byte_size,
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
    stop_site_on_signals()
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
