"""Command line: each command's options parsed into typed settings and handed to the library (USAGE is
the user's help), and what the command line owns around them: SIGTERM and SIGHUP as interrupts, one line
and a documented exit code per error (docs/ERRORS.md), a run record and a summary line for `paramedic
ship` and `paramedic trace`, and the process's end (`run`). No search, shipping or tracing logic.

This package holds the dispatch; each command is a module of its own (`commands()` lists them), and a
command imports the library it runs only when it runs, so that `paramedic --help` stays fast."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING

from paramedic import __version__
from paramedic.cli.convert import convert_command
from paramedic.cli.database import format_command, verify_command
from paramedic.cli.report import report_command
from paramedic.cli.search import search_command
from paramedic.cli.search_options import split_engine_options
from paramedic.cli.ship import ship_command
from paramedic.cli.simulate import simulate_command
from paramedic.cli.site import keys_command, serve_command
from paramedic.cli.trace import trace_command
from paramedic.cli.usage import USAGE, examples
from paramedic.errors import ParamedicError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["USAGE", "commands", "examples", "main", "run", "split_engine_options"]


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
        "format": format_command,
        "search": search_command,
        "keys": keys_command,
        "serve": serve_command,
        "simulate": simulate_command,
        "trace": trace_command,
        "ship": ship_command,
        "report": report_command,
        "convert": convert_command,
        "verify": verify_command,
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
