"""One plugin per URL scheme (ship.transport): shipping, mirror reads, the link probe and the published-job
question all find a URL's scheme in one registry, and a new transport is its module plus one line in
`PLUGINS` (the recipe of docs/CONTRIBUTING.md "Add a transport", followed here with `mem://`)."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import pytest

from paramedic.db.replicas import LocalReplica
from paramedic.db.stripes import ReplicaSet
from paramedic.errors import UsageError
from paramedic.ship import auto, transport
from paramedic.ship.codecs import JobSpec
from paramedic.ship.destination import ShipSettings, start_shipping
from paramedic.ship.transport import PLUGINS, SCHEMES, SiteAddress, open_replica


@pytest.fixture
def mem(monkeypatch: pytest.MonkeyPatch):
    """The one line a new transport adds (ship/transport.py PLUGINS), for the time of a test."""
    monkeypatch.setitem(PLUGINS, "mem", "tests.unit.memory_scheme")
    monkeypatch.delitem(sys.modules, "tests.unit.memory_scheme", raising=False)  # registers at its import
    yield
    SCHEMES.pop("mem", None)


def test_a_new_scheme_ships_a_job_from_its_one_line(mem) -> None:
    settings = ShipSettings.build("mem://far", None, "direct", "out/a.txt", 4, 10.0)  # imports the plugin
    memory_scheme = sys.modules["tests.unit.memory_scheme"]
    assert settings.site == SiteAddress("mem", "far") and str(settings.site) == "mem://far:0"
    job = JobSpec("blastp", [], "db", "0" * 64, (range(0, 1),), [("q", "MK")], 1)
    shipping = start_shipping(settings, "direct", job)
    shipping.write(b"report bytes")
    shipping.commit()
    site = memory_scheme.SITES["far"]
    assert site["setup"][0] == "direct" and site["setup"][1]["out"] == "out/a.txt"
    assert site["done"]["sha256"] == hashlib.sha256(b"report bytes").hexdigest()
    assert shipping.report()["output_bytes"] == len(b"report bytes")
    link, manifest = auto.measure_link(settings.site, None)
    assert link is not None and manifest is None


def test_a_new_scheme_serves_mirror_reads_through_the_same_plugin(mem, tmp_path: Path) -> None:
    memory_scheme = importlib.import_module("tests.unit.memory_scheme")

    (tmp_path / "f000.psq").write_bytes(b"0123456789")
    memory_scheme.DIRECTORIES["near"] = tmp_path
    replica = open_replica("mem://near/uni")
    assert isinstance(replica, LocalReplica) and replica.read("f000.psq", 2, 3) == b"234"


def test_the_builtin_schemes_and_their_errors() -> None:
    assert SiteAddress.parse("grpcs://h:1") == SiteAddress("tls", "h", 1)
    assert str(SiteAddress.parse("file:///x/inbox")) == "file:///x/inbox"
    with pytest.raises(
        UsageError, match=r"--site ftp://h: unknown scheme 'ftp' \(known: file://, grpcs://, tls://"
    ):
        SiteAddress.parse("ftp://h")
    with pytest.raises(UsageError, match="expected tls://HOST:PORT"):
        SiteAddress.parse("tls://h")
    with pytest.raises(UsageError, match="needs --keys"):
        ShipSettings.build("tls://h:1", None, "direct", "a", 4, 1.0)
    with pytest.raises(UsageError, match="--mirror ftp://h/db: unknown scheme"):
        open_replica("ftp://h/db")
    with pytest.raises(UsageError, match="a URL needs its transport"):
        ReplicaSet.open(["tls://h:1/db"], None)  # type: ignore[arg-type]  # the db layer opens directories only


def test_a_file_mirror_is_a_directory(tmp_path: Path) -> None:
    replica = open_replica(f"file://{tmp_path}")
    assert isinstance(replica, LocalReplica) and replica.directory == tmp_path.resolve()
    assert transport.SCHEMES["file"].measure_link(SiteAddress("file", path=tmp_path), None, None) == (
        None,
        None,
    )
