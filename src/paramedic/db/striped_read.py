"""The striped read of one volume (`db.stripes`): its files written into a directory the caller owns by
reader threads, a few per live replica, each taking the stripe `db.steering` chooses for it, the first
copy of a stripe in written and a later one counted as wasted; a replica that fails a read is dropped and
its stripes go back to the others; a write that fails (a full disk) ends the fetch."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from paramedic.db.replica_health import ReplicaHealth
from paramedic.db.replicas import ReplicaError
from paramedic.db.steering import Steering
from paramedic.db.volume_listings import remove_strays
from paramedic.db.volume_stripes import Fetch, Stripe


class StripedRead:
    """The readers of one set's replicas, steered by `steering`."""

    def __init__(self, health: ReplicaHealth, steering: Steering):
        self.health = health
        self.steering = steering
        self.replicas = health.replicas
        self.uses = health.uses
        self.cond = health.cond

    def run(self, fetch: Fetch, dest: Path, volume: str) -> bool:
        """Read every stripe from the live servers into `dest`; False when they all failed first."""
        for file in fetch.files:
            fd = os.open(dest / file.name, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            fetch.fds.append(fd)
            os.ftruncate(fd, file.size)
        remove_strays(dest, volume, fetch.files)
        depth = max(self.uses[r].parallelism for r in fetch.servers)
        threads = [  # interleaved, so that no replica's readers start long before the others'
            threading.Thread(target=self._reader, args=(fetch, r), daemon=True, name=f"stripe-{r}-{k}")
            for k in range(depth)
            for r in fetch.servers
            if k < self.uses[r].parallelism
        ]
        with self.cond:
            self.steering.first_stripes(fetch, time.monotonic())
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

    def close(self, fetch: Fetch) -> None:
        with self.cond:
            fetch.closed = True
            self.cond.notify_all()
        with fetch.write_lock:
            fds, fetch.fds = fetch.fds, []
        for fd in fds:
            os.close(fd)

    # -- the readers ------------------------------------------------------------------------------------
    def _reader(self, fetch: Fetch, r: int) -> None:
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
                self._failed(fetch, r, read_id, why)
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

    def _take(self, fetch: Fetch, r: int) -> tuple[Stripe, int] | None:
        use = self.uses[r]
        with self.cond:
            while True:
                if fetch.closed or use.dropped is not None or fetch.complete():
                    return None
                now = time.monotonic()
                index = self.steering.choose(fetch, r, now)
                if index is not None:
                    stripe = fetch.stripes[index]
                    if stripe.holders:
                        use.reissued += 1
                    stripe.holders[r] = now
                    return stripe, self.health.start_read(r, stripe.length, now)
                self.cond.wait(0.1)

    def _completed(self, fetch: Fetch, r: int, stripe: Stripe, read_id: int, size: int) -> bool:
        """Account for a finished read; True when this copy is the one to write."""
        now = time.monotonic()
        with self.cond:
            self.health.delivered(r, read_id, size, now)
            if stripe.done_by is not None or fetch.closed:
                self.uses[r].wasted += size
                return False
            stripe.done_by = r
            self.steering.overtaken(stripe, r, now)
            self.cond.notify_all()
            return True

    def _failed(self, fetch: Fetch, r: int, read_id: int, why: str) -> None:
        """Drop the replica; its stripes not yet delivered go back to the others."""
        with self.cond:
            self.health.finish_read(r, read_id, time.monotonic())
            self.health.dropped(r, why)
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
