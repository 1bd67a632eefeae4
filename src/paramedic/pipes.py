"""A closed standard output (`paramedic ... | head -1`): end quietly, as BLAST+ does (killed by SIGPIPE,
exit 141), with no traceback and no message at exit.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, and the interpreter's own
flush of sys.stdout at exit would raise it again ("Exception ignored ..."): stdout is pointed at
/dev/null first.
"""

from __future__ import annotations

import os
import sys

# 128 + SIGPIPE: what a shell reports for BLAST+ (or cat, or grep) writing into a closed pipe
CLOSED_PIPE_EXIT = 141


def stdout_closed() -> int:
    """Silence stdout for the rest of the process; the exit code to end with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return CLOSED_PIPE_EXIT
