"""The seam between `paramedic serve` and the ways jobs reach it besides its TLS listener: one plugin each.

A `Receiver` is everything `paramedic serve` knows of one transport's storage-site side: its option (the
option is `--<name>`, its value parsed by `parse`), a line for the site's log, and `start`, which makes it
take jobs into the site's one `JobStore` until stopped. The shared-directory inbox (`--inbox DIR`,
`site.inbox`) is one. The TLS listener is not: it is the site's own server (`site.server`), which also
serves replica reads.

Receivers are found in one registry (`RECEIVERS`); `PLUGINS` names the module that registers each,
imported when `paramedic serve` starts (its `--help` lists every receiver's option). A new transport's
storage site is its receiver module and one line in `PLUGINS`; `serve()` and the CLI take it from here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from paramedic.errors import UsageError
from paramedic.ship.plugins import Registry

if TYPE_CHECKING:
    from paramedic.site.requests import JobRequests
    from paramedic.site.store import JobStore


@dataclass(frozen=True)
class SiteContext:
    """What a receiver is given of the running site."""

    store: JobStore  # every transport's jobs go through it, each under an owner name of its own
    log: Callable[[str], None]  # the site's log (stderr)
    keys: Path | None  # the site's keys (--keys): its CA authenticates peers; None: no TLS, no signatures
    open_idle_seconds: float  # an open job with no request this long expires (--open-idle)
    # a frames transport's answers (`site.requests`): `requests.answer(owner, header, payload)` per request
    requests: JobRequests


class Started(Protocol):
    """A receiver taking jobs (a thread, a socket): stopped when the site stops."""

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Receiver:
    """One way jobs reach the storage site, as `paramedic serve` starts it."""

    name: str  # its option is --<name>; its key in ServeSettings.receivers
    metavar: str
    help: str  # the option's help text
    parse: Callable[[str], Any]  # the option's value from the command line (argparse's `type`)
    describe: Callable[[Any, Path | None], str]  # the log's line for a value and the site's keys
    start: Callable[[Any, SiteContext], Started]  # take jobs until stopped

    @property
    def option(self) -> str:
        return f"--{self.name}"


RECEIVERS: Registry[Receiver] = Registry("receiver")
# The module that registers each receiver, imported when `paramedic serve` starts. A new one is one line here.
PLUGINS = {
    "inbox": "paramedic.site.inbox",
}


def register_receiver(receiver: Receiver) -> Receiver:
    """Register a receiver's plugin under its name (at its module's import)."""
    return RECEIVERS.add(receiver.name, receiver)


def receivers() -> list[Receiver]:
    """Every receiver, its module imported, in `PLUGINS` order (then any a test registered)."""
    for module in PLUGINS.values():
        importlib.import_module(module)
    order = list(PLUGINS)
    return sorted(RECEIVERS.values(), key=lambda r: order.index(r.name) if r.name in order else len(order))


def check_receivers(asked: Mapping[str, Any]) -> None:
    """Every name asked is a known receiver (UsageError naming the known options otherwise)."""
    known = {r.name for r in receivers()}
    for name in asked:
        if name not in known:
            options = ", ".join(f"--{n}" for n in sorted(known)) or "none"
            raise UsageError(f"paramedic serve: no receiver {name!r} (known: {options})")


def start_receivers(
    asked: Mapping[str, Any], site: SiteContext, replica: str, started: list[Started]
) -> None:
    """Start each receiver asked for, in `PLUGINS` order, into `started` (the caller's, so that it stops
    those started whatever interrupts this), each logged with the site's replica."""
    for receiver in receivers():
        if asked.get(receiver.name) is None:
            continue
        value = asked[receiver.name]
        started.append(receiver.start(value, site))
        site.log(f"{receiver.describe(value, site.keys)}, replica {replica}")


def stop_receivers(started: list[Started], log: Callable[[str], None]) -> None:
    """Stop receivers in the reverse of their start; one whose stop fails is logged, and the others are
    stopped still (the site stops after them)."""
    for receiver in reversed(started):
        try:
            receiver.stop()
        except Exception as exc:
            log(f"a receiver did not stop cleanly: {type(exc).__name__}: {exc}")
