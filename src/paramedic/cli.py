"""Command line: parsing only. Builds typed settings and calls the library.

    paramedic format --in db.fasta[.gz] --dbtype prot --fragments 8 --out dbs/uniprot
    paramedic search blastp -query q.fasta -db dbs/uniprot -out hits.txt [BLAST+ options] [--np N] ...
    paramedic keys --out keys/ --server storage.example.org --client compute-a
    paramedic serve --replica dbs/uniprot --root /data/results --listen 0.0.0.0:7700 --keys keys/server
    paramedic search blastp ... -out run42/hits.txt --site tls://storage.example.org:7700 \
        --keys keys/compute-a --ship metadata

BLAST+ options keep their single-dash spelling; the engine's own options use double dashes.
Exit codes: 0 success, 1 internal error, 2 usage, 3 input data, 4 database, 5 BLAST+, 6 output, 7 job
failure on some rank, 8 storage site (refused, failed or unreachable), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from paramedic import __version__
from paramedic.errors import ParamedicError, UsageError

# Environment variables that MPI launchers (MPICH/Hydra, Open MPI, PMIx, Slurm's srun) set in each rank.
MPI_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")
ENGINE_OPTIONS_WITH_VALUE = {
    "--np",
    "--batch",
    "--regen-batch",
    "--record",
    "--metadata",
    "--from-metadata",
    "--strategy",
    "--site",
    "--keys",
    "--ship",
    "--streams",
    "--ship-timeout",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except ParamedicError as exc:
        print(f"paramedic: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("paramedic: interrupted", file=sys.stderr)
        return 130
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
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"paramedic {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "format":
        return _format(rest)
    if command == "search":
        return _search(rest)
    if command == "keys":
        return _keys(rest)
    if command == "serve":
        return _serve(rest)
    raise UsageError(f"unknown command {command!r} (commands: format, search, keys, serve)")


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
    from paramedic.site.server import ServeSettings, serve

    parser = _parser("serve", "Storage site: receive output or metadata over TLS and write the output.")
    parser.add_argument(
        "--replica", required=True, type=Path, help="the site's copy of the formatted database"
    )
    parser.add_argument("--root", required=True, type=Path, help="directory that receives the output files")
    parser.add_argument("--listen", default="0.0.0.0:7700", help="HOST:PORT (default 0.0.0.0:7700)")
    parser.add_argument(
        "--keys", type=Path, help="the server's keys (from paramedic keys) for the TLS listener"
    )
    parser.add_argument("--io-workers", type=int, default=2, help="regeneration workers (default 2)")
    parser.add_argument("--inbox", type=Path, help="also take jobs from this shared directory")
    parser.add_argument("--state", type=Path, help="job state directory (default <root>/.paramedic-state)")
    parser.add_argument(
        "--expire-after",
        type=float,
        default=168.0,
        metavar="HOURS",
        help="a job idle this long moves on: an open one fails as expired, a done or failed one's record "
        "is deleted (default 168 = 7 days)",
    )
    args = parser.parse_args(argv)
    if args.io_workers < 1:
        raise UsageError("--io-workers must be at least 1")
    if not args.expire_after > 0:
        raise UsageError("--expire-after must be a positive number of hours")
    return serve(
        ServeSettings(
            args.replica,
            args.root,
            args.listen,
            args.keys,
            args.io_workers,
            args.inbox,
            args.state,
            args.expire_after,
        )
    )


def _format(argv: list[str]) -> int:
    from paramedic.db.format import FormatSettings, format_database

    parser = _parser("format", "Split a FASTA database into BLAST+ fragments with a manifest.")
    parser.add_argument("--in", dest="input", required=True, type=Path, help="FASTA file, plain or gzip")
    parser.add_argument("--dbtype", required=True, choices=["prot", "nucl"])
    parser.add_argument("--fragments", required=True, type=int, help="number of fragments")
    parser.add_argument("--out", required=True, type=Path, help="database name, e.g. dbs/uniprot")
    parser.add_argument("--title", help="database title (default: the --in path, as makeblastdb does)")
    parser.add_argument("--force", action="store_true", help="replace an existing database")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    say = (lambda _: None) if args.quiet else (lambda msg: print(f"paramedic: {msg}", file=sys.stderr))
    manifest = format_database(
        FormatSettings(args.input, args.dbtype, args.fragments, args.out, args.title, args.force), say
    )
    if not args.quiet:
        sizes = ", ".join(f"{f.length:,}" for f in manifest.fragments)
        print(
            f"paramedic: formatted {manifest.nseq:,} sequences ({manifest.length:,} letters) into "
            f"{len(manifest.fragments)} fragments of {sizes} letters: {args.out}",
            file=sys.stderr,
        )
    return 0


def _search(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        raise UsageError("usage: paramedic search PROGRAM -query FILE -db NAME [BLAST+ options] [--np N]")
    program, rest = argv[0], argv[1:]
    if rest and rest[0] in ("-h", "-help", "-version"):
        os.execvp(program, [program, rest[0]])
    engine_args, blast_args = split_engine_options(rest)
    parser = _parser("search", "Search with BLAST+ in parallel over a formatted database.")
    parser.add_argument("--np", type=int, help="worker processes (default: all local cores)")
    parser.add_argument(
        "--strategy",
        choices=["auto", "fragments", "queries"],
        default="auto",
        help="fragments: search fragments, merge, regenerate; queries: whole database per task; "
        "auto (default): queries when the database fits in a quarter of memory and no metadata is asked",
    )
    parser.add_argument("--batch", type=int, help="queries per search task (default: sized automatically)")
    parser.add_argument("--regen-batch", type=int, help="queries per regeneration run (default: 10)")
    parser.add_argument("--record", type=Path, help="run record path (default: <out>.run.json)")
    parser.add_argument("--metadata", type=Path, help="also save the merged subjects per query (JSON)")
    parser.add_argument(
        "--from-metadata", type=Path, help="do not search: regenerate the output from saved --metadata"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    parser.add_argument("--site", help="storage site: tls://HOST:PORT or file:///shared/inbox")
    parser.add_argument("--keys", type=Path, help="this compute site's keys (from paramedic keys)")
    parser.add_argument(
        "--ship",
        choices=["direct", "compressed", "metadata", "auto"],
        default="auto",
        help="what crosses the link with --site (default auto: measured choice)",
    )
    parser.add_argument("--streams", type=int, default=4, help="parallel TLS streams with --site (default 4)")
    parser.add_argument(
        "--ship-timeout", type=float, default=300.0, help="seconds to keep retrying a lost site (default 300)"
    )
    args = parser.parse_args(engine_args)
    for name in ("np", "batch", "regen_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")

    from paramedic.engine.launch import launch_or_run
    from paramedic.engine.settings import SearchSettings

    ship = None
    if args.site is not None:
        from paramedic.ship.destination import ShipSettings

        out = next((blast_args[i + 1] for i, a in enumerate(blast_args[:-1]) if a == "-out"), None)
        ship = ShipSettings.build(args.site, args.keys, args.ship, out, args.streams, args.ship_timeout)

    settings = SearchSettings(
        program=program,
        blast_args=blast_args,
        batch=args.batch,
        regen_group=args.regen_batch,
        quiet=args.quiet,
        record=args.record,
        save_metadata=args.metadata,
        from_metadata=args.from_metadata,
        strategy=args.strategy,
        ship=ship,
    )
    return launch_or_run(settings, workers=args.np, argv=["search", *argv])


def split_engine_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """Double-dash options are the engine's, everything else is BLAST+'s (order kept)."""
    engine: list[str] = []
    blast: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            engine.append(arg)
            if name in ENGINE_OPTIONS_WITH_VALUE and "=" not in arg and i + 1 < len(argv):
                engine.append(argv[i + 1])
                i += 1
        else:
            blast.append(arg)
        i += 1
    return engine, blast


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    return _Parser(prog=f"paramedic {command}", description=description, allow_abbrev=False)


if __name__ == "__main__":
    sys.exit(main())
