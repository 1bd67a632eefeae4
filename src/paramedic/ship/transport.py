"""The seam between the compute site and the ways to reach a storage site: one plugin per URL scheme.

A `Scheme` is everything one kind of URL does at the compute site: it parses a `--site` address (and says
what it needs, e.g. `--keys`), opens the `Shipper` that carries a job's setup, chunks and final request
(`ship.client`: TLS streams, `tls://`; `ship.inbox_client`: files in a shared directory, `file://`),
reads a `--mirror` replica's files (`db.replicas.Replica`), measures the link for `--ship auto`, and asks
whether an earlier run's job was published. Schemes are found in one registry (`SCHEMES`); `PLUGINS`
names the module that registers each, imported when a URL of that scheme is first met (a search that ships
nothing imports no TLS). A new transport is its client module, its site module and one line in `PLUGINS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from paramedic.db.replicas import LocalReplica, Replica
from paramedic.errors import ParamedicError, UsageError
from paramedic.ship.plugins import Registry


class SiteError(ParamedicError):
    """The storage site refused the job, failed it, or could not be reached in time."""

    exit_code = 8


@dataclass(frozen=True)
class SiteAddress:
    """A storage site's address, as its scheme parsed it: a host and port, or a path."""

    scheme: str  # a registered scheme's name ("tls", "file")
    host: str = ""
    port: int = 0
    path: Path | None = None

    @classmethod
    def parse(cls, url: str) -> SiteAddress:
        """The address of `--site URL` (UsageError for an unknown scheme or a malformed URL)."""
        return scheme_named(urlparse(url).scheme, f"--site {url}").address(url)

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.scheme}://{self.path}"
        return f"{self.scheme}://{self.host}:{self.port}"


@dataclass(frozen=True)
class Link:
    """The link to a storage site as measured for `--ship auto` (ship.auto's rule reads it)."""

    rtt_seconds: float
    bandwidth_bytes_per_second: float
    probe_bytes: int


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
    """What a shipper needs to open a job at the site."""

    address: SiteAddress
    keys: Path | None  # this compute site's keys (TLS client certificate; the inbox's signing key)
    codec: str
    setup: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""  # the setup's payload (for the BLAST codec: the queries)
    streams: int = 4
    timeout: float = 300.0  # --ship-timeout
    job_id: str | None = None  # reach an existing job (to cancel it); None: a new job


class Shipper(Protocol):
    """One job at one storage site: its setup, chunks and final request carried there, the answers back."""

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


class Scheme(Protocol):
    """One URL scheme at the compute site: shipping and mirror reads through one plugin."""

    name: str  # the scheme addresses carry ("tls"); registered under it and under `aliases`
    aliases: tuple[str, ...]

    def address(self, url: str) -> SiteAddress:
        """Parse `--site url` (UsageError naming the expected form)."""
        ...

    def check(self, address: SiteAddress, keys: Path | None) -> None:
        """What a site of this scheme needs beyond its address (UsageError, e.g. no --keys for TLS)."""
        ...

    def shipper(self, opening: Opening) -> Shipper:
        """The shipper of one job (not started)."""
        ...

    def replica(self, url: str, keys: Path | None) -> Replica:
        """The `--mirror url` replica (UsageError when the scheme serves no mirror reads)."""
        ...

    def measure_link(
        self, address: SiteAddress, keys: Path | None, budget_bytes: int | None
    ) -> tuple[Link | None, str | None]:
        """For `--ship auto`: the link (None: nothing to measure) and the site's manifest checksum (None:
        it does not say)."""
        ...

    def finished_job(
        self, address: SiteAddress, keys: Path | None, job_id: str, out: str
    ) -> dict[str, Any] | None:
        """The site's `done` answer for an earlier run's job that published `out`, else None (best effort)."""
        ...


SCHEMES: Registry[Scheme] = Registry("transport")
# The module that registers each scheme's plugin, imported when a URL of that scheme is first met: a search
# that ships nothing does not import TLS and its client at start. A new transport is one line here.
PLUGINS = {
    "tls": "paramedic.ship.tls_scheme",
    "grpcs": "paramedic.ship.tls_scheme",
    "file": "paramedic.ship.inbox_client",
}


def register_scheme(scheme: Scheme) -> Scheme:
    """Register a scheme's plugin under its name and aliases (at its module's import)."""
    for name in (scheme.name, *scheme.aliases):
        SCHEMES.add(name, scheme)
    return scheme


def scheme_named(name: str, what: str) -> Scheme:
    """The plugin of scheme `name`, its module imported on first use; UsageError naming `what` if none."""
    if name not in SCHEMES and name in PLUGINS:
        importlib.import_module(PLUGINS[name])
    if name not in SCHEMES:
        known = ", ".join(f"{n}://" for n in sorted(set(PLUGINS) | set(SCHEMES)))
        raise UsageError(f"{what}: unknown scheme {name!r} (known: {known})")
    return SCHEMES[name]


def open_shipper(opening: Opening) -> Shipper:
    """The shipper of one job to the opening's address (not started)."""
    return scheme_named(opening.address.scheme, f"--site {opening.address}").shipper(opening)


def open_replica(url: str, keys: Path | None = None) -> Replica:
    """The replica at `url` (`--mirror`, or the -db directory): a directory path, or a scheme's URL."""
    if "://" not in url:
        return LocalReplica(Path(url).resolve())
    return scheme_named(urlparse(url).scheme, f"--mirror {url}").replica(url, keys)
