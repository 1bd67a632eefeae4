"""Errors a user can act on, each with a documented exit code (docs/ERRORS.md, "Exit codes").

Anything raised as a ParamedicError is printed as one line, `paramedic: error: <message>`, and the
process exits with its code; nothing else reaches the user as a traceback.
"""

from __future__ import annotations


class ParamedicError(Exception):
    """Base class: a clear one-line message and an exit code."""

    exit_code = 1


class UsageError(ParamedicError):
    """Bad command line: unknown or malformed option, missing required option."""

    exit_code = 2


class InputError(ParamedicError):
    """Bad input data: malformed/empty FASTA, wrong sequence type, duplicate ids."""

    exit_code = 3


class DatabaseError(ParamedicError):
    """Missing, incomplete or corrupt formatted database."""

    exit_code = 4


class BlastError(ParamedicError):
    """BLAST+ is not installed, or one of its programs failed."""

    exit_code = 5


class OutputError(ParamedicError):
    """The output path cannot be written."""

    exit_code = 6


class JobError(ParamedicError):
    """The parallel job failed on some rank (the message names the rank and the cause).

    It carries the exit code of the error on the failing rank, so a BLAST+ failure on a worker exits 5.
    """

    exit_code = 7

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InternalError(ParamedicError):
    """A bug, reported as one line (PARAMEDIC_DEBUG=1 shows the traceback)."""

    exit_code = 1
