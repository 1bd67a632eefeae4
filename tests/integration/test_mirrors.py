"""Remote replicas (issue 14, items 2-3): real `paramedic serve` processes serving a formatted database's
fragment volumes over real TLS 1.3 to `ship.replica_client`, striped by `db.stripes.ReplicaSet`."""

from __future__ import annotations

import shutil
import socket
import ssl
from pathlib import Path

import pytest

from paramedic.db.manifest import load_manifest, volume_sha256
from paramedic.db.replicas import ReplicaError
from paramedic.db.stripes import ReplicaSet
from paramedic.errors import DatabaseError
from paramedic.ship.transport import open_replica
from paramedic.ship.wire import ProtocolError, recv_frame, send_frame
from tests.support.databases import Databases
from tests.support.site import StorageSite

STRIPE = 16 * 1024


def open_set(*args, **kwargs) -> ReplicaSet:
    """A ReplicaSet whose URLs are opened by their scheme's plugin, as the engine's staging opens them."""
    return ReplicaSet.open(*args, opener=open_replica, **kwargs)


@pytest.fixture(scope="module")
def base(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mirrors")
    databases.place(base, 2000, fragments=4, layout="fragments")
    databases.place(
        base, 2000, fragments=4, out="other/uni", start=2000, fasta="other.fasta", layout="fragments"
    )
    shutil.copytree(base / "db", base / "copy")
    shutil.copy(base / "db" / "uni.pal", base / "copy" / "uni.pal")
    databases.keys(base / "keys")
    return base


def start(base: Path, tmp_path: Path, replica: str, name: str, *extra: str) -> StorageSite:
    (tmp_path / f"root-{name}").mkdir()
    site = StorageSite(base / replica, tmp_path / f"root-{name}", base / "keys/server",
                       tmp_path / f"serve-{name}.log", extra=extra)  # fmt: skip
    site.start()
    return site


@pytest.fixture
def sites(base: Path, tmp_path: Path):
    started: list[StorageSite] = []

    def make(replica: str, *extra: str) -> StorageSite:
        site = start(base, tmp_path, replica, str(len(started)), *extra)
        started.append(site)
        return site

    yield make
    for site in started:
        site.stop()


def fetch_all(rs: ReplicaSet, base: Path, dest: Path) -> None:
    manifest = load_manifest(base / "db/uni")
    dest.mkdir(exist_ok=True)
    for fragment in manifest.fragments:
        rs.fetch_volume(fragment.volume, fragment.sha256, dest)
        assert volume_sha256(dest, fragment.volume) == fragment.sha256
        for path in (base / "db/uni").glob(fragment.volume + ".*"):
            if path.suffix != ".pal":
                assert (dest / path.name).read_bytes() == path.read_bytes()


def test_a_remote_replica_serves_volumes_that_verify(base, sites, tmp_path):
    site = sites("db/uni")
    manifest = load_manifest(base / "db/uni")
    rs = open_set([f"{site.url}/uni?streams=3"], manifest, base / "keys/compute-a", stripe_bytes=STRIPE)
    try:
        assert rs.uses[0].parallelism == 3
        fetch_all(rs, base, tmp_path / "out")
        (row,) = rs.report()
        assert row["replica"] == f"{site.url}/uni" and row["dropped"] is None and row["stripes"] > 4
    finally:
        rs.close()
    assert "serving its fragment volumes read-only" in site.log()


def test_a_remote_replica_of_another_database_is_refused(base, sites):
    site = sites("other/uni")
    with pytest.raises(DatabaseError, match="holds a different database"):
        open_set([f"{site.url}/uni"], load_manifest(base / "db/uni"), base / "keys/compute-a")


def test_a_client_without_a_certificate_is_refused(base, sites):
    site = sites("db/uni")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(base / "keys/compute-a/ca.pem"))  # trusts the site, no certificate
    raw = socket.create_connection(("127.0.0.1", site.port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        with pytest.raises((ssl.SSLError, OSError, ProtocolError)):
            send_frame(tls, {"op": "replica_manifest"})
            recv_frame(tls)
    site.wait_log("refused 127.0.0.1: .*(certificate|CERTIFICATE)")


@pytest.mark.parametrize(
    "request_args",
    [
        ("manifest.json", 0, 10),  # in the database directory, not a volume file
        ("../uni.pal", 0, 10),
        ("/etc/passwd", 0, 10),
        ("whole.psq", 0, 10),  # the whole-database volume is not a fragment volume
        ("f000.pal", 0, 10),
        ("f000.psq", 10**9, 10),  # past the end
    ],
)
def test_reads_outside_the_fragment_volumes_are_refused(base, sites, request_args):
    site = sites("db/uni")
    replica = open_replica(f"{site.url}/uni", base / "keys/compute-a")
    try:
        assert replica.read("f000.psq", 0, 16) == (base / "db/uni/f000.psq").read_bytes()[:16]
        with pytest.raises(ReplicaError, match="refused"):
            replica.read(*request_args)
        with pytest.raises(ReplicaError, match="no fragment volume"):
            replica.volume_files("whole")
        assert replica.read("f000.psq", 0, 16)  # a new stream after the refusals
    finally:
        replica.close()


def test_no_replica_reads_refuses_them(base, sites):
    site = sites("db/uni", "--no-replica-reads")
    with pytest.raises(ReplicaError, match="serves no replica reads"):
        open_set([f"{site.url}/uni"], load_manifest(base / "db/uni"), base / "keys/compute-a")


def test_a_mirror_url_without_keys_is_a_usage_error(base):
    from paramedic.errors import UsageError

    with pytest.raises(UsageError, match="needs --keys"):
        open_replica("tls://localhost:1/uni", None)
    with pytest.raises(UsageError, match="streams must be"):
        open_replica("tls://localhost:1/uni?streams=0", base / "keys/compute-a")


@pytest.mark.parametrize("policy", ["adaptive", "round-robin"])
def test_a_corrupted_fragment_on_one_of_two_remote_replicas_is_read_from_the_other(
    base, sites, tmp_path, policy
):
    good = sites("db/uni")
    copy = tmp_path / "copy"
    shutil.copytree(base / "copy", copy)
    bad = sites(str(copy / "uni"))
    # the disk goes bad after the site started (a site refuses a database that does not verify at start)
    psq = copy / "uni" / "f001.psq"
    data = bytearray(psq.read_bytes())
    for i in range(0, len(data), 4096):
        data[i] ^= 0xFF
    with open(psq, "r+b") as fh:
        fh.write(bytes(data))
    manifest = load_manifest(base / "db/uni")
    urls = [f"{bad.url}/copy", f"{good.url}/uni"]
    rs = open_set(urls, manifest, base / "keys/compute-a", stripe_bytes=STRIPE, policy=policy)
    try:
        fetch_all(rs, base, tmp_path / "out")
        report = {row["replica"]: row for row in rs.report()}
    finally:
        rs.close()
    assert "served bytes that did not verify" in str(report[urls[0]]["dropped"]), report
    assert report[urls[1]]["dropped"] is None
    assert report[urls[0]]["stripes"] > 0
