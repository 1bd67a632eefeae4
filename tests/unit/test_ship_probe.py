"""The link probe of `--ship auto` (ship.auto.measure_link) against a simulated link: its probes stay small on a
slow link (a 1 MiB probe took 0.84 s at 10 Mbit/s, more than the trace it decided about) and its bandwidth
is right though the connection's first transfer stalls 40 ms (TCP's delayed acknowledgement) and the link
lets a burst (5 ms of its rate) through free."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paramedic.ship import auto
from paramedic.ship.transport import SiteAddress


class SimulatedLink:
    """Seconds a ping with `size` bytes takes: round trip, the first transfer's stall, size past a burst / rate."""

    def __init__(self, rate: float, burst_seconds: float = 0.005, stall: float = 0.04, rtt: float = 0.0003):
        self.rate, self.burst, self.stall, self.rtt = rate, rate * burst_seconds, stall, rtt
        self.sent: list[int] = []

    def timed(self, tls: Any, payload: bytes) -> float:
        first = bool(payload) and not any(self.sent)
        self.sent.append(len(payload))
        return self.rtt + max(len(payload) - self.burst, 0) / self.rate + (self.stall if first else 0.0)


@pytest.fixture
def link(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    @contextlib.contextmanager
    def fake_tls(address: Any, context: Any) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(auto, "client_context", lambda keys: None)
    monkeypatch.setattr(auto, "open_tls", fake_tls)
    monkeypatch.setattr(auto, "_ask", lambda tls, header, payload=b"": {"op": "hello"})

    def use(simulated: SimulatedLink) -> SimulatedLink:
        monkeypatch.setattr(auto, "_timed", simulated.timed)
        return simulated

    yield use


@pytest.mark.parametrize("mbit", [1, 10, 100])  # (a gigabit link sends 1 MiB within such a burst)
def test_probes_are_sized_to_the_link_and_measure_it(link: Any, mbit: int) -> None:
    simulated = link(SimulatedLink(mbit * 1e6 / 8))
    measured, _ = auto.measure_link(SiteAddress.parse("tls://site:7700"), Path("keys"))
    assert measured is not None
    assert measured.bandwidth_bytes_per_second == pytest.approx(simulated.rate, rel=0.1)
    spent = sum(len_ / simulated.rate for len_ in simulated.sent)
    assert spent < 0.6  # the 1 MiB probe alone took 0.84 s at 10 Mbit/s
    if mbit >= 100:
        assert max(simulated.sent) == auto.LARGE_PROBE  # fast links: the large probe, timed well above noise


@pytest.mark.parametrize("mbit", [10, 100])
def test_probes_stay_within_a_small_files_budget(link: Any, mbit: int) -> None:
    """Deciding about a 1.2 MB trace (320 KB compressed), the probes cost at most a quarter of it."""
    simulated = link(SimulatedLink(mbit * 1e6 / 8))
    measured, _ = auto.measure_link(SiteAddress.parse("tls://site:7700"), Path("keys"), budget_bytes=311_563)
    assert measured is not None and sum(simulated.sent) <= 311_563
    assert measured.bandwidth_bytes_per_second == pytest.approx(simulated.rate, rel=0.25)


def test_a_tiny_budget_leaves_the_first_probe_alone(link: Any) -> None:
    simulated = link(SimulatedLink(10e6 / 8))
    auto.measure_link(SiteAddress.parse("tls://site:7700"), Path("keys"), budget_bytes=100_000)
    assert [s for s in simulated.sent if s] == [auto.SMALL_PROBE]
