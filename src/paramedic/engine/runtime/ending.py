"""How a failed or interrupted search ends: its one line and exit code, and whether its finished work is
kept in the journal (the launcher's, the local runner's and a rank's)."""

from __future__ import annotations

import sys
from pathlib import Path

from paramedic.blast.options import typed_value
from paramedic.engine.core.settings import SearchSettings
from paramedic.errors import InternalError, ParamedicError


def say_journal_kept(settings: SearchSettings) -> None:
    """After a failed or interrupted search: whether its finished work waits in a journal (what a killed
    rank left half-written there is removed)."""
    from paramedic.engine.rank.journal import journal_path, tidy

    out = output_path(settings)
    journal = journal_path(out) if out is not None else None
    if journal is not None and journal.is_dir() and tidy(journal):
        print(
            f"paramedic: finished work is kept in {journal}: the same command continues the search, "
            "--restart starts it afresh",
            file=sys.stderr,
            flush=True,
        )


def output_path(settings: SearchSettings) -> Path | None:
    """The local output file (with --site: the run record's stem, the path under the site's root)."""
    if settings.ship is not None:
        return settings.cwd / settings.ship.out
    args = settings.blast_args
    out = typed_value(args, "out")
    if not out or out == "-":
        return None
    return Path(out) if Path(out).is_absolute() else settings.cwd / out


def failure(exc: BaseException) -> tuple[str, int]:
    """What ended a job, as the one line after `paramedic: ` and the exit code (a rank's, the local
    runner's)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(exc, ParamedicError):
        return f"error: {exc}", exc.exit_code
    code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else InternalError.exit_code
    return f"error: internal error: {type(exc).__name__}: {exc} (PARAMEDIC_DEBUG=1 shows more)", code
