"""A transport added by following docs/CONTRIBUTING.md "Add a transport" (its compute-site module): the
`mem://NAME` scheme keeps each job's chunks in `SITES[NAME]` and reads mirrors from `DIRECTORIES[NAME]`.
A fake for unit tests of the seam; a real transport talks to a real site."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from paramedic.db.replicas import LocalReplica, Replica
from paramedic.errors import UsageError
from paramedic.ship.transport import Link, Opening, ShipStats, SiteAddress, register_scheme

SITES: dict[str, dict[str, Any]] = {}  # name -> {"setup": ..., "chunks": [...], "done": ...}
DIRECTORIES: dict[str, Path] = {}


class MemoryShipper:
    def __init__(self, opening: Opening):
        self.opening = opening
        self.job_id = opening.job_id or "0" * 32
        self.stats = ShipStats()
        self.site = SITES.setdefault(opening.address.host, {"chunks": []})

    def start(self) -> None:
        self.site["setup"] = (self.opening.codec, self.opening.setup)

    def send(self, header: dict[str, Any], payload: bytes) -> None:
        self.site["chunks"].append((header, payload))
        self.stats.chunks += 1
        self.stats.payload_bytes += len(payload)

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        data = b"".join(payload for _, payload in self.site["chunks"])
        self.site["done"] = {"op": "done", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return self.site["done"]

    def cancel(self) -> None:
        self.site["cancelled"] = True

    def close(self) -> None:
        pass


class MemoryScheme:
    name = "mem"
    aliases: tuple[str, ...] = ()

    def address(self, url: str) -> SiteAddress:
        host = urlparse(url).hostname
        if not host:
            raise UsageError(f"--site {url}: expected mem://NAME")
        return SiteAddress("mem", host)

    def check(self, address: SiteAddress, keys: Path | None) -> None:
        pass

    def shipper(self, opening: Opening) -> MemoryShipper:
        return MemoryShipper(opening)

    def replica(self, url: str, keys: Path | None) -> Replica:
        return LocalReplica(DIRECTORIES[urlparse(url).hostname or ""])

    def measure_link(
        self, address: SiteAddress, keys: Path | None, budget_bytes: int | None
    ) -> tuple[Link | None, str | None]:
        return Link(0.001, 1e6, 0), None

    def finished_job(
        self, address: SiteAddress, keys: Path | None, job_id: str, out: str
    ) -> dict[str, Any] | None:
        return SITES.get(address.host, {}).get("done")


MEMORY = register_scheme(MemoryScheme())
