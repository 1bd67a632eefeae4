"""Child processes that die with the process that started them (a search's mpiexec, a traced run's).

Killed outright (a user's kill -9, the OOM killer), a launcher cannot stop what it started: mpiexec, in a
session of its own, ran on with its ranks, searching or writing trace logs for nobody. Linux can send a
child SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); elsewhere nothing is asked.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def dies_with_this_process() -> Callable[[], None] | None:
    """A `preexec_fn` that has the child killed (SIGKILL) when this process dies, or None where that
    cannot be asked (not Linux). The call is made ready here, before the fork: the child only makes the
    system call."""
    import ctypes  # here: a local search or trace that starts no mpiexec does not load it (3 ms)

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the request was made
            os._exit(137)

    return arm
