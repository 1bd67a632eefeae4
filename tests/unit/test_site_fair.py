"""The storage site's I/O workers taken in turn by compute sites (site.fair, issue 41 item 4)."""

from __future__ import annotations

import threading

from paramedic.site.fair import FairPool


def test_a_free_worker_takes_the_owner_that_runs_the_fewest_first() -> None:
    pool = FairPool(workers=1, per_owner=64, total=256)
    gate = threading.Event()
    order: list[str] = []
    done = threading.Semaphore(0)

    def call(name: str):
        def run() -> None:
            if name == "a0":
                assert gate.wait(10)
            order.append(name)
            done.release()

        return run

    for i in range(5):
        pool.submit("a", call(f"a{i}"))  # a0 holds the one worker; a1..a4 wait
    pool.submit("b", call("b0"))
    pool.submit("c", call("c0"))
    pool.submit("b", call("b1"))
    gate.set()
    for _ in range(8):
        assert done.acquire(timeout=10)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]
    assert pool.running("a") == 0
    pool.shutdown()


def test_an_owner_past_its_queue_waits_and_the_others_do_not() -> None:
    pool = FairPool(workers=1, per_owner=2, total=256)
    gate = threading.Event()
    pool.submit("a", lambda: gate.wait(10) and None)  # running
    pool.submit("a", lambda: None)
    third = threading.Thread(target=pool.submit, args=("a", lambda: None))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # compute site a's own request waits for room in its queue
    pool.submit("b", lambda: None)  # ... not b's
    gate.set()
    third.join(10)
    assert not third.is_alive()
    pool.shutdown()
