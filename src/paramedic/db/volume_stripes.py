"""One volume's fetch in `db.stripes`: its files cut into stripes (default 4 MiB), which replicas hold
each stripe's read and who delivered it first, the stripes not yet taken, and the descriptors the readers
write into. Every field is guarded by the set's condition (`db.replica_health.ReplicaHealth.cond`)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from paramedic.db.replicas import VolumeFile


@dataclass
class Stripe:
    index: int
    file: int  # index into the volume's files
    offset: int
    length: int
    holders: dict[int, float] = field(default_factory=dict)  # replica -> when its read started
    done_by: int | None = None
    written: bool = False


class Fetch:
    """One volume's stripes and who reads them."""

    def __init__(self, files: list[VolumeFile], stripe_bytes: int, servers: list[int], policy: str):
        self.files = files
        self.stripes: list[Stripe] = []
        for f, file in enumerate(files):
            for offset in range(0, file.size, stripe_bytes):
                self.stripes.append(
                    Stripe(len(self.stripes), f, offset, min(stripe_bytes, file.size - offset))
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
