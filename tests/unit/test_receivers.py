"""One plugin per storage-site receiver (site.receivers): `paramedic serve` takes a new transport's receiver
from its module plus one line in `PLUGINS`, with its option, its start and its stop (the recipe of
docs/CONTRIBUTING.md "Add a transport", steps 4-5, followed here with `--memory`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from paramedic import cli
from paramedic.errors import UsageError
from paramedic.site import server
from paramedic.site.receivers import PLUGINS, RECEIVERS, Receiver, SiteContext, receivers
from paramedic.site.server import ServeSettings, serve

MODULE = "tests.unit.memory_receiver"


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch):
    """The one line a new receiver adds (site/receivers.py PLUGINS), for the time of a test."""
    monkeypatch.setitem(PLUGINS, "memory", MODULE)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)  # registers at its import
    yield
    RECEIVERS.pop("memory", None)
    sys.modules.pop(MODULE, None)


def _settings(tmp_path: Path, **asked: Any) -> ServeSettings:
    (tmp_path / "root").mkdir(exist_ok=True)
    return ServeSettings(None, tmp_path / "root", "127.0.0.1:0", None, io_workers=1, receivers=asked)


def _serve_until_logged(settings: ServeSettings, monkeypatch: pytest.MonkeyPatch, line: str) -> list[str]:
    """Run `serve` in this (the main) thread and interrupt it, as Ctrl-C would, once it logged `line`; its
    log."""
    logged: list[str] = []
    seen = threading.Event()

    def log(message: str) -> None:
        logged.append(message)
        if message.startswith(line):
            seen.set()

    monkeypatch.setattr(server, "log", log)

    def interrupt_when_started() -> None:
        seen.wait(10)
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the main thread's wait

    watcher = threading.Thread(target=interrupt_when_started)
    watcher.start()
    try:
        assert serve(settings) == 0
    finally:
        watcher.join()
    return logged


def test_the_inbox_is_a_receiver_plugin() -> None:
    names = [r.name for r in receivers()]
    assert names[0] == "inbox" and "paramedic.site.inbox" in sys.modules


@pytest.fixture
def own_signals():
    """`paramedic serve`'s command takes SIGTERM and SIGHUP: given back to pytest after the test."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_new_receiver_is_an_option_of_serve_from_its_one_line(
    memory, own_signals, monkeypatch, tmp_path
) -> None:
    taken: list[ServeSettings] = []
    monkeypatch.setattr(server, "serve", lambda settings: taken.append(settings) or 0)
    assert cli.main(["serve", "--root", str(tmp_path), "--memory", "far"]) == 0
    asked = taken[0].receivers
    assert asked["memory"] == "far" and taken[0].keys is None
    assert set(asked) == {r.name for r in receivers()} and all(
        v is None for n, v in asked.items() if n != "memory"
    )


def test_serve_starts_a_new_receiver_alone_and_stops_it(memory, tmp_path, monkeypatch) -> None:
    receivers()  # imports the plugin
    started = sys.modules[MODULE].STARTED
    settings = _settings(tmp_path, memory="far")
    log = _serve_until_logged(settings, monkeypatch, "memory receiver far")
    record = started.pop("far")
    assert record["stopped"]
    site: SiteContext = record["site"]
    assert site.keys is None and site.open_idle_seconds == settings.open_idle_seconds
    assert site.store.root == tmp_path / "root"
    assert log[0].startswith("memory receiver far, replica none") and log[-1] == "stopping"


def test_a_receiver_that_fails_to_start_stops_those_started(memory, tmp_path) -> None:
    receivers()
    started = sys.modules[MODULE].STARTED
    failing = Receiver(
        "memory2", "NAME", "a second memory receiver", str, lambda n, k: n, lambda n, s: _fail(n)
    )
    RECEIVERS["memory2"] = failing
    try:
        with pytest.raises(OSError, match="cannot start"):
            serve(_settings(tmp_path, memory="near", memory2="fail"))
    finally:
        RECEIVERS.pop("memory2")
    assert started.pop("near")["stopped"]


class _Unstoppable:
    def stop(self) -> None:
        raise OSError("socket already gone")


def test_a_receiver_whose_stop_fails_does_not_keep_the_others_running(memory, tmp_path, monkeypatch) -> None:
    receivers()
    started = sys.modules[MODULE].STARTED
    unstoppable = Receiver(
        "memory2",
        "NAME",
        "a receiver whose stop fails",
        str,
        lambda n, k: f"unstoppable {n}",
        lambda n, s: _Unstoppable(),
    )
    RECEIVERS["memory2"] = (
        unstoppable  # registered after the fixture's: started after "memory", stopped before
    )
    try:
        log = _serve_until_logged(
            _settings(tmp_path, memory="near", memory2="x"), monkeypatch, "unstoppable x"
        )
    finally:
        RECEIVERS.pop("memory2")
    assert started.pop("near")["stopped"]
    assert "a receiver did not stop cleanly: OSError: socket already gone" in log and log[-1].startswith(
        "a receiver"
    )


def _fail(name: str) -> Any:
    raise OSError(f"{name}: cannot start")


def test_serve_without_a_way_in_names_every_receiver(memory, tmp_path) -> None:
    with pytest.raises(
        UsageError, match=r"needs --keys \(its TLS listener\) or another way in \((.*)\)"
    ) as refused:
        serve(_settings(tmp_path))
    named = refused.value.args[0]
    assert "--inbox DIR" in named and "--memory NAME" in named


def test_an_unknown_receiver_is_refused(tmp_path) -> None:
    with pytest.raises(UsageError, match=r"no receiver 'carrier' \(known: (.*)--inbox"):
        _settings(tmp_path, carrier="x")
