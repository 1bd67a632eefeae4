"""Two sites: `paramedic search --site` ships to a real `paramedic serve` over real TLS 1.3 (real BLAST+, MPI).

The storage site's file must be byte-identical to what a local search writes, whatever crosses the link
(output, compressed output, metadata), and it must stay so through a cut connection, a restarted server and
a corrupted chunk. Anyone without a certificate from the site's CA is refused, and nothing is ever written
outside the site's --root.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from paramedic.ship.blast_codec import BlastJobSetup, BlastMetadataCodec
from paramedic.ship.client import SiteAddress, SiteError, TlsShipper
from paramedic.ship.codecs import DirectCodec
from paramedic.ship.idcodec import encode_subjects
from paramedic.ship.wire import ProtocolError, recv_frame, send_frame
from tests.conftest import BIN, paramedic
from tests.support.databases import Databases
from tests.support.site import CuttingProxy, StorageSite

pytestmark = pytest.mark.integration

N_QUERIES = 25


@dataclass
class Sites:
    base: Path
    compute: Path  # cwd of the compute site: q.fasta, db/uni
    keys: Path  # made by `paramedic keys`: server/, compute-a/, ca/
    server: StorageSite
    _local: dict[str, bytes] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.server.root

    def search_argv(self, out: str, mode: str, outfmt: str = "0", url: str | None = None,
                    keys: Path | None = None, *extra: str) -> list[str]:  # fmt: skip
        return [
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-outfmt", outfmt, "-out", out,
            "--site", url or self.server.url, "--keys", str(keys or self.keys / "compute-a"), "--ship", mode,
            "--strategy", "fragments", "--quiet", "--ship-timeout", "60", "--record", str(self.record_path(out)),
            *extra,
        ]  # fmt: skip

    def search(self, out: str, mode: str, outfmt: str = "0", url: str | None = None, keys: Path | None = None,
               *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return paramedic(
            *self.search_argv(out, mode, outfmt, url, keys, *extra), cwd=self.compute, check=check
        )

    def record_path(self, out: str) -> Path:
        return self.base / "records" / (out.replace("/", "_") + ".run.json")

    def ship_record(self, out: str) -> dict:
        return json.loads(self.record_path(out).read_text())["ship"]

    def local(self, outfmt: str) -> bytes:
        """The same search written locally (cached per format): the bytes the storage site must hold."""
        if outfmt not in self._local:
            out = f"local-{outfmt}.out"
            paramedic(
                "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-outfmt", outfmt, "-out", out,
                "--strategy", "fragments", "--quiet", cwd=self.compute,
            )  # fmt: skip
            self._local[outfmt] = (self.compute / out).read_bytes()
        return self._local[outfmt]

    def shipper(self, codec: str, setup: dict, payload: bytes = b"", client: str = "compute-a",
                port: int | None = None, **kwargs) -> TlsShipper:  # fmt: skip
        address = SiteAddress("tls", "localhost", port or self.server.port)
        kwargs.setdefault("timeout", 20.0)
        return TlsShipper(address, self.keys / client, codec, setup, payload, **kwargs)


@pytest.fixture(scope="module")
def sites(databases: Databases, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("ship")
    compute, storage = base / "compute", base / "storage"
    for d in (compute, storage / "root", base / "records"):
        d.mkdir(parents=True)
    databases.place(compute, 3000, fragments=4)
    databases.queries(compute / "q.fasta", N_QUERIES)
    subprocess.run(["cp", "-r", str(compute / "db"), str(storage / "replica")], check=True)
    databases.keys(base / "keys", ("compute-a", "compute-b"))
    server = StorageSite(storage / "replica" / "uni", storage / "root", base / "keys" / "server",
                         base / "serve.log")  # fmt: skip
    server.start()
    try:
        yield Sites(base, compute, base / "keys", server)
    finally:
        server.stop()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert proc.returncode == code, proc.stderr
    # Empty stderr with the right exit code: engine/runtime/on_ranks.py prints the message in rank 0, then calls
    # comm.Abort, and mpiexec can tear the job down before it forwards the rank's stderr (intermittent).
    assert proc.stderr.strip(), f"exit {proc.returncode} without any message"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("paramedic: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and ".paramedic-state" not in p.parts)


# -- 1. what lands at the storage site is what a local search writes --------------------------------------


@pytest.mark.parametrize(
    "outfmt,mode",
    [("0", "direct"), ("0", "compressed"), ("0", "metadata"), ("7", "compressed"), ("7", "metadata"),
     ("5", "metadata"), ("0", "auto")],
)  # fmt: skip
def test_site_file_equals_local_output(sites: Sites, outfmt: str, mode: str) -> None:
    out = f"eq/{mode}-{outfmt}.out"
    sites.search(out, mode, outfmt)
    expected = sites.local(outfmt)
    assert (sites.root / out).read_bytes() == expected
    assert not (sites.compute / out).exists()  # -out names the file at the storage site, not here
    ship = sites.ship_record(out)
    if mode == "auto":  # the default, over TLS: a probe piece regenerated by a worker decides
        decision = ship["auto_decision"]
        assert decision["mode"] == ship["mode"] and decision["link"]["bandwidth_bytes_per_second"] > 0
        assert decision["g_seconds"] > 0 and decision["D_output_bytes"] > 0
        mode = ship["mode"]
    assert ship["mode"] == mode
    assert ship["site_sha256"] == sha256(expected)
    assert ship["output_bytes"] == len(expected)
    assert ship["chunks"] >= 1 and ship["chunks_resent"] == 0
    if mode == "metadata":  # the point of ParaMEDIC: far less crosses the link than the output
        assert ship["shipped_payload_bytes"] * 10 < len(expected)


# -- 2. only compute sites with a certificate from the site's CA get in --------------------------------------


def _raw_tls(sites: Sites, context: ssl.SSLContext) -> None:
    """Connect, say hello, read the reply: raises if the server refuses the client."""
    with socket.create_connection(("127.0.0.1", sites.server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            send_frame(tls, {"op": "hello"})
            recv_frame(tls)


@pytest.mark.parametrize("client", ["no-certificate", "tls1.2"])
def test_raw_client_refused(sites: Sites, client: str) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(sites.keys / "compute-a" / "ca.pem"))
    if client == "tls1.2":  # a valid certificate, but the server speaks TLS 1.3 only
        ctx.load_cert_chain(sites.keys / "compute-a" / "cert.pem", sites.keys / "compute-a" / "key.pem")
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    start = len(sites.server.log())
    with pytest.raises((ssl.SSLError, OSError, ProtocolError)):
        _raw_tls(sites, ctx)
    sites.server.wait_log(r"refused 127\.0\.0\.1: ", start=start)
    # ... while a client with its certificate is served.
    good = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    good.load_verify_locations(cafile=str(sites.keys / "compute-a" / "ca.pem"))
    good.load_cert_chain(sites.keys / "compute-a" / "cert.pem", sites.keys / "compute-a" / "key.pem")
    _raw_tls(sites, good)


@pytest.fixture(scope="module")
def foreign_keys(sites: Sites) -> Path:
    """Keys from another `paramedic keys` run: another CA."""
    path = sites.base / "foreign"
    paramedic("keys", "--out", str(path), "--server", "localhost", "--client", "compute-a")
    return path


def test_search_with_keys_of_another_ca(sites: Sites, foreign_keys: Path) -> None:
    """The compute site does not trust the server (another CA): exit 8 before anything is sent."""
    out = "refused/foreign.out"
    proc = sites.search(out, "direct", keys=foreign_keys / "compute-a", check=False)
    assert_one_line_error(proc, 8, "certificate is not trusted")
    assert not (sites.root / out).exists()
    assert not (sites.root / "refused").exists()
    assert "refused/foreign.out" not in sites.server.log()


def test_search_with_a_client_certificate_of_another_ca(sites: Sites, foreign_keys: Path) -> None:
    """The client trusts the server, but its own certificate is from another CA: the server refuses it."""
    mixed = sites.base / "mixed"
    mixed.mkdir()
    for name, source in (("ca.pem", sites.keys), ("cert.pem", foreign_keys), ("key.pem", foreign_keys)):
        (mixed / name).write_bytes((source / "compute-a" / name).read_bytes())
    os.chmod(mixed / "key.pem", 0o600)
    out = "refused/mixed.out"
    start = len(sites.server.log())
    began = time.monotonic()
    proc = sites.search(out, "direct", keys=mixed, check=False)
    assert_one_line_error(proc, 8, "refused")
    assert time.monotonic() - began < 30, "a refusal must fail fast, not retry until --ship-timeout"
    assert not (sites.root / out).exists()
    assert "refused/mixed.out" not in sites.server.log()
    sites.server.wait_log(r"refused 127\.0\.0\.1: ", start=start)


# -- 3. nothing is written outside the storage site's root ----------------------------------------------------


@pytest.mark.parametrize("out", ["../escape.txt", "/tmp/abs.txt", "a/../../escape.txt"])
def test_search_refuses_out_leaving_root(sites: Sites, out: str) -> None:
    proc = sites.search(out, "direct", check=False)
    assert_one_line_error(proc, 2, "relative path under the storage site's root")
    assert not (sites.root.parent / "escape.txt").exists()


@pytest.mark.parametrize("out", ["./dot/x.txt", "dot//x.txt", ".hidden/x.txt"])
def test_search_checks_out_as_the_server_does(sites: Sites, out: str) -> None:
    """A -out the storage site will refuse is a usage error found here, before any search (or it is
    normalised and accepted): never a late exit 8 saying "without '..'" for a path without '..'."""
    proc = sites.search(out, "direct", check=False)
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 0:
        assert (sites.root / os.path.normpath(out)).read_bytes() == sites.local("0")


@pytest.mark.parametrize(
    "out",
    ["../x.txt", "{case}/../../x.txt", "/x.txt", "{case}/link/x.txt", "{case}/dir/link/x.txt",
     "{case}/filelink.txt", ".paramedic-state/x.txt", "{case}/.hidden", "./x.txt", "{case}//x.txt", ""],
)  # fmt: skip
def test_server_refuses_out_leaving_root(sites: Sites, tmp_path: Path, out: str) -> None:
    """A compute site with a valid certificate but a hostile output path (the server checks, not the CLI)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    case = sites.root / f"case-{sha256(out.encode())[:8]}"  # links for this case: its own directory
    (case / "dir").mkdir(parents=True)
    (case / "link").symlink_to(elsewhere, target_is_directory=True)
    (case / "dir" / "link").symlink_to(elsewhere, target_is_directory=True)
    (case / "filelink.txt").symlink_to(elsewhere / "x.txt")
    path = out.format(case=case.name)
    before = files_under(sites.root.parent)
    shipper = sites.shipper("direct", {"out": path}, streams=1)
    start = len(sites.server.log())
    with pytest.raises(SiteError, match="storage site: output path"):
        shipper.start()
    shipper.close()
    assert list(elsewhere.iterdir()) == []
    assert files_under(sites.root.parent) == before
    assert not (sites.root.parent / "x.txt").exists() and not Path("/x.txt").exists()
    sites.server.wait_log(r"refused request 'open': output path", start=start)
    assert sites.server.alive()


# -- 4. a connection cut mid-transfer ----------------------------------------------------------------------


def test_connection_cut_mid_transfer(sites: Sites) -> None:
    expected = sites.local("0")
    assert len(expected) > 200_000
    out = "cut/direct.out"
    with CuttingProxy(sites.server.port, cut_after=50_000) as proxy:
        sites.search(out, "direct", "0", f"tls://localhost:{proxy.port}")
    assert proxy.cuts == 1
    assert (sites.root / out).read_bytes() == expected
    ship = sites.ship_record(out)
    assert ship["reconnects"] >= 1, ship
    assert ship["site_sha256"] == sha256(expected)
    assert "connection dropped" in sites.server.log()


# -- 5. the storage site is killed and restarted mid-job ----------------------------------------------------


def test_storage_site_restart_mid_job(sites: Sites) -> None:
    expected = sites.local("0")
    root = sites.base / "restart-root"
    root.mkdir()
    server = StorageSite(
        sites.server.replica, root, sites.server.keys, sites.base / "restart.log", io_workers=1
    )
    server.start()
    out = "restart/metadata.out"
    argv = sites.search_argv(out, "metadata", "0", server.url, None, "--batch", "1", "--regen-batch", "1")
    search = subprocess.Popen(
        [str(BIN / "paramedic"), *argv], cwd=sites.compute, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(server.state.glob("*/chunks/*.json")):
            assert search.poll() is None, search.communicate()[1]
            assert time.monotonic() < deadline, "no chunk reached the storage site"
            time.sleep(0.02)
        server.kill9()
        jobs = [p for p in server.state.iterdir() if re.fullmatch(r"[0-9a-f]{32}", p.name)]
        assert len(jobs) == 1
        assert not (jobs[0] / "done.json").exists(), "the job ended before the kill: make it longer"
        assert not (root / out).exists()
        time.sleep(0.5)  # the compute site notices: its streams retry
        start = len(server.log())
        server.start()
        server.wait_log(rf"job {jobs[0].name}: resumed from disk, [1-9]\d* chunks held", start=start)
        _, stderr = search.communicate(timeout=120)
        assert search.returncode == 0, stderr
    finally:
        if search.poll() is None:
            search.kill()
            search.wait()
        server.stop()
    assert (root / out).read_bytes() == expected
    assert sites.ship_record(out)["site_sha256"] == sha256(expected)


# -- 6. a corrupted chunk is detected and sent again ------------------------------------------------------


def test_flipped_byte_is_detected_and_resent(sites: Sites) -> None:
    data = os.urandom(300_000)
    parts = [(0, data[:100_000]), (100_000, data[100_000:200_000]), (200_000, data[200_000:])]

    def tamper(index: int, payload: bytes) -> bytes:
        if index != 1:
            return payload
        flipped = bytearray(payload)
        flipped[len(flipped) // 2] ^= 0x01
        return bytes(flipped)

    start = len(sites.server.log())
    shipper = sites.shipper("direct", {"out": "t/x.bin"}, streams=1, tamper=tamper)
    try:
        shipper.start()
        codec = DirectCodec()
        for unit in parts:
            shipper.send(*codec.encode(unit))
        done = shipper.finish({"size": len(data), "sha256": sha256(data)})
    finally:
        shipper.close()
    assert (sites.root / "t" / "x.bin").read_bytes() == data
    assert done["sha256"] == sha256(data) and done["bytes"] == len(data)
    assert shipper.stats.resent >= 1
    sites.server.wait_log(rf"job {shipper.job_id}: chunk 1 failed its SHA-256 check", start=start)


# -- 7. malformed metadata fails the job, not the server ------------------------------------------------------


def _metadata_setup(sites: Sites, n_queries: int = 2, pieces: int = 1) -> tuple[dict, bytes, int]:
    """The setup `open_shipping` would send for the first `n_queries` queries, outfmt 7, in `pieces`
    equal regeneration pieces."""
    from paramedic.db.fasta import read_fasta
    from paramedic.db.locate import resolve_database

    db, manifest = resolve_database("db/uni", sites.compute)
    queries = [(r.header, r.sequence) for r in read_fasta(sites.compute / "q.fasta", "prot")][:n_queries]
    setup = BlastJobSetup(
        program="blastp",
        options=["-outfmt", "7"],
        db_arg="db/uni",
        manifest_sha256=manifest.checksum(),
        pieces=tuple(range(i * n_queries // pieces, (i + 1) * n_queries // pieces) for i in range(pieces)),
        queries=queries,
    )
    header, payload = setup.encode()
    return header, payload, db.nseq


@pytest.mark.parametrize("bad", ["garbage", "wrong-nseq", "beyond-the-job", "part-of-a-piece"])
def test_malformed_metadata_fails_the_job(sites: Sites, bad: str) -> None:
    header, setup_payload, nseq = _metadata_setup(sites)
    unit_header = {"first_query": 0, "n_queries": 2}
    payload = {
        "garbage": b"PMDS\x02" + os.urandom(200),
        "wrong-nseq": encode_subjects(0, [[1, 2], [3]], nseq + 1),
        "beyond-the-job": encode_subjects(0, [[1], [2], [3]], nseq),
        "part-of-a-piece": encode_subjects(1, [[1]], nseq),
    }[bad]
    out = f"bad-metadata/{bad}.out"
    start = len(sites.server.log())
    shipper = sites.shipper("blast-metadata", {"out": out, **header}, setup_payload, streams=1)
    try:
        shipper.start()
        shipper.send(unit_header, payload)  # the header's sha256 is right: only the content is bad
        with pytest.raises(SiteError, match=r"storage site: chunk 0: metadata: "):
            shipper.finish({})
    finally:
        shipper.close()
    assert not (sites.root / out).exists()
    assert list((sites.root / "bad-metadata").glob(f".{bad}.out.*")) == []  # no partial file left either
    sites.server.wait_log(rf"job {shipper.job_id}: failed: chunk 0: metadata: ", start=start)
    assert sites.server.alive()

    # The server still serves a good job of the same kind.
    good = sites.shipper("blast-metadata", {"out": f"{out}.good", **header}, setup_payload, streams=1)
    try:
        good.start()
        good.send(*BlastMetadataCodec().encode((0, [[0, 1, 2], [5]], nseq)))
        done = good.finish({})
    finally:
        good.close()
    report = (sites.root / f"{out}.good").read_bytes()
    assert done["sha256"] == sha256(report)
    assert report.count(b"# BLASTP") == 2


def _ship_containers(sites: Sites, out: str, containers: list[bytes], order: list[int]) -> dict:
    """Open a metadata job for three one-query pieces and send `containers` as chunks 0, 1, 2, in the
    arrival order `order` (raw frames on one stream); return what the site's finish reports."""
    header, setup_payload, _ = _metadata_setup(sites, 3, pieces=3)
    shipper = sites.shipper("blast-metadata", {"out": out, **header}, setup_payload, streams=1)
    try:
        shipper.start()
        with shipper.connect() as tls:
            for index in order:
                payload = containers[index]
                chunk = {"op": "chunk", "job": shipper.job_id, "index": index, "sha256": sha256(payload),
                         "first_query": index, "n_queries": 1}  # fmt: skip
                send_frame(tls, chunk, payload)
                reply, _ = recv_frame(tls)
                if reply["op"] == "error":
                    raise SiteError(f"storage site: {reply['message']}")
                assert reply == {"op": "ack", "index": index}, reply
        shipper.next_index = len(containers)  # the chunks went out above, not through send()
        return shipper.finish({})
    finally:
        shipper.close()


def test_metadata_chunks_are_unpacked_in_encoding_order(sites: Sites) -> None:
    """Each query's ids are coded against earlier queries' ids, so the site must unpack chunk 2 only after
    chunks 0 and 1, however they arrive; a chunk sent under another index than it was encoded for fails."""
    _, _, nseq = _metadata_setup(sites, 3, pieces=3)
    codec = BlastMetadataCodec()
    base = list(range(0, 1200, 7))
    lists = [base, base[5:] + [1201, 1300], base[9:] + [1300, 1555]]  # each shares most ids with the last
    containers = [codec.encode((q, [ids], nseq))[1] for q, ids in enumerate(lists)]
    alone = [BlastMetadataCodec().encode((q, [ids], nseq))[1] for q, ids in enumerate(lists)]
    assert len(containers[2]) < len(alone[2])  # the reference is used

    in_order = _ship_containers(sites, "order/in-order.out", containers, [0, 1, 2])
    reversed_ = _ship_containers(sites, "order/reversed.out", containers, [2, 1, 0])
    report = (sites.root / "order" / "in-order.out").read_bytes()
    assert report.count(b"# BLASTP") == 3
    assert (sites.root / "order" / "reversed.out").read_bytes() == report
    assert in_order["sha256"] == reversed_["sha256"] == sha256(report)

    start = len(sites.server.log())
    swapped = [containers[1], containers[0], containers[2]]  # right content, wrong positions
    with pytest.raises(SiteError, match=r"chunk 0: metadata: container follows 1 earlier lists"):
        _ship_containers(sites, "order/swapped.out", swapped, [0, 1, 2])
    sites.server.wait_log(r"failed: chunk 0: metadata: container follows 1 earlier lists", start=start)
    assert not (sites.root / "order" / "swapped.out").exists()


def test_protocol_garbage_drops_the_connection_only(sites: Sites) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(sites.keys / "compute-a" / "ca.pem"))
    ctx.load_cert_chain(sites.keys / "compute-a" / "cert.pem", sites.keys / "compute-a" / "key.pem")
    start = len(sites.server.log())
    with socket.create_connection(("127.0.0.1", sites.server.port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"\xff\xff\xff\xff\x00\x00\x00\x00garbage")  # a 4 GB header
            assert tls.recv(100) == b""
    sites.server.wait_log(r"compute-a: connection dropped: bad header length", start=start)
    _raw_tls(sites, ctx)


def test_another_compute_site_cannot_touch_a_job(sites: Sites) -> None:
    """compute-b holds a valid certificate, but a job opened by compute-a is compute-a's alone."""
    owner = sites.shipper("direct", {"out": "owned/x.bin"}, streams=1)
    owner.start()
    intruder = sites.shipper("direct", {"out": "owned/x.bin"}, client="compute-b", streams=1)
    intruder.job_id = owner.job_id
    try:
        with pytest.raises(SiteError, match="job belongs to another compute site"):
            intruder.start()
        with intruder.connect() as tls:
            send_frame(tls, {"op": "finish", "job": owner.job_id, "chunks": 1, "size": 3})
            reply, _ = recv_frame(tls)
        assert reply["op"] == "error" and "unknown job" in reply["message"]
        owner.send(*DirectCodec().encode((0, b"abc")))
        assert owner.finish({"size": 3, "sha256": sha256(b"abc")})["bytes"] == 3
    finally:
        owner.close()
        intruder.close()
    assert (sites.root / "owned" / "x.bin").read_bytes() == b"abc"


def test_failed_jobs_do_not_fill_the_site(sites: Sites) -> None:
    """A job that failed for good (a chunk that cannot be decoded) must not count as open for ever: after
    64 of them (MAX_ACTIVE_JOBS) the site must still accept new jobs."""
    from paramedic.site.admission import MAX_ACTIVE_JOBS

    root = sites.base / "busy-root"
    root.mkdir()
    server = StorageSite(sites.server.replica, root, sites.server.keys, sites.base / "busy.log")
    server.start()
    try:
        probe = sites.shipper("direct", {"out": "p.bin"}, port=server.port)
        failed = ": failed: chunk 0: chunk: bad offset"
        with probe.connect() as tls:  # one connection opens them all (a handshake each cost most of the time)
            for n in range(1, MAX_ACTIVE_JOBS + 1):
                job = uuid.uuid4().hex
                send_frame(tls, {"op": "open", "job": job, "codec": "direct", "setup": {"out": f"f/{job}"}})
                reply = recv_frame(tls)[0]
                assert reply["op"] == "opened", reply
                header = {"op": "chunk", "job": job, "index": 0, "offset": -1, "length": 1}
                send_frame(tls, {**header, "sha256": sha256(b"x")}, b"x")
                assert recv_frame(tls)[0]["op"] == "ack"  # stored; its decoding fails: a bad offset
                # the job has failed before the next opens: one compute site may hold only
                # MAX_ACTIVE_JOBS_PER_PEER open at once, and on a loaded machine the site's decoding lagged
                # behind the opens (the 33rd was refused: "storage site busy")
                deadline = time.monotonic() + 20
                while server.log().count(failed) < n:
                    assert time.monotonic() < deadline, server.log()[-2000:]
                    time.sleep(0.005)
        good = sites.shipper("direct", {"out": "good.bin"}, port=server.port, streams=1)
        try:
            good.start()
            good.send(*DirectCodec().encode((0, b"fine")))
            good.finish({"size": 4, "sha256": sha256(b"fine")})
        finally:
            good.close()
        assert (root / "good.bin").read_bytes() == b"fine"
    finally:
        server.stop()


# -- the shared-directory transport ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["metadata", "compressed", "auto"])
def test_inbox_transport_delivers_the_same_file(sites: Sites, tmp_path: Path, mode: str) -> None:
    """--ship auto runs with partitions here: each partition's probe hears rank 0's choice, metadata."""
    inbox, root = tmp_path / "inbox", tmp_path / "root"
    root.mkdir()
    server = StorageSite(sites.server.replica, root, None, tmp_path / "serve.log", 1, inbox=inbox)
    server.start()  # the site makes its inbox as it starts
    try:
        out = f"inbox/{mode}.txt"
        record = tmp_path / "record.json"
        paramedic(
            "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-outfmt", "0", "-out", out,
            "--site", f"file://{inbox}", "--ship", mode, "--strategy", "fragments", "--quiet",
            "--ship-timeout", "60", "--record", str(record),
            *(["--np", "4", "--partition-size", "2", "--batch", "8"] if mode == "auto" else []), cwd=sites.compute,
        )  # fmt: skip
        expected = sites.local("0")
        assert (root / out).read_bytes() == expected
        ship = json.loads(record.read_text())["ship"]
        assert ship["site_sha256"] == sha256(expected)
        assert ship["mode"] == ("metadata" if mode == "auto" else mode)  # no link to measure: metadata
        if mode == "auto":
            assert (
                json.loads(record.read_text())["partitions"] == 2
                and ship["auto_decision"]["mode"] == "metadata"
            )
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["metadata", "compressed", "auto"])
def test_partitions_ship_what_one_master_ships(sites: Sites, mode: str) -> None:
    """Issue 13: with partitions (rank 0 a supermaster, 2 partition masters with a worker each), the
    partition masters forward their pieces to rank 0, which ships them: the site's file is the same.
    --ship auto: the first partition's probe decides at rank 0 (over TLS on this machine's loopback the
    output ships; the metadata side is the inbox case below)."""
    out = f"partitions/{mode}.out"
    sites.search(out, mode, "0", None, None, "--np", "4", "--partition-size", "2", "--batch", "8")
    assert (sites.root / out).read_bytes() == sites.local("0")
    record = json.loads(sites.record_path(out).read_text())
    ship = record["ship"]
    if mode == "auto":
        decision = ship["auto_decision"]
        assert decision["mode"] == ship["mode"] and decision["link"]["bandwidth_bytes_per_second"] > 0
        mode = ship["mode"]
    assert record["partitions"] == 2 and ship["mode"] == mode
    roles = [rank["role"] for rank in record["ranks_stats"]]
    assert roles == ["supermaster", "partition master", "worker", "partition master", "worker"]
