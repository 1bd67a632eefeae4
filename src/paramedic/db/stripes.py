"""Reading a fragment's volume from the replicas of a database, striped over all of them, verified.

`ReplicaSet` is what a worker holds for a run: the replicas that passed the identity check (manifest
checksum equal to the database's), and what each has done so far (bytes, busy seconds, stripes, measured
rate, why it was skipped or dropped). A volume's files are cut into stripes (default 4 MiB) read from all
live replicas at once, a few reads in flight per replica (threads), into a directory the caller owns.

Steering (`policy="adaptive"`, the default): a replica pulls the next stripe whenever one of its reads is
free, so a fast replica reads more. Every live replica not known to be slow is given the first stripe
of its own when a volume starts (a local replica reads faster than a thread starts, and would otherwise
take every stripe before the others' readers run: they would never be measured, nor checked). Each replica's throughput is measured (bytes per busy second over its
last few reads, lowered at once by a read that is overdue), and a replica more than `skip_ratio` times
below the fastest live replica's stops getting stripes (hot-spot skipping: CEFT-PVFS's answer to a
stressed disk); it gets one probe stripe every `probe_seconds`, so a replica that recovers is used again.
Near the end, a free fast replica reads a stripe again that a slow one is still holding; the first copy
in wins. `policy="round-robin"` is plain striping (stripe i from replica i mod n, no skipping, no
re-issue), kept as the baseline the paper measured.

Verification: the manifest has one SHA-256 per volume, not per stripe. When an assembly does not verify,
each replica that served stripes is suspected in turn: its stripes are read again from another replica
and, where the bytes differ, replaced; the assembly that then verifies names the bad replica, which is
dropped for the rest of the run (a replica that fails a read is dropped too), and the verified volume is
returned. If no single suspect explains it, the volume is read whole from each replica alone. Bytes that
do not verify are never returned as a volume.

`ReplicaSet` is the front of the parts that do this, one job each: `db.replica_open` (opening the replicas
and racing the mirrors), `db.replica_health` (what each replica did, its measured rate, the run record),
`db.volume_listings` (how the replicas list a volume, checked and grouped), `db.volume_stripes` (one
volume's stripes and who holds them), `db.steering` (which stripe a replica reads next),
`db.striped_read` (the readers) and `db.volume_repair` (a copy that does not verify).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paramedic.db.manifest import Manifest, volume_sha256
from paramedic.db.replica_health import DEFAULT_INFLIGHT, ReplicaHealth, ReplicaUse
from paramedic.db.replica_open import MIRROR_OPEN_SECONDS, open_replicas
from paramedic.db.replicas import MAX_READ_BYTES, Replica, ReplicaOpener, open_directory_replica
from paramedic.db.steering import Steering
from paramedic.db.striped_read import StripedRead
from paramedic.db.volume_listings import MIRROR_LIST_SECONDS, drop_other_listings, listings
from paramedic.db.volume_repair import Repair
from paramedic.db.volume_stripes import Fetch
from paramedic.errors import DatabaseError, UsageError

# the set's own vocabulary, from the parts that define it (the mirrors' bounds: their tests set them)
__all__ = [
    "DEFAULT_INFLIGHT",
    "MIRROR_LIST_SECONDS",
    "MIRROR_OPEN_SECONDS",
    "ReplicaSet",
    "ReplicaUse",
    "VolumeFetch",
]

DEFAULT_STRIPE_BYTES = 4 << 20
DEFAULT_SKIP_RATIO = 4.0  # a replica this many times slower than the fastest gets no stripes
DEFAULT_PROBE_SECONDS = 5.0  # a skipped replica gets one stripe this often, to notice a recovery
POLICIES = ("adaptive", "round-robin")


@dataclass(frozen=True)
class VolumeFetch:
    volume: str
    bytes: int
    seconds: float
    stripes: int = 0
    served: dict[str, int] = field(default_factory=dict)  # replica label -> stripes it delivered


@dataclass
class ReplicaSet:
    replicas: list[Replica]
    uses: list[ReplicaUse] = field(default_factory=list)
    stripe_bytes: int = DEFAULT_STRIPE_BYTES
    policy: str = "adaptive"
    skip_ratio: float = DEFAULT_SKIP_RATIO
    probe_seconds: float = DEFAULT_PROBE_SECONDS
    inflight: int | None = None  # reads in flight per replica (None: the replica's own `parallelism`)
    max_bytes: int | None = None  # the current copy's bound (fetch_volume's max_bytes)
    required: int | None = None  # the first so many are waited for; later ones (mirrors) are raced
    # a copy's digest (directory, volume), compared with what fetch_volume is given: SHA-256 over a
    # formatted database's volume; a database in place's units have BLAKE3s (paramedic.db.units)
    digest_of: Callable[[Path, str], str] = volume_sha256

    def __post_init__(self) -> None:
        if not 0 < self.stripe_bytes <= MAX_READ_BYTES:
            raise UsageError(f"stripe size must be 1..{MAX_READ_BYTES} bytes")
        if self.policy not in POLICIES:
            raise UsageError(f"stripe policy must be one of {', '.join(POLICIES)}")
        if not self.skip_ratio > 1:
            raise UsageError("the skip ratio must be above 1")
        if self.inflight is not None and not 1 <= self.inflight <= 64:
            raise UsageError("reads in flight per replica must be 1..64")
        if not self.uses:
            self.uses = [ReplicaUse(r.label) for r in self.replicas]
        for replica, use in zip(self.replicas, self.uses, strict=True):
            own = getattr(replica, "parallelism", DEFAULT_INFLIGHT)
            use.parallelism = self.inflight or (own if isinstance(own, int) and 1 <= own <= 64 else 2)
        self.health = ReplicaHealth(self.replicas, self.uses)
        self.cond = self.health.cond
        self.steering = Steering(self.health, self.skip_ratio, self.probe_seconds)
        self.reader = StripedRead(self.health, self.steering)
        self.repair = Repair(self.health, self.digest_of, self.stripe_bytes)

    @classmethod
    def open(
        cls,
        urls: Sequence[str],
        manifest: Manifest,
        keys: Path | None = None,
        required: int | None = None,
        opener: ReplicaOpener = open_directory_replica,
        dropped: Mapping[str, str] | None = None,
        **options: object,
    ) -> ReplicaSet:
        """The replicas at `urls`, each checked to hold the database of `manifest` (refused if not).
        `options`: the dataclass's tuning fields (stripe_bytes, policy, skip_ratio, ...).

        `required`: how many of the first URLs must be reachable (the -db directory); a later one that
        cannot be reached or serves no reads is an extra source lost, not the run's end: it is listed as
        dropped, with why (a replica of another database is still refused: a mistake to say at once).

        `dropped`: extra mirrors (URL -> why) that the job's check at its start already dropped: listed as
        dropped ("at the job's start"), never opened, so that each rank does not wait MIRROR_OPEN_SECONDS
        for a mirror the job knows is down or slow."""
        replicas, absent = open_replicas(urls, manifest, keys, required, opener, dropped)
        try:
            made = cls(replicas, **options)  # type: ignore[arg-type]
        except BaseException:
            for replica in replicas:
                replica.close()
            raise
        made.required = required
        for position, why in absent.items():
            made.uses[position].dropped = why
        return made

    def live(self) -> list[int]:
        return self.health.live()

    def drop(self, index: int, why: str) -> None:
        self.health.drop(index, why)

    # -- one volume -------------------------------------------------------------------------------------
    def fetch_volume(self, volume: str, sha256: str, dest: Path, max_bytes: int | None = None) -> VolumeFetch:
        """Write volume `volume`'s files into directory `dest` and verify them against `sha256`.

        `max_bytes`: the most the copy may write (the stage cache's limit): a replica listing the volume
        larger is dropped before a byte is read from it, even when several agree (colluding mirrors).
        DatabaseError when no replica is left that serves it verified; `dest` may then hold partial
        files, which the caller (who owns `dest`) removes."""
        started = time.monotonic()
        self.max_bytes = max_bytes
        groups = listings(self.health, volume, self.required, max_bytes)
        for files, servers in groups:
            fetch = Fetch(files, self.stripe_bytes, servers, self.policy)
            try:
                if not self.reader.run(fetch, dest, volume):
                    continue
                if self.digest_of(dest, volume) == sha256 or self.repair.blame(fetch, dest, volume, sha256):
                    drop_other_listings(self.health, groups, files, volume)
                    return self._done(fetch, volume, started)
            finally:
                self.reader.close(fetch)
        for index in self.live():  # no assembly explained: each replica alone
            size = self.repair.whole_from(index, volume, sha256, dest, max_bytes)
            if size is not None:
                return VolumeFetch(volume, size, time.monotonic() - started, 0, {self.uses[index].label: 0})
        reasons = "; ".join(f"{u.label}: {u.dropped}" for u in self.uses)
        raise DatabaseError(f"volume {volume}: no replica served it verified ({reasons})")

    def _done(self, fetch: Fetch, volume: str, started: float) -> VolumeFetch:
        served: dict[str, int] = {}
        for stripe in fetch.stripes:
            if stripe.done_by is not None:
                label = self.uses[stripe.done_by].label
                served[label] = served.get(label, 0) + 1
        size = sum(f.size for f in fetch.files)
        return VolumeFetch(volume, size, time.monotonic() - started, len(fetch.stripes), served)

    # -- the run record -------------------------------------------------------------------------------------
    def report(self) -> list[dict[str, object]]:
        """Per replica: bytes, busy seconds, stripes, throughput, and whether it was skipped or dropped."""
        return self.health.report()

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
