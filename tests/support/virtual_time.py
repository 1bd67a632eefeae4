"""Virtual time for code that runs threads: a discrete-event clock, so that a unit test of timing logic
(who is slow, who is overdue, who overtakes whom) gives the same answer on a quiet and a loaded machine.

Time stands still while any thread of the code under test can run; it moves only when every one of them
waits (in `sleep` or in a condition's `wait`), and then straight to the earliest deadline. So a fake
replica that "takes 3 ms" per read takes exactly 3 ms of virtual time whether the machine is idle or
four test suites share its two cores, and CPU time costs nothing. The order in which threads that wake
at one instant take a lock is still the operating system's: assertions must hold for any such order.

The code under test is given the clock's `time`, `threading` stand-ins (module attributes, patched by
`patch_module`): `monotonic`, `sleep`, `Thread` (counted while it runs), `Condition` (a wait is a
virtual-time wait) and the real `Lock`. A wait that is never woken (every thread waiting without a
deadline) fails after `STALL_SECONDS` of real time instead of hanging the suite.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import types
from collections.abc import Callable
from typing import Any

STALL_SECONDS = 60.0  # real seconds a parked thread waits before the clock is declared stalled


class Stalled(RuntimeError):
    """Every thread waits and none has a deadline: virtual time cannot move."""


class _Waiter:
    __slots__ = ("event", "woken", "notified")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.woken = False
        self.notified = False


class VirtualClock:
    """The clock, the count of runnable threads, and the deadlines of the parked ones."""

    def __init__(self, start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._now = start
        self._active = 1  # the thread that made the clock (the test) runs
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()
        self._closed = False
        self.stalled = False

    # -- what the code under test calls ------------------------------------------------------------------
    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        if self._closed:
            return
        self._block(self._park(max(seconds, 0.0)))

    def Thread(self, *args: Any, **kwargs: Any) -> threading.Thread:  # noqa: N802 - threading's name
        return _Thread(self, *args, **kwargs)

    def Condition(self, lock: Any = None) -> _Condition:  # noqa: N802 - threading's name
        assert lock is None, "a virtual condition owns its lock"
        return _Condition(self)

    def Event(self) -> _Event:  # noqa: N802 - threading's name
        return _Event(self)

    # -- the bookkeeping ----------------------------------------------------------------------------------
    def _park(self, timeout: float | None) -> _Waiter:
        """The calling thread is about to wait (until woken, or `timeout` virtual seconds from now)."""
        waiter = _Waiter()
        with self._lock:
            self._active -= 1
            if timeout is not None:
                heapq.heappush(self._deadlines, (self._now + timeout, next(self._order), waiter))
            self._advance()
        return waiter

    def _block(self, waiter: _Waiter) -> None:
        if not waiter.event.wait(STALL_SECONDS):
            self.stalled = True
            raise Stalled("virtual time stalled: every thread waits and none has a deadline")

    def _wake(self, waiter: _Waiter, notified: bool) -> None:
        """Make a parked thread runnable (called with self._lock held)."""
        if not waiter.woken:
            waiter.woken, waiter.notified = True, notified
            self._active += 1
            waiter.event.set()

    def _notify(self, waiters: list[_Waiter]) -> None:
        with self._lock:
            for waiter in waiters:
                self._wake(waiter, True)

    def _started(self) -> None:
        with self._lock:
            self._active += 1

    def _ended(self) -> None:
        with self._lock:
            self._active -= 1
            self._advance()

    def _advance(self) -> None:
        """With nothing runnable, jump to the earliest deadline and wake whoever waits for it."""
        while self._active == 0 and self._deadlines:
            deadline, _, waiter = heapq.heappop(self._deadlines)
            if waiter.woken:
                continue
            self._now = max(self._now, deadline)
            self._wake(waiter, False)

    def close(self) -> None:
        """Wake every parked thread; from now on waits are short real ones (threads left over end)."""
        with self._lock:
            self._closed = True
            for _, _, waiter in self._deadlines:
                self._wake(waiter, False)
            self._deadlines.clear()

    # -- wiring ---------------------------------------------------------------------------------------------
    def time_module(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(monotonic=self.monotonic, sleep=self.sleep)

    def threading_module(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            Thread=self.Thread, Condition=self.Condition, Event=self.Event, Lock=threading.Lock
        )


class _Thread(threading.Thread):
    """A thread counted as runnable from `start` until its target returns."""

    def __init__(self, clock: VirtualClock, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def start(self) -> None:
        self._clock._started()  # before the thread runs: the clock must not move in between
        try:
            super().start()
        except BaseException:
            self._clock._ended()
            raise

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._clock._ended()


class _Condition:
    """threading.Condition's interface over a plain lock, its waits in virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._clock._closed:
            self._lock.release()
            try:
                threading.Event().wait(0.005 if timeout is None else min(timeout, 0.005))
            finally:
                self._lock.acquire()
            return False
        waiter = self._clock._park(timeout)
        self._waiters.append(waiter)
        self._lock.release()
        try:
            self._clock._block(waiter)
        finally:
            self._lock.acquire()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return waiter.notified

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        end = None if timeout is None else self._clock.monotonic() + timeout
        while not (result := predicate()):
            left = None if end is None else end - self._clock.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
        return result

    def notify(self, n: int = 1) -> None:
        woken, self._waiters = self._waiters[:n], self._waiters[n:]
        self._clock._notify(woken)

    def notify_all(self) -> None:
        woken, self._waiters = self._waiters, []
        self._clock._notify(woken)


class _Event:
    """threading.Event's interface, its waits in virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        self._cond = _Condition(clock)
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._flag, timeout)


def patch_module(monkeypatch: Any, module: types.ModuleType, clock: VirtualClock) -> None:
    """Give `module` the clock's `time` and `threading`, whichever of the two it uses (under those names;
    it must use at least one)."""
    import threading as real_threading
    import time as real_time

    uses_time = getattr(module, "time", None) is real_time
    uses_threading = getattr(module, "threading", None) is real_threading
    assert uses_time or uses_threading, f"{module.__name__} uses neither `time` nor `threading`"
    if uses_time:
        monkeypatch.setattr(module, "time", clock.time_module())
    if uses_threading:
        monkeypatch.setattr(module, "threading", clock.threading_module())
