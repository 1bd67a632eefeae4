"""When a volume's striped copy does not verify (`db.stripes`): the manifest has one digest per volume, not
per stripe, so each replica that served stripes is suspected in turn, the most stripes first: its stripes
are read again from another live replica (the fastest first) and, where the bytes differ, replaced; the
copy that then verifies names the bad replica, which is dropped for the run. If no single suspect
explains it, the volume is read whole from each replica alone. Bytes that do not verify are never left
as the volume."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from paramedic.db.replica_health import ReplicaHealth
from paramedic.db.replicas import ReplicaError
from paramedic.db.volume_listings import check_listing, remove_strays
from paramedic.db.volume_stripes import Fetch, Stripe


class Repair:
    """Finding the replica that served a copy bytes that do not verify, and reading around it."""

    def __init__(self, health: ReplicaHealth, digest_of: Callable[[Path, str], str], stripe_bytes: int):
        self.health = health
        self.uses = health.uses
        self.digest_of = digest_of
        self.stripe_bytes = stripe_bytes

    def blame(self, fetch: Fetch, dest: Path, volume: str, sha256: str) -> bool:
        """Find the replica whose stripes made the assembly wrong, drop it, leave the verified volume in
        `dest`; False if no single replica explains it (with `dest` as it was)."""
        by_server: dict[int, list[Stripe]] = {}
        for stripe in fetch.stripes:
            assert stripe.done_by is not None
            by_server.setdefault(stripe.done_by, []).append(stripe)
        for suspect, stripes in sorted(by_server.items(), key=lambda item: -len(item[1])):
            now = time.monotonic()
            witnesses = sorted(  # the fastest first: it reads the suspect's share again
                (s for s in fetch.servers if s != suspect and self.uses[s].dropped is None),
                key=lambda s: -(self.uses[s].current_rate(now) or 0.0),
            )
            for witness in witnesses:
                replaced = self._replace(fetch, witness, stripes)
                if replaced is None:  # the witness failed a read (dropped): try another
                    continue
                if replaced and self.digest_of(dest, volume) == sha256:
                    self.health.drop(
                        suspect,
                        f"served bytes that did not verify (volume {volume}: {len(replaced)} of its "
                        f"{len(stripes)} stripes differ from {self.uses[witness].label}, whose copy verified)",
                    )
                    for stripe, _ in replaced:
                        stripe.done_by = witness
                    return True
                for stripe, original in replaced:  # not this suspect: put its bytes back
                    os.pwrite(fetch.fds[stripe.file], original, stripe.offset)
                break
        return False

    def _replace(
        self, fetch: Fetch, witness: int, stripes: list[Stripe]
    ) -> list[tuple[Stripe, bytes]] | None:
        """Read the suspect's stripes from the witness; where they differ, write the witness's bytes.
        Returns the replaced stripes with the suspect's bytes, or None if the witness failed."""
        replaced: list[tuple[Stripe, bytes]] = []
        replica = self.health.replicas[witness]
        for stripe in stripes:
            name = fetch.files[stripe.file].name
            t0 = time.monotonic()
            try:
                theirs = replica.read(name, stripe.offset, stripe.length)
            except ReplicaError as exc:
                for done, original in replaced:
                    os.pwrite(fetch.fds[done.file], original, done.offset)
                self.health.drop(witness, str(exc))
                return None
            self.health.count(witness, len(theirs), time.monotonic() - t0)
            ours = os.pread(fetch.fds[stripe.file], stripe.length, stripe.offset)
            if theirs != ours:
                os.pwrite(fetch.fds[stripe.file], theirs, stripe.offset)
                replaced.append((stripe, ours))
        return replaced

    def whole_from(
        self, index: int, volume: str, sha256: str, dest: Path, max_bytes: int | None
    ) -> int | None:
        """The last resort: the whole volume from one replica (its size), or None: the replica failed or
        its copy did not verify, and it is dropped."""
        replica = self.health.replicas[index]
        try:
            files = replica.volume_files(volume)
            check_listing(volume, files, max_bytes)
            remove_strays(dest, volume, files)
            for file in files:
                fd = os.open(dest / file.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with open(fd, "wb") as fh:
                    for offset in range(0, file.size, self.stripe_bytes):
                        length = min(self.stripe_bytes, file.size - offset)
                        t0 = time.monotonic()
                        fh.write(replica.read(file.name, offset, length))
                        self.health.count(index, length, time.monotonic() - t0)
                    fh.flush()
                    os.fsync(fh.fileno())
        except ReplicaError as exc:
            self.health.drop(index, str(exc))
            return None
        if self.digest_of(dest, volume) != sha256:
            self.health.drop(index, f"volume {volume} did not verify against the manifest")
            return None
        return sum(f.size for f in files)
