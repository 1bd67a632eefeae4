"""The storage site's memory, bounded by its configuration (issue 23, item 14): a real `paramedic serve`
process, its resident memory read from /proc, jobs opened over real TLS.

Before the fix a 10.5 MiB setup inflating to 500 MiB of queries was accepted and held for the job's life:
`bench/site_memory.py --mib 500 --restart` measured VmRSS 562 MiB (peak 1,571 MiB), again after a restart.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import time
from pathlib import Path

import pytest

from paramedic.db.manifest import load_manifest
from paramedic.ship.client import SiteError, TlsShipper
from paramedic.ship.codecs import pack_json
from paramedic.ship.tls import client_context
from paramedic.ship.transport import SiteAddress
from paramedic.ship.wire import recv_frame, send_frame
from tests.conftest import paramedic
from tests.support.databases import Databases
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def request(tls: ssl.SSLSocket, header: dict) -> tuple[dict, bytes]:
    send_frame(tls, header)
    return recv_frame(tls)


def _setup(mib: float, checksum: str) -> tuple[dict, bytes]:
    """A legal blastp setup whose queries inflate about 32x to `mib` MiB (random motifs repeated)."""
    rng = random.Random(23)
    n = int(mib * 2**20) // (600 * 33)
    queries = [[f"q{i}", "".join(rng.choices("ACDEFGHIKLMNPQRSTVWY", k=600)) * 33] for i in range(n)]
    setup = {
        "out": "m/out.txt", "program": "blastp", "options": ["-outfmt", "6"], "db_arg": "db/uni",
        "manifest_sha256": checksum, "n_queries": n, "pieces": [[0, n]],
    }  # fmt: skip
    return setup, pack_json(queries)


@pytest.fixture(scope="module")
def served(databases: Databases, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("memory")
    databases.place(base, 40, fragments=2, layout="fragments")
    databases.keys(base / "keys")
    (base / "root").mkdir()
    site = StorageSite(base / "db" / "uni", base / "root", base / "keys" / "server", base / "serve.log",
                       io_workers=1, extra=("--max-setup", "16M"))  # fmt: skip
    site.start()
    yield site, base, load_manifest(base / "db" / "uni").checksum()
    site.stop()


def _open(site: StorageSite, base: Path, setup: dict, payload: bytes) -> None:
    shipper = TlsShipper(SiteAddress("tls", "localhost", site.port), base / "keys" / "compute-a",
                         "blast-metadata", setup, payload, streams=1, timeout=20)  # fmt: skip
    try:
        shipper.start()
    finally:
        shipper.close()


def test_a_setup_beyond_max_setup_is_refused(served) -> None:
    site, base, checksum = served
    setup, payload = _setup(40, checksum)  # 1.3 MiB compressed: within the old ratio and 512 MiB bounds
    with pytest.raises(SiteError, match=r"setup inflates beyond 16777216 bytes"):
        _open(site, base, setup, payload)


def test_an_open_job_does_not_hold_its_queries_in_memory(served) -> None:
    site, base, checksum = served
    setup, payload = _setup(14, checksum)
    before = _rss_mib(site.proc.pid)
    _open(site, base, setup, payload)
    held = _rss_mib(site.proc.pid) - before
    assert held < 8, f"the site holds {held:.0f} MiB more for a job whose queries are 14 MiB"


# -- slow readers of replica data -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_replica(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The whole mmseqs2 database in one fragment (its .psq about 10 MiB), served by a real site."""
    base = tmp_path_factory.mktemp("reads")
    paramedic("format", "--in", str(data_dir / "mmseqs2" / "DB.fasta"), "--dbtype", "prot", "--fragments",
              "1", "--out", str(base / "db" / "uni"), "--layout", "fragments", "--quiet")  # fmt: skip
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    (base / "root").mkdir()
    site = StorageSite(base / "db" / "uni", base / "root", base / "keys" / "server", base / "serve.log",
                       io_workers=1)  # fmt: skip
    site.start()
    yield site, base
    site.stop()


def _tls(site: StorageSite, base: Path) -> ssl.SSLSocket:
    ctx = client_context(base / "keys" / "compute-a")
    raw = socket.create_connection(("127.0.0.1", site.port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def test_slow_readers_of_replica_data_hold_a_bounded_memory(big_replica) -> None:
    """24 connections ask for the largest volume file and never read the reply: the site holds at most its
    read slots' worth of data (8 x the read), not one copy or two per connection."""
    site, base = big_replica
    with _tls(site, base) as tls:
        manifest_reply, manifest = request(tls, {"op": "replica_manifest"})
        volume = json.loads(manifest)["fragments"][0]["volume"]
        files, _ = request(tls, {"op": "volume_files", "volume": volume})
    name, size = max(files["files"], key=lambda f: f[1])
    length = min(size, 16 << 20)
    assert length > 8 << 20
    before = _rss_mib(site.proc.pid)
    readers = [_tls(site, base) for _ in range(24)]
    try:
        for tls in readers:
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            send_frame(tls, {"op": "read", "name": name, "offset": 0, "length": length})
        time.sleep(3.0)
        held = _rss_mib(site.proc.pid) - before
        assert held < 8 * length / 2**20 + 40, f"24 slow readers of {length >> 20} MiB hold {held:.0f} MiB"
    finally:
        for tls in readers:
            tls.close()
    with _tls(site, base) as tls:  # the slots came back
        reply, data = request(tls, {"op": "read", "name": name, "offset": 0, "length": 4096})
        assert reply["op"] == "data" and len(data) == 4096


# -- declared sizes of trace metadata (issue 41, item 2) ---------------------------------------------------------


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _declared_bomb(content: int) -> bytes:
    """One zstd frame of `content` zero bytes that declares its size (about 32 KB per GiB)."""
    import zstandard

    packer = zstandard.ZstdCompressor(level=1).compressobj(size=content)
    block = bytes(1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(content >> 20)), packer.flush()])


def _bomb_metadata(content: int) -> tuple[bytes, bytes]:
    """A small real trace and its metadata with the first column swapped for a frame that declares
    `content` bytes: the header still claims the small file, so the memory budget counts little."""
    from paramedic.trace import codec
    from tests.unit.test_trace_codec import make_trace, periodic_kinds

    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    header, blobs = codec.parse_header(codec.encode(data, check=False).data, len(data))
    assert header["mode"] != "general"
    blobs[0] = _declared_bomb(content)
    return data, codec._frame(header, blobs)


@pytest.fixture(scope="module")
def trace_site(databases: Databases, tmp_path_factory: pytest.TempPathFactory):
    """A real `paramedic serve` without a replica (traces and plain output), 256 MiB for trace decodes."""
    base = tmp_path_factory.mktemp("traces")
    databases.keys(base / "keys")
    (base / "root").mkdir()
    site = StorageSite(None, base / "root", base / "keys" / "server", base / "serve.log", io_workers=1,
                       extra=("--trace-memory", "256M"))  # fmt: skip
    site.start()
    yield site, base
    site.stop()


def test_trace_metadata_declaring_more_than_its_file_is_refused_before_allocation(trace_site) -> None:
    """Before: an 83 KB chunk whose column declared 2 GiB took the site from 67 to 2,117 MiB while the
    budget counted 11 MB (here 1 GiB: the site's peak grew by 1,0xx MiB). Now refused, one line, the job
    failed with the reason, the peak unchanged, and the site still serves."""
    site, base = trace_site
    data, meta = _bomb_metadata(1 << 30)
    assert len(meta) < 60_000
    before = _peak_mib(site.proc.pid)
    shipper = TlsShipper(SiteAddress("tls", "localhost", site.port), base / "keys" / "compute-a",
                         "trace-metadata", {"out": "bomb.clog2"}, b"", streams=1, timeout=20)  # fmt: skip
    try:
        shipper.start()
        shipper.send({"offset": 0, "size": len(data), "mode": "periodic"}, meta)
        with pytest.raises(SiteError, match=r"declares \d+ bytes"):
            shipper.finish({"size": len(data), "sha256": "0" * 64})
    finally:
        shipper.close()
    grown = _peak_mib(site.proc.pid) - before
    assert grown < 100, f"the site's peak memory grew by {grown:.0f} MiB for a {len(meta)}-byte chunk"
    assert "internal error" not in site.log()
    assert site.alive() and not (base / "root" / "bomb.clog2").exists()
