"""`paramedic search`: the command line checked and made into the engine's `SearchSettings`, then launched
(the local runner, or mpiexec); a query read through a descriptor of this process is handed on as
standard input."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.cli.search_options import SEARCH_USAGE, search_parser, split_engine_options
from paramedic.cli.signals import interrupt
from paramedic.errors import InputError, UsageError

if TYPE_CHECKING:  # the engine is imported by the commands that run it
    from paramedic.engine.core.settings import SearchSettings


def search_command(argv: list[str]) -> int:
    from paramedic.engine.runtime.launch import under_mpi

    if not under_mpi():
        # the launching process: SIGTERM or SIGHUP before the job's supervisor takes them over (while
        # the modules load and the job is checked) is an interrupt too (exit 130, one line)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, interrupt)
    return _search(argv)


def _search(argv: list[str]) -> int:
    from paramedic.blast.programs import PROGRAMS

    parser = search_parser()
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
