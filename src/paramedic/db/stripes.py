"""Reading a fragment's volume from the replicas of a database, verified before anyone uses it.

`ReplicaSet` is what a worker holds for a run: the replicas that passed the identity check (manifest
checksum equal to the database's), and what each has done so far (bytes, seconds, failures). A volume is
fetched into a directory the caller owns and is verified against the manifest's SHA-256; bytes that do
not verify are never kept. A replica that fails or serves bytes that do not verify is dropped for the
rest of the run, and the read goes on from the others.

This first version reads each volume from one replica at a time; striping over all of them at once,
steered by measured throughput, replaces `_fetch_from` (issue 14, item 2).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paramedic.db.manifest import Manifest, volume_sha256
from paramedic.db.replicas import MAX_READ_BYTES, Replica, ReplicaError, open_replica
from paramedic.errors import DatabaseError, UsageError

DEFAULT_STRIPE_BYTES = 4 << 20


@dataclass
class ReplicaUse:
    """What one replica did in this run (for the run record)."""

    label: str
    bytes: int = 0
    seconds: float = 0.0
    dropped: str | None = None  # why it was dropped, if it was


@dataclass(frozen=True)
class VolumeFetch:
    volume: str
    bytes: int
    seconds: float


@dataclass
class ReplicaSet:
    replicas: list[Replica]
    uses: list[ReplicaUse] = field(default_factory=list)
    stripe_bytes: int = DEFAULT_STRIPE_BYTES

    def __post_init__(self) -> None:
        if not 0 < self.stripe_bytes <= MAX_READ_BYTES:
            raise UsageError(f"stripe size must be 1..{MAX_READ_BYTES} bytes")
        if not self.uses:
            self.uses = [ReplicaUse(r.label) for r in self.replicas]

    @classmethod
    def open(cls, urls: Sequence[str], manifest: Manifest, keys: Path | None = None) -> ReplicaSet:
        """The replicas at `urls`, each checked to hold the database of `manifest` (refused if not)."""
        replicas: list[Replica] = []
        try:
            for url in urls:
                replica = open_replica(url, keys)
                replicas.append(replica)
                theirs = replica.manifest().checksum()
                if theirs != manifest.checksum():
                    raise DatabaseError(
                        f"replica {replica.label} holds a different database (manifest checksum "
                        f"{theirs[:12]}, expected {manifest.checksum()[:12]}): refused"
                    )
        except BaseException:
            for replica in replicas:
                replica.close()
            raise
        return cls(replicas)

    def live(self) -> list[int]:
        return [i for i, use in enumerate(self.uses) if use.dropped is None]

    def drop(self, index: int, why: str) -> None:
        if self.uses[index].dropped is None:
            self.uses[index].dropped = why

    def fetch_volume(self, volume: str, sha256: str, dest: Path) -> VolumeFetch:
        """Write volume `volume`'s files into directory `dest` and verify them against `sha256`.

        DatabaseError when no replica is left that serves it verified; `dest` may then hold partial
        files, which the caller (who owns `dest`) removes."""
        started = time.monotonic()
        for index in self.live():
            try:
                size = self._fetch_from(index, volume, dest)
            except ReplicaError as exc:
                self.drop(index, str(exc))
                continue
            if volume_sha256(dest, volume) != sha256:
                self.drop(index, f"volume {volume} did not verify against the manifest")
                continue
            return VolumeFetch(volume, size, time.monotonic() - started)
        reasons = "; ".join(f"{u.label}: {u.dropped}" for u in self.uses)
        raise DatabaseError(f"volume {volume}: no replica served it verified ({reasons})")

    def _fetch_from(self, index: int, volume: str, dest: Path) -> int:
        replica, use = self.replicas[index], self.uses[index]
        total = 0
        for file in replica.volume_files(volume):
            with open(dest / file.name, "wb") as fh:
                for offset in range(0, file.size, self.stripe_bytes):
                    length = min(self.stripe_bytes, file.size - offset)
                    t0 = time.monotonic()
                    fh.write(replica.read(file.name, offset, length))
                    use.seconds += time.monotonic() - t0
                    use.bytes += length
                    total += length
                fh.flush()
                os.fsync(fh.fileno())
        return total

    def report(self) -> list[dict[str, object]]:
        return [
            {"replica": u.label, "bytes": u.bytes, "seconds": round(u.seconds, 3), "dropped": u.dropped}
            for u in self.uses
        ]

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
