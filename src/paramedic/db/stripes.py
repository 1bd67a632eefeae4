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
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paramedic.db.manifest import Manifest, volume_sha256
from paramedic.db.replicas import (
    MAX_READ_BYTES,
    Replica,
    ReplicaError,
    ReplicaOpener,
    VolumeFile,
    open_directory_replica,
)
from paramedic.errors import DatabaseError, UsageError

DEFAULT_STRIPE_BYTES = 4 << 20
DEFAULT_INFLIGHT = 2  # reads in flight per replica (a remote replica uses one per TLS stream)
DEFAULT_SKIP_RATIO = 4.0  # a replica this many times slower than the fastest gets no stripes
DEFAULT_PROBE_SECONDS = 5.0  # a skipped replica gets one stripe this often, to notice a recovery
POLICIES = ("adaptive", "round-robin")
MIRROR_OPEN_SECONDS = 5.0  # an extra mirror not open (connected, manifest read) by then is dropped
# An extra mirror that has not listed a volume's files this long after the first replica did is dropped
# for the run: the listings are asked side by side (one after another, a mirror that opened and then
# trickled held every volume's copy for its reply's deadline: 120 s, at 5 B/s)
MIRROR_LIST_SECONDS = 5.0
_WINDOW = 8  # a replica's throughput is measured over its last this many reads
_MIN_SAMPLES = 2  # reads before a replica's rate counts for skipping (the first pays for connecting)
_REISSUE_FACTOR = 1.5  # re-read a held stripe when the holder needs this much longer than we would
_MIN_STALL = 0.05  # seconds a read of a replica not yet measured is in flight before it may be re-read
_MAX_NAME = 255


@dataclass
class ReplicaUse:
    """What one replica did in this run (for the run record), and its measured rate (for steering)."""

    label: str
    bytes: int = 0  # read from it, including stripes another replica delivered first
    seconds: float = 0.0  # busy time: at least one of its reads in flight
    stripes: int = 0
    reissued: int = 0  # stripes it read again for a slower replica (end game)
    wasted: int = 0  # bytes it read that another replica had delivered first
    skipped: str | None = None  # why it stopped getting stripes (slow), the last time it did
    dropped: str | None = None  # why it was dropped, if it was
    rate: float = 0.0  # bytes per busy second over the last _WINDOW reads
    samples: int = 0
    window: deque[tuple[float, int]] = field(default_factory=lambda: deque([(0.0, 0)], maxlen=_WINDOW + 1))
    parallelism: int = DEFAULT_INFLIGHT
    inflight: dict[int, tuple[float, int]] = field(default_factory=dict)  # read id -> (start, length)
    busy_since: float = 0.0
    last_start: float = 0.0

    def throughput(self, now: float) -> float:
        """Bytes per busy second so far (what the run record shows)."""
        seconds = self.busy_seconds(now)
        return self.bytes / seconds if seconds > 0 else 0.0

    def busy_seconds(self, now: float) -> float:
        return self.seconds + (now - self.busy_since if self.inflight else 0.0)

    def current_rate(self, now: float) -> float | None:
        """Throughput for steering: the measured one, lowered by a read in flight that is overdue (twice
        what the throughput gives it: a stuck replica looks slow while it is stuck, not only after; a read
        merely queued behind others does not count). None while nothing is known; before two reads are
        measured, only reads in flight say anything (an upper bound)."""
        measured = self.samples >= _MIN_SAMPLES
        low = None
        for start, length in self.inflight.values():
            elapsed = now - start
            expected = length * self.parallelism / self.rate if measured and self.rate > 0 else 0.0
            if elapsed > 0.05 and elapsed > 2 * expected:
                bound = length * self.parallelism / elapsed
                low = bound if low is None else min(low, bound)
        if measured:
            return min(self.rate, low) if low is not None else self.rate
        return low

    def read_seconds(self, length: int) -> float:
        """How long one read of `length` takes with this replica's reads all in flight."""
        return length * self.parallelism / self.rate if self.rate > 0 else float("inf")

    def measured(self) -> bool:
        return self.samples >= _MIN_SAMPLES


@dataclass(frozen=True)
class VolumeFetch:
    volume: str
    bytes: int
    seconds: float
    stripes: int = 0
    served: dict[str, int] = field(default_factory=dict)  # replica label -> stripes it delivered


@dataclass
class _Stripe:
    index: int
    file: int  # index into the volume's files
    offset: int
    length: int
    holders: dict[int, float] = field(default_factory=dict)  # replica -> when its read started
    done_by: int | None = None
    written: bool = False


class _Fetch:
    """One volume's stripes and who reads them; every field is guarded by the set's condition."""

    def __init__(self, files: list[VolumeFile], stripe_bytes: int, servers: list[int], policy: str):
        self.files = files
        self.stripes: list[_Stripe] = []
        for f, file in enumerate(files):
            for offset in range(0, file.size, stripe_bytes):
                self.stripes.append(
                    _Stripe(len(self.stripes), f, offset, min(stripe_bytes, file.size - offset))
                )
        self.pending: deque[int] = deque(range(len(self.stripes)))
        self.servers = servers
        self.policy = policy
        # round robin: each replica's own queue of stripes (stripe i from server i mod n)
        self.own: dict[int, deque[int]] = {r: deque() for r in servers}
        if policy == "round-robin":
            for i in range(len(self.stripes)):
                self.own[servers[i % len(servers)]].append(i)
            self.pending.clear()
        self.written = 0
        self.closed = False
        self.error: OSError | None = None  # writing into `dest` failed (a full disk): the fetch ends
        self.write_lock = threading.Lock()
        self.fds: list[int] = []

    def complete(self) -> bool:
        return self.written == len(self.stripes)


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
        self.cond = threading.Condition()
        self._read_ids = 0

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
        replicas: list[Replica] = []
        absent: dict[int, str] = {}
        known = dict(dropped or {})
        # the extra mirrors open side by side, each given MIRROR_OPEN_SECONDS: one after another, a mirror
        # whose link trickled held the search for its connection's whole timeout (3 s became 57-119 s)
        extra = {
            position: _Opening(url, keys, opener)
            for position, url in enumerate(urls)
            if required is not None and position >= required and url not in known
        }
        deadline = time.monotonic() + MIRROR_OPEN_SECONDS
        try:
            for position, url in enumerate(urls):
                if required is not None and position >= required and url in known:
                    replicas.append(_Absent(url))
                    absent[position] = f"dropped at the job's start, not opened again ({known[url]})"
                    continue
                if position in extra:
                    try:
                        replica, theirs = extra[position].result(deadline)
                    except ReplicaError as exc:
                        replicas.append(_Absent(url))
                        absent[position] = str(exc)
                        continue
                else:
                    replica = opener(url, keys)
                    theirs = replica.manifest().checksum()
                replicas.append(replica)
                if theirs != manifest.checksum():
                    raise DatabaseError(
                        f"replica {replica.label} holds a different database (manifest checksum "
                        f"{theirs[:12]}, expected {manifest.checksum()[:12]}): refused"
                    )
            made = cls(replicas, **options)  # type: ignore[arg-type]
            made.required = required
            for position, why in absent.items():
                made.uses[position].dropped = why
            return made
        except BaseException:
            for opening in extra.values():
                opening.abandon()
            for replica in replicas:
                replica.close()
            raise

    def live(self) -> list[int]:
        return [i for i, use in enumerate(self.uses) if use.dropped is None]

    def drop(self, index: int, why: str) -> None:
        with self.cond:
            if self.uses[index].dropped is None:
                self.uses[index].dropped = why
            self.cond.notify_all()

    # -- one volume -------------------------------------------------------------------------------------
    def fetch_volume(self, volume: str, sha256: str, dest: Path, max_bytes: int | None = None) -> VolumeFetch:
        """Write volume `volume`'s files into directory `dest` and verify them against `sha256`.

        `max_bytes`: the most the copy may write (the stage cache's limit): a replica listing the volume
        larger is dropped before a byte is read from it, even when several agree (colluding mirrors).
        DatabaseError when no replica is left that serves it verified; `dest` may then hold partial
        files, which the caller (who owns `dest`) removes."""
        started = time.monotonic()
        self.max_bytes = max_bytes
        groups = self._listings(volume)
        for files, servers in groups:
            fetch = _Fetch(files, self.stripe_bytes, servers, self.policy)
            try:
                if not self._striped(fetch, dest, volume):
                    continue
                if self.digest_of(dest, volume) == sha256 or self._blame(fetch, dest, volume, sha256):
                    self._drop_other_listings(groups, files, volume)
                    return self._done(fetch, volume, started)
            finally:
                self._close_fetch(fetch)
        for index in self.live():  # no assembly explained: each replica alone
            size = self._whole_from(index, volume, sha256, dest)
            if size is not None:
                return VolumeFetch(volume, size, time.monotonic() - started, 0, {self.uses[index].label: 0})
        reasons = "; ".join(f"{u.label}: {u.dropped}" for u in self.uses)
        raise DatabaseError(f"volume {volume}: no replica served it verified ({reasons})")

    def _listings(self, volume: str) -> list[tuple[list[VolumeFile], list[int]]]:
        """Live replicas grouped by how they list the volume's files, the most agreed-on listing first."""
        groups: dict[tuple[VolumeFile, ...], list[int]] = {}
        live = self.live()
        asked = {index: _Listing(self.replicas[index], volume) for index in live}
        required = len(self.uses) if self.required is None else self.required
        deadline: float | None = None  # the mirrors' race: from the first listing that came in
        for index in sorted(live, key=lambda i: i >= required):  # the required replicas first
            if index >= required and deadline is None:
                deadline = _first_listed(asked.values()) + MIRROR_LIST_SECONDS
            try:
                files = asked[index].result(deadline if index >= required else None)
                _check_listing(volume, files, self.max_bytes)
            except ReplicaError as exc:
                self.drop(index, str(exc))
                continue
            groups.setdefault(tuple(files), []).append(index)
        return sorted(((list(k), v) for k, v in groups.items()), key=lambda g: -len(g[1]))

    def _drop_other_listings(
        self, groups: list[tuple[list[VolumeFile], list[int]]], files: list[VolumeFile], volume: str
    ) -> None:
        for other, servers in groups:
            if other != files:
                for index in servers:
                    self.drop(index, f"lists volume {volume}'s files differently from the verified copy")

    def _done(self, fetch: _Fetch, volume: str, started: float) -> VolumeFetch:
        served: dict[str, int] = {}
        for stripe in fetch.stripes:
            if stripe.done_by is not None:
                label = self.uses[stripe.done_by].label
                served[label] = served.get(label, 0) + 1
        size = sum(f.size for f in fetch.files)
        return VolumeFetch(volume, size, time.monotonic() - started, len(fetch.stripes), served)

    def _striped(self, fetch: _Fetch, dest: Path, volume: str) -> bool:
        """Read every stripe from the live servers into `dest`; False when they all failed first."""
        for file in fetch.files:
            fd = os.open(dest / file.name, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            fetch.fds.append(fd)
            os.ftruncate(fd, file.size)
        _remove_strays(dest, volume, fetch.files)
        depth = max(self.uses[r].parallelism for r in fetch.servers)
        threads = [  # interleaved, so that no replica's readers start long before the others'
            threading.Thread(target=self._reader, args=(fetch, r), daemon=True, name=f"stripe-{r}-{k}")
            for k in range(depth)
            for r in fetch.servers
            if k < self.uses[r].parallelism
        ]
        with self.cond:
            if fetch.policy == "adaptive":  # each replica's first stripe is its own (the docstring's why)
                now = time.monotonic()
                for r in fetch.servers:
                    if fetch.pending and self.uses[r].dropped is None and self._slow(fetch, r, now) is None:
                        fetch.own[r].append(fetch.pending.popleft())
        for thread in threads:
            thread.start()
        with self.cond:
            while (
                not fetch.complete()
                and fetch.error is None
                and any(self.uses[r].dropped is None for r in fetch.servers)
            ):
                self.cond.wait(0.5)
            ok = fetch.complete()
            fetch.closed = True
            self.cond.notify_all()
        if fetch.error is not None:  # our own disk, not a replica: the caller decides (e.g. search in place)
            raise fetch.error
        if ok:
            for fd in fetch.fds:
                os.fsync(fd)
        return ok

    def _close_fetch(self, fetch: _Fetch) -> None:
        with self.cond:
            fetch.closed = True
            self.cond.notify_all()
        with fetch.write_lock:
            fds, fetch.fds = fetch.fds, []
        for fd in fds:
            os.close(fd)

    # -- the readers ------------------------------------------------------------------------------------
    def _reader(self, fetch: _Fetch, r: int) -> None:
        replica = self.replicas[r]
        while True:
            taken = self._take(fetch, r)
            if taken is None:
                return
            stripe, read_id = taken
            name = fetch.files[stripe.file].name
            try:
                data = replica.read(name, stripe.offset, stripe.length)
                if len(data) != stripe.length:
                    raise ReplicaError(f"replica {replica.label}: short read of {name}")
            except Exception as exc:  # noqa: BLE001 - any failure of a replica drops it, never the run
                why = (
                    str(exc) if isinstance(exc, ReplicaError) else f"read failed: {type(exc).__name__}: {exc}"
                )
                self._failed(fetch, r, stripe, read_id, why)
                return
            if self._completed(fetch, r, stripe, read_id, len(data)):
                with fetch.write_lock:  # never into a closed (or reused) descriptor
                    if fetch.closed:
                        return
                    try:
                        os.pwrite(fetch.fds[stripe.file], data, stripe.offset)
                    except OSError as exc:  # a full disk: every reader stops, the fetch ends
                        with self.cond:
                            fetch.error = fetch.error or exc
                            fetch.closed = True
                            self.cond.notify_all()
                        return
                with self.cond:
                    stripe.written = True
                    fetch.written += 1
                    self.cond.notify_all()

    def _take(self, fetch: _Fetch, r: int) -> tuple[_Stripe, int] | None:
        use = self.uses[r]
        with self.cond:
            while True:
                if fetch.closed or use.dropped is not None or fetch.complete():
                    return None
                now = time.monotonic()
                index = self._choose(fetch, r, now)
                if index is not None:
                    stripe = fetch.stripes[index]
                    if stripe.holders:
                        use.reissued += 1
                    stripe.holders[r] = now
                    self._read_ids += 1
                    if not use.inflight:
                        use.busy_since = now
                    use.inflight[self._read_ids] = (now, stripe.length)
                    use.last_start = now
                    return stripe, self._read_ids
                self.cond.wait(0.1)

    def _choose(self, fetch: _Fetch, r: int, now: float) -> int | None:
        """The stripe replica `r` reads next, or None to wait (called under the condition)."""
        if fetch.policy == "round-robin":
            return fetch.own[r].popleft() if fetch.own[r] else None
        if fetch.own[r]:
            return fetch.own[r].popleft()
        for other in fetch.servers:  # the first stripe of a replica dropped before it took it
            if self.uses[other].dropped is not None and fetch.own[other]:
                return fetch.own[other].popleft()
        use = self.uses[r]
        slow = self._slow(fetch, r, now)
        if slow is not None:
            if not fetch.pending:
                return None
            use.skipped = slow
            probe_due = not use.inflight and now - use.last_start >= self.probe_seconds
            return fetch.pending.popleft() if probe_due else None
        if fetch.pending:
            return fetch.pending.popleft()
        return self._reissue(fetch, r, now)

    def _slow(self, fetch: _Fetch, r: int, now: float) -> str | None:
        """Why replica `r` should get no stripes now (much slower than the fastest live server), or None."""
        mine = self.uses[r].current_rate(now)
        if mine is None:
            return None
        best, best_label = 0.0, ""
        for other in fetch.servers:
            use = self.uses[other]
            rate = use.current_rate(now) if other != r and use.dropped is None and use.measured() else None
            if rate is not None and rate > best:
                best, best_label = rate, use.label
        capacity = mine
        if best <= 0 or capacity * self.skip_ratio >= best:
            return None
        return (
            f"slow: {capacity / 1e6:.2f} MB/s, {best / max(capacity, 1e-9):.1f}x below {best_label} "
            f"({best / 1e6:.2f} MB/s)"
        )

    def _reissue(self, fetch: _Fetch, r: int, now: float) -> int | None:
        """End game: a stripe another replica holds that we would finish well before it, if any."""
        use = self.uses[r]
        mine = use.current_rate(now) or self._fastest_rate(fetch, now)
        if mine is None:
            return None
        choice, longest = None, 0.0
        for stripe in fetch.stripes:
            if stripe.done_by is not None or r in stripe.holders or len(stripe.holders) != 1:
                continue
            ((holder, start),) = stripe.holders.items()
            held = self.uses[holder]
            if held.dropped is not None:
                left = float("inf")
            elif held.measured() and held.rate > 0:
                left = start + held.read_seconds(stripe.length) - now
                if left <= 0:  # overdue: assume it needs as long again as it has taken
                    left = now - start
            else:  # nothing known yet: only a read in flight for a while says it is stuck
                left = now - start if now - start >= _MIN_STALL else 0.0
            ours = stripe.length * use.parallelism / mine  # a read of ours, all our reads in flight
            if left > _REISSUE_FACTOR * ours and left > longest:
                choice, longest = stripe.index, left
        return choice

    def _fastest_rate(self, fetch: _Fetch, now: float) -> float | None:
        rates = [self.uses[s].current_rate(now) for s in fetch.servers if self.uses[s].dropped is None]
        known = [rate for rate in rates if rate is not None]
        return max(known) if known else None

    def _finish_read(self, r: int, read_id: int, now: float) -> None:
        use = self.uses[r]
        use.inflight.pop(read_id, None)
        if not use.inflight:
            use.seconds += now - use.busy_since

    def _completed(self, fetch: _Fetch, r: int, stripe: _Stripe, read_id: int, size: int) -> bool:
        """Account for a finished read; True when this copy is the one to write."""
        now = time.monotonic()
        with self.cond:
            use = self.uses[r]
            self._finish_read(r, read_id, now)
            use.bytes += size
            use.window.append((use.busy_seconds(now), use.bytes))
            (busy0, bytes0), (busy1, bytes1) = use.window[0], use.window[-1]
            use.rate = (bytes1 - bytes0) / max(busy1 - busy0, 1e-6)
            use.samples += 1
            use.stripes += 1
            if stripe.done_by is not None or fetch.closed:
                use.wasted += size
                return False
            stripe.done_by = r
            ours = stripe.holders.get(r, now)
            for other, since in stripe.holders.items():  # re-issued to us because its holder was too slow:
                held = self.uses[other]  # say so, unless it re-issued the stripe itself and lost the race,
                known_fast = held.measured() and held.rate * self.skip_ratio >= use.rate  # or is as fast
                if (  # as we are (a read of it that stalled once)
                    other != r
                    and since < ours
                    and held.dropped is None
                    and held.skipped is None
                    and not known_fast
                ):
                    held.skipped = f"slow: overtaken by {use.label}, which read a stripe it held first"
            self.cond.notify_all()
            return True

    def _failed(self, fetch: _Fetch, r: int, stripe: _Stripe, read_id: int, why: str) -> None:
        """Drop the replica; its stripes not yet delivered go back to the others."""
        with self.cond:
            self._finish_read(r, read_id, time.monotonic())
            if self.uses[r].dropped is None:
                self.uses[r].dropped = why
            live = [s for s in fetch.servers if self.uses[s].dropped is None]
            orphans = [
                s.index for s in fetch.stripes if s.done_by is None and r in s.holders and len(s.holders) == 1
            ]
            for s in fetch.stripes:
                s.holders.pop(r, None)
            orphans += list(fetch.own[r])
            fetch.own[r].clear()
            if fetch.policy == "round-robin":
                for k, index in enumerate(sorted(orphans)):
                    if live:
                        fetch.own[live[k % len(live)]].append(index)
            else:
                fetch.pending.extendleft(sorted(orphans, reverse=True))
            self.cond.notify_all()

    # -- when the assembly does not verify ----------------------------------------------------------------
    def _blame(self, fetch: _Fetch, dest: Path, volume: str, sha256: str) -> bool:
        """Find the replica whose stripes made the assembly wrong, drop it, leave the verified volume in
        `dest`; False if no single replica explains it (with `dest` as it was)."""
        by_server: dict[int, list[_Stripe]] = {}
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
                replaced = self._replace(fetch, suspect, witness, stripes)
                if replaced is None:  # the witness failed a read (dropped): try another
                    continue
                if replaced and self.digest_of(dest, volume) == sha256:
                    self.drop(
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
        self, fetch: _Fetch, suspect: int, witness: int, stripes: list[_Stripe]
    ) -> list[tuple[_Stripe, bytes]] | None:
        """Read the suspect's stripes from the witness; where they differ, write the witness's bytes.
        Returns the replaced stripes with the suspect's bytes, or None if the witness failed."""
        replaced: list[tuple[_Stripe, bytes]] = []
        replica, use = self.replicas[witness], self.uses[witness]
        for stripe in stripes:
            name = fetch.files[stripe.file].name
            t0 = time.monotonic()
            try:
                theirs = replica.read(name, stripe.offset, stripe.length)
            except ReplicaError as exc:
                for done, original in replaced:
                    os.pwrite(fetch.fds[done.file], original, done.offset)
                self.drop(witness, str(exc))
                return None
            with self.cond:
                use.bytes += len(theirs)
                use.seconds += time.monotonic() - t0
                use.stripes += 1
            ours = os.pread(fetch.fds[stripe.file], stripe.length, stripe.offset)
            if theirs != ours:
                os.pwrite(fetch.fds[stripe.file], theirs, stripe.offset)
                replaced.append((stripe, ours))
        return replaced

    def _whole_from(self, index: int, volume: str, sha256: str, dest: Path) -> int | None:
        """The last resort: the whole volume from one replica (its size), or None: the replica failed or
        its copy did not verify, and it is dropped."""
        replica, use = self.replicas[index], self.uses[index]
        try:
            files = replica.volume_files(volume)
            _check_listing(volume, files, self.max_bytes)
            _remove_strays(dest, volume, files)
            for file in files:
                fd = os.open(dest / file.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with open(fd, "wb") as fh:
                    for offset in range(0, file.size, self.stripe_bytes):
                        length = min(self.stripe_bytes, file.size - offset)
                        t0 = time.monotonic()
                        fh.write(replica.read(file.name, offset, length))
                        with self.cond:
                            use.seconds += time.monotonic() - t0
                            use.bytes += length
                            use.stripes += 1
                    fh.flush()
                    os.fsync(fh.fileno())
        except ReplicaError as exc:
            self.drop(index, str(exc))
            return None
        if self.digest_of(dest, volume) != sha256:
            self.drop(index, f"volume {volume} did not verify against the manifest")
            return None
        return sum(f.size for f in files)

    # -- the run record -------------------------------------------------------------------------------------
    def report(self) -> list[dict[str, object]]:
        """Per replica: bytes, busy seconds, stripes, throughput, and whether it was skipped or dropped."""
        with self.cond:
            now = time.monotonic()
            return [
                {
                    "replica": u.label,
                    "bytes": u.bytes,
                    "seconds": round(u.busy_seconds(now), 3),
                    "stripes": u.stripes,
                    "throughput_mb_s": round(u.throughput(now) / 1e6, 3),
                    "reissued": u.reissued,
                    "wasted_bytes": u.wasted,
                    "skipped": u.skipped,
                    "dropped": u.dropped,
                }
                for u in self.uses
            ]

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


class _Opening:
    """A mirror being opened (connected, its manifest read) on a daemon thread of its own."""

    def __init__(self, url: str, keys: Path | None, opener: ReplicaOpener):
        self.label = url.split("?", 1)[0]
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._opened: tuple[Replica, str] | None = None
        self._failure: BaseException | None = None
        self._abandoned = False
        threading.Thread(target=self._open, args=(url, keys, opener), daemon=True, name="open-mirror").start()

    def _open(self, url: str, keys: Path | None, opener: ReplicaOpener) -> None:
        try:
            replica = opener(url, keys)
        except BaseException as exc:  # handed to `result`
            self._failure = exc
            self._done.set()
            return
        try:
            opened = (replica, replica.manifest().checksum())
        except BaseException as exc:  # handed to `result`
            replica.close()
            self._failure = exc
            self._done.set()
            return
        with self._lock:
            if self._abandoned:  # too late: nobody will use or close it
                replica.close()
                return
            self._opened = opened
        self._done.set()

    def result(self, deadline: float) -> tuple[Replica, str]:
        """The replica and its manifest's checksum; what opening it raised; or ReplicaError once
        `deadline` has passed (the mirror is then closed as soon as it opens)."""
        self._done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._opened is None and self._failure is None:
                self._abandoned = True
                raise ReplicaError(
                    f"replica {self.label}: did not open within {MIRROR_OPEN_SECONDS:g} s (a link that "
                    "trickles, or a site that does not answer)"
                )
            if self._failure is not None:
                raise self._failure
            assert self._opened is not None
            opened, self._opened = self._opened, None  # the caller's now, to use and close
        return opened

    def abandon(self) -> None:
        """The set failed to open: close this mirror now, or when it opens."""
        with self._lock:
            self._abandoned = True
            opened, self._opened = self._opened, None
        if opened is not None:
            opened[0].close()


class _Listing:
    """A replica's listing of a volume, asked on a daemon thread of its own: a mirror that trickles holds
    that thread (until its own connection's deadlines end it), never the copy."""

    def __init__(self, replica: Replica, volume: str):
        self.label = replica.label
        self.volume = volume
        self.done = threading.Event()
        self.files: list[VolumeFile] | None = None
        self.failure: ReplicaError | None = None
        threading.Thread(target=self._list, args=(replica,), daemon=True, name="list-volume").start()

    def _list(self, replica: Replica) -> None:
        try:
            self.files = replica.volume_files(self.volume)
        except ReplicaError as exc:
            self.failure = exc
        except Exception as exc:  # noqa: BLE001 - any failure of a replica drops it, never the run
            self.failure = ReplicaError(f"replica {self.label}: listing failed: {type(exc).__name__}: {exc}")
        self.done.set()

    def result(self, deadline: float | None) -> list[VolumeFile]:
        """The listing, or ReplicaError (the replica's own, or at `deadline`: not listed in time)."""
        if not self.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            raise ReplicaError(
                f"replica {self.label}: did not list volume {self.volume} within {MIRROR_LIST_SECONDS:g} s of "
                "the first replica (a link that trickles, or a site that stopped answering)"
            )
        if self.failure is not None:
            raise self.failure
        assert self.files is not None
        return self.files


def _first_listed(asked: Iterable[_Listing]) -> float:
    """When the first listing came in, or the last failed (monotonic): the mirrors race that."""
    pending = list(asked)
    while not any(a.done.is_set() and a.failure is None for a in pending):
        waiting = [a for a in pending if not a.done.is_set()]
        if not waiting:
            break
        waiting[0].done.wait(0.05)
    return time.monotonic()


class _Absent:
    """A mirror that could not be opened: listed (dropped) in the record, never read."""

    parallelism = 1

    def __init__(self, url: str):
        self.label = url.split("?", 1)[0]

    def manifest(self) -> Manifest:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def volume_files(self, volume: str) -> list[VolumeFile]:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def read(self, name: str, offset: int, length: int) -> bytes:
        raise ReplicaError(f"replica {self.label}: not reachable")

    def close(self) -> None:
        pass


def _check_listing(volume: str, files: list[VolumeFile], max_bytes: int | None = None) -> None:
    """A replica's listing is untrusted: names inside the volume (no paths), sizes that are sizes."""
    for file in files:
        name = file.name
        if (
            not isinstance(name, str)
            or not name.startswith(volume + ".")
            or "/" in name
            or "\0" in name
            or len(name) > _MAX_NAME
            or name.endswith((".pal", ".nal"))
        ):
            raise ReplicaError(f"replica lists a file {str(name)[:80]!r} that is not in volume {volume}")
        if not isinstance(file.size, int) or isinstance(file.size, bool) or file.size < 0:
            raise ReplicaError(f"replica lists {name} with a bad size")
    if not files:
        raise ReplicaError(f"replica has no files of volume {volume}")
    if len({f.name for f in files}) != len(files):
        raise ReplicaError(f"replica lists a file of volume {volume} twice")
    total = sum(f.size for f in files)
    if max_bytes is not None and total > max_bytes:
        raise ReplicaError(
            f"replica lists volume {volume} as {total} bytes, more than the copy may write "
            f"(--stage-limit {max_bytes})"
        )


def _remove_strays(dest: Path, volume: str, files: list[VolumeFile]) -> None:
    """Files of the volume in `dest` that the listing does not have would enter the digest: remove them."""
    names = {f.name for f in files}
    for path in dest.glob(volume + ".*"):
        if path.name not in names and path.suffix not in (".pal", ".nal"):
            path.unlink()
