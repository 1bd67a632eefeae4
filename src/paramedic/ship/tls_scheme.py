"""`tls://HOST:PORT` (or `grpcs://`): a storage site's `paramedic serve`, reached over TLS with this compute
site's certificate, for shipping (`ship.client`), mirror reads (`ship.replica_client`) and the link probe
of `--ship auto` (`ship.auto`). This module only binds them into the scheme's one plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from paramedic.errors import UsageError
from paramedic.ship.auto import measure_tls_link
from paramedic.ship.client import TlsShipper, finished_job, tls_shipper
from paramedic.ship.replica_client import TlsReplica
from paramedic.ship.transport import Link, Opening, SiteAddress, register_scheme


class TlsScheme:
    name = "tls"
    aliases: tuple[str, ...] = ("grpcs",)

    def address(self, url: str) -> SiteAddress:
        parsed = urlparse(url)
        if not parsed.hostname or parsed.port is None:
            raise UsageError(f"--site {url}: expected tls://HOST:PORT")
        return SiteAddress("tls", parsed.hostname, parsed.port)

    def check(self, address: SiteAddress, keys: Path | None) -> None:
        if keys is None:
            raise UsageError("--site tls://... needs --keys DIR (made by `paramedic keys`)")

    def shipper(self, opening: Opening) -> TlsShipper:
        return tls_shipper(opening)

    def replica(self, url: str, keys: Path | None) -> TlsReplica:
        return TlsReplica(url, keys)

    def measure_link(
        self, address: SiteAddress, keys: Path | None, budget_bytes: int | None
    ) -> tuple[Link | None, str | None]:
        assert keys is not None  # check() refused a TLS site without keys
        return measure_tls_link(address, keys, budget_bytes)

    def finished_job(
        self, address: SiteAddress, keys: Path | None, job_id: str, out: str
    ) -> dict[str, Any] | None:
        return None if keys is None else finished_job(address, keys, job_id, out)


TLS = register_scheme(TlsScheme())
