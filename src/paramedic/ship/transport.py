"""The seam between shipping and the ways to reach a storage site: the Transport protocol, the site
address, and the registry of transports by URL scheme.

A transport carries one job's setup, chunks and final request to the storage site (`ship.client`: TLS
streams, `tls://`; `ship.inbox_client`: files in a shared directory, `file://`) and brings back its
answers. It registers itself for its scheme with `@register_transport`; `ship.destination` opens the one
a `--site` URL names. A new transport is one module plus its line in `PLUGINS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from paramedic.errors import ParamedicError, UsageError


class SiteError(ParamedicError):
    """The storage site refused the job, failed it, or could not be reached in time."""

    exit_code = 8


@dataclass(frozen=True)
class SiteAddress:
    scheme: str  # "tls" or "file"
    host: str = ""
    port: int = 0
    path: Path | None = None

    @classmethod
    def parse(cls, url: str) -> SiteAddress:
        parsed = urlparse(url)
        if parsed.scheme in ("tls", "grpcs"):
            if not parsed.hostname or parsed.port is None:
                raise UsageError(f"--site {url}: expected tls://HOST:PORT")
            return cls("tls", parsed.hostname, parsed.port)
        if parsed.scheme == "file":
            if not parsed.path:
                raise UsageError(f"--site {url}: expected file:///path/to/inbox")
            return cls("file", path=Path(parsed.path))
        raise UsageError(f"--site {url}: the scheme must be tls:// (or grpcs://) or file://")

    def __str__(self) -> str:
        return f"file://{self.path}" if self.scheme == "file" else f"tls://{self.host}:{self.port}"


@dataclass
class ShipStats:
    chunks: int = 0
    payload_bytes: int = 0
    wire_bytes: int = 0
    resent: int = 0
    reconnects: int = 0
    setup_bytes: int = 0
    first_send: float | None = None  # perf_counter of the first chunk sent
    last_ack: float | None = None  # perf_counter of the last acknowledgement

    @property
    def transfer_seconds(self) -> float | None:
        """From the first chunk out to the last acknowledgement in (overlaps the search)."""
        if self.first_send is None or self.last_ack is None:
            return None
        return round(self.last_ack - self.first_send, 3)


@dataclass(frozen=True)
class Opening:
    """What a transport needs to open a job at the site."""

    address: SiteAddress
    keys: Path | None  # this compute site's keys (TLS client certificate; the inbox's signing key)
    codec: str
    setup: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""  # the setup's payload (for the BLAST codec: the queries)
    streams: int = 4
    timeout: float = 300.0  # --ship-timeout
    job_id: str | None = None  # reach an existing job (to cancel it); None: a new job


class Transport(Protocol):
    """One job at one storage site."""

    job_id: str
    stats: ShipStats

    def start(self) -> None:
        """Open the job (a refusal, e.g. a replica mismatch, raises SiteError here)."""
        ...

    def send(self, header: dict[str, Any], payload: bytes) -> None:
        """A chunk; delivered durably, in the background, resent until acknowledged."""
        ...

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        """Every chunk is sent: wait for the site's final file; its size and digest."""
        ...

    def cancel(self) -> None:
        """The compute job failed: the site drops the job (best effort)."""
        ...

    def close(self) -> None: ...


TransportFactory = Callable[[Opening], Transport]
TRANSPORTS: dict[str, TransportFactory] = {}
# The module that registers each scheme's transport, imported when a site of that scheme is first
# opened: a search that ships nothing does not import TLS and its client at start.
PLUGINS = {"tls": "paramedic.ship.client", "file": "paramedic.ship.inbox_client"}


def register_transport(scheme: str) -> Callable[[TransportFactory], TransportFactory]:
    def register(factory: TransportFactory) -> TransportFactory:
        TRANSPORTS[scheme] = factory
        return factory

    return register


def open_transport(opening: Opening) -> Transport:
    """The transport for the opening's address (not started)."""
    scheme = opening.address.scheme
    if scheme not in TRANSPORTS and scheme in PLUGINS:
        importlib.import_module(PLUGINS[scheme])
    factory = TRANSPORTS.get(scheme)
    if factory is None:
        raise UsageError(f"no transport for {opening.address.scheme}:// sites")
    return factory(opening)
