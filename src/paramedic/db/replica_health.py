"""What each replica of a `db.stripes.ReplicaSet` has done in a run, and how fast it is: bytes, busy
seconds, stripes, its throughput measured over its last few reads (lowered at once by a read that is
overdue), why it was skipped or dropped; the run record's rows. One condition guards it all, shared with
the readers of `db.striped_read`."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from paramedic.db.replicas import Replica

DEFAULT_INFLIGHT = 2  # reads in flight per replica (a remote replica uses one per TLS stream)
_WINDOW = 8  # a replica's throughput is measured over its last this many reads
_MIN_SAMPLES = 2  # reads before a replica's rate counts for skipping (the first pays for connecting)


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


class ReplicaHealth:
    """The replicas of a set, what each has done (`uses`, in the same order), and the condition that
    guards them and every fetch's stripes."""

    def __init__(self, replicas: list[Replica], uses: list[ReplicaUse]):
        self.replicas = replicas
        self.uses = uses
        self.cond = threading.Condition()
        self._read_ids = 0

    def live(self) -> list[int]:
        return [i for i, use in enumerate(self.uses) if use.dropped is None]

    def drop(self, index: int, why: str) -> None:
        with self.cond:
            self.dropped(index, why)
            self.cond.notify_all()

    def dropped(self, index: int, why: str) -> None:
        """Replica `index` is dropped for the run, for `why` unless it already was (under the condition)."""
        if self.uses[index].dropped is None:
            self.uses[index].dropped = why

    def start_read(self, r: int, length: int, now: float) -> int:
        """A read of `length` bytes from replica `r` begins (under the condition); its id."""
        use = self.uses[r]
        self._read_ids += 1
        if not use.inflight:
            use.busy_since = now
        use.inflight[self._read_ids] = (now, length)
        use.last_start = now
        return self._read_ids

    def finish_read(self, r: int, read_id: int, now: float) -> None:
        """A read ended, delivered or failed (under the condition): the replica's busy time counted."""
        use = self.uses[r]
        use.inflight.pop(read_id, None)
        if not use.inflight:
            use.seconds += now - use.busy_since

    def delivered(self, r: int, read_id: int, size: int, now: float) -> None:
        """A read of `size` bytes came in (under the condition): the replica's rate measured again."""
        use = self.uses[r]
        self.finish_read(r, read_id, now)
        use.bytes += size
        use.window.append((use.busy_seconds(now), use.bytes))
        (busy0, bytes0), (busy1, bytes1) = use.window[0], use.window[-1]
        use.rate = (bytes1 - bytes0) / max(busy1 - busy0, 1e-6)
        use.samples += 1
        use.stripes += 1

    def count(self, r: int, size: int, seconds: float) -> None:
        """A read outside the striped fetch (a suspect's stripes read again, a whole volume) counted."""
        with self.cond:
            use = self.uses[r]
            use.bytes += size
            use.seconds += seconds
            use.stripes += 1

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
