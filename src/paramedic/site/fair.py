"""The storage site's I/O workers, shared fairly between compute sites.

Decodes wait in one queue per owner (a compute site); a worker that comes free takes the next decode of
the owner running the fewest now, the one served longest ago among equals. A thread pool in submission
order made one compute site's 32 small trace jobs hold every worker while another compute site's search
waited 68 s for its first decode (issue 41, item 4). One owner may keep at most `per_owner` decodes
waiting (its own requests wait beyond that, not the other compute sites'), all owners `total`.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class FairPool:
    """`workers` threads running submitted calls, owner by owner in turn (see the module's docstring)."""

    def __init__(self, workers: int, per_owner: int, total: int, name: str = "io-worker"):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._per_owner = per_owner
        self._slots = threading.BoundedSemaphore(total)
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[Callable[[], None]]] = {}
        self._owner_slots: dict[str, threading.BoundedSemaphore] = {}
        self._running: dict[str, int] = {}
        self._served: dict[str, int] = {}  # owner -> when it was last given a worker (a counter)
        self._clock = itertools.count()

    def submit(self, owner: str, call: Callable[[], None]) -> None:
        """Queue `call` for a worker, waiting while `owner` (or every owner) has as many queued as it may;
        RuntimeError once the pool is shut down."""
        with self._lock:
            mine = self._owner_slots.setdefault(owner, threading.BoundedSemaphore(self._per_owner))
        mine.acquire()
        self._slots.acquire()
        with self._lock:
            self._waiting.setdefault(owner, deque()).append(call)
        try:
            self._pool.submit(self._run_next)
        except RuntimeError:  # shut down: nothing will run it
            with self._lock:
                self._waiting[owner].remove(call)
            self._slots.release()
            mine.release()
            raise

    def running(self, owner: str) -> int:
        with self._lock:
            return self._running.get(owner, 0)

    def _run_next(self) -> None:
        """On a worker: one call, of the owner whose turn it is (each submission queues one such run, so
        there is always a call waiting when it starts)."""
        with self._lock:
            owner = min(
                (o for o, calls in self._waiting.items() if calls),
                key=lambda o: (self._running.get(o, 0), self._served.get(o, -1)),
            )
            call = self._waiting[owner].popleft()
            if not self._waiting[owner]:
                del self._waiting[owner]
            self._running[owner] = self._running.get(owner, 0) + 1
            self._served[owner] = next(self._clock)
            mine = self._owner_slots[owner]
        try:
            call()
        finally:
            with self._lock:
                self._running[owner] -= 1
                if not self._running[owner]:
                    del self._running[owner]
            self._slots.release()
            mine.release()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
