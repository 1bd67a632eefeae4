"""SIGTERM and SIGHUP as interrupts (Ctrl-C's KeyboardInterrupt, exit 130), for the commands that run
long: search, trace and ship."""

from __future__ import annotations

import signal


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP interrupt, as Ctrl-C does, once: a second signal does not cut short the stop
    (the traced job's end, the site job's cancel), which is bounded in time."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt_once)


def _interrupt_once(signum: int, _frame: object) -> None:
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt


def interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
