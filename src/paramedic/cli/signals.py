"""SIGTERM and SIGHUP as interrupts (Ctrl-C's KeyboardInterrupt, exit 130), for the commands that run
long: search, trace and ship; and as the storage site's stop (serve)."""

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


def stop_site_on_signals() -> None:
    """SIGTERM and SIGHUP stop `paramedic serve` as Ctrl-C does: it takes no more requests, stops its
    receivers and its listener, and ends once the regenerations under way have finished. A second signal
    ends it at once: its jobs are durable, and its next start takes them up."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_site)


def _stop_site(signum: int, _frame: object) -> None:
    for again in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(again, signal.SIG_DFL)
    raise KeyboardInterrupt
