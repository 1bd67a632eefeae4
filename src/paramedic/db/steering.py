"""Which stripe a replica reads next (`db.stripes`' steering, `policy="adaptive"`): a replica pulls the next
stripe whenever one of its reads is free, so a fast replica reads more; one more than `skip_ratio` times
below the fastest live replica gets no stripes but a probe every `probe_seconds` (hot-spot skipping); near
the end a free fast replica reads again a stripe a slow one still holds (the first copy in wins).
`policy="round-robin"` is plain striping: each replica its own queue. Every call is made under the
set's condition (`db.replica_health.ReplicaHealth.cond`)."""

from __future__ import annotations

from paramedic.db.replica_health import ReplicaHealth
from paramedic.db.volume_stripes import Fetch, Stripe

_REISSUE_FACTOR = 1.5  # re-read a held stripe when the holder needs this much longer than we would
_MIN_STALL = 0.05  # seconds a read of a replica not yet measured is in flight before it may be re-read


class Steering:
    """The choice of stripes for the replicas of one set."""

    def __init__(self, health: ReplicaHealth, skip_ratio: float, probe_seconds: float):
        self.health = health
        self.uses = health.uses
        self.skip_ratio = skip_ratio
        self.probe_seconds = probe_seconds

    def first_stripes(self, fetch: Fetch, now: float) -> None:
        """Every live replica not known to be slow is given the first stripe of its own when a volume
        starts: a local replica reads faster than a thread starts, and would otherwise take every stripe
        before the others' readers run (they would never be measured, nor checked)."""
        if fetch.policy != "adaptive":
            return
        for r in fetch.servers:
            if fetch.pending and self.uses[r].dropped is None and self.slow(fetch, r, now) is None:
                fetch.own[r].append(fetch.pending.popleft())

    def choose(self, fetch: Fetch, r: int, now: float) -> int | None:
        """The stripe replica `r` reads next, or None to wait."""
        if fetch.policy == "round-robin":
            return fetch.own[r].popleft() if fetch.own[r] else None
        if fetch.own[r]:
            return fetch.own[r].popleft()
        for other in fetch.servers:  # the first stripe of a replica dropped before it took it
            if self.uses[other].dropped is not None and fetch.own[other]:
                return fetch.own[other].popleft()
        use = self.uses[r]
        slow = self.slow(fetch, r, now)
        if slow is not None:
            if not fetch.pending:
                return None
            use.skipped = slow
            probe_due = not use.inflight and now - use.last_start >= self.probe_seconds
            return fetch.pending.popleft() if probe_due else None
        if fetch.pending:
            return fetch.pending.popleft()
        return self._reissue(fetch, r, now)

    def slow(self, fetch: Fetch, r: int, now: float) -> str | None:
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

    def _reissue(self, fetch: Fetch, r: int, now: float) -> int | None:
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

    def _fastest_rate(self, fetch: Fetch, now: float) -> float | None:
        rates = [self.uses[s].current_rate(now) for s in fetch.servers if self.uses[s].dropped is None]
        known = [rate for rate in rates if rate is not None]
        return max(known) if known else None

    def overtaken(self, stripe: Stripe, r: int, now: float) -> None:
        """Replica `r` delivered `stripe` first: a holder it was re-issued from because that one was too
        slow is marked skipped (slow), unless it re-issued the stripe itself and lost the race, or is as
        fast as `r` (a read of it that stalled once)."""
        use = self.uses[r]
        ours = stripe.holders.get(r, now)
        for other, since in stripe.holders.items():
            held = self.uses[other]
            known_fast = held.measured() and held.rate * self.skip_ratio >= use.rate
            if (
                other != r
                and since < ours
                and held.dropped is None
                and held.skipped is None
                and not known_fast
            ):
                held.skipped = f"slow: overtaken by {use.label}, which read a stripe it held first"
