"""The storage site under hostile or unlucky clients (issue 11, items 1-10): real sockets, real TLS 1.3,
real files, a real `SiteServer` (in this process, with small limits so that each probe takes seconds).

Every test here reproduces a probe that the site failed before its fix: floods of silent connections,
slow senders, decompression bombs, decode errors lost in the pool, corrupted pieces, symbolic links swapped
in, replaced outputs, idle jobs, full disks, long names, deeply nested JSON.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest

from paramedic.ship.client import SiteError
from paramedic.ship.wire import FrameDeadlines, recv_frame, send_frame
from paramedic.site.server import Limits, ServeSettings
from tests.conftest import paramedic, take_fasta
from tests.integration.site import Site, closed_within, ship_bytes, start_site

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small formatted database (the replica) and keys for two compute sites."""
    base = tmp_path_factory.mktemp("faults")
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", base / "db.fasta", 40)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", base / "q.fasta", 3)
    paramedic("format", "--in", str(base / "db.fasta"), "--dbtype", "prot", "--fragments", "2",
              "--out", str(base / "db" / "uni"), "--quiet")  # fmt: skip
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a",
              "--client", "compute-b")  # fmt: skip
    return {"base": base, "replica": base / "db" / "uni", "keys": base / "keys", "queries": base / "q.fasta"}


@pytest.fixture
def make_site(world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    sites: list[Site] = []

    def make(**changes) -> Site:
        root = tmp_path / f"root{len(sites)}"
        root.mkdir()
        settings = ServeSettings(
            world["replica"], root, "127.0.0.1:0", world["keys"] / "server", io_workers=2
        )
        site = start_site(replace(settings, **changes), world["keys"], monkeypatch)
        sites.append(site)
        return site

    yield make
    for site in sites:
        site.stop()


# -- 1. slots, handshakes, deadlines ----------------------------------------------------------------------------


def test_silent_connections_do_not_lock_out_a_compute_site(make_site) -> None:
    """200 TCP connections that never start TLS (from another address) used to take all 64 slots: now only
    authenticated connections take a slot, and a handshake has a deadline, so a real compute site gets in."""
    site = make_site(limits=Limits(handshake_seconds=1.5, max_handshakes_per_address=16))
    silent = [
        socket.create_connection(("127.0.0.1", site.port), timeout=5, source_address=("127.0.0.2", 0))
        for _ in range(200)
    ]
    try:
        time.sleep(0.2)
        start = time.monotonic()
        assert ship_bytes(site, "in/a.bin", b"abc")["bytes"] == 3
        assert time.monotonic() - start < 5
        assert (site.root / "in" / "a.bin").read_bytes() == b"abc"
        # every silent connection is closed: at once beyond the per-address bound, else at the deadline
        waited = [closed_within(s, 4.0) for s in silent]
        assert all(w is not None for w in waited), waited.count(None)
        site.wait_log(r"refused 127\.0\.0\.2: too many connections in their TLS handshake")
        site.wait_log(r"refused 127\.0\.0\.2: no TLS handshake within 1\.5 s")
    finally:
        for s in silent:
            s.close()
    assert len(site.lines) < 40, "a flood must not flood the log"


def test_a_trickled_handshake_does_not_extend_its_deadline(make_site) -> None:
    site = make_site(limits=Limits(handshake_seconds=1.0))
    with socket.create_connection(("127.0.0.1", site.port), timeout=5) as sock:
        start = time.monotonic()
        hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40
        closed = False
        for byte in hello:  # one byte every 0.2 s: each wait is short, the whole is not
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if closed_within(sock, 0.2) is not None:
                closed = True
                break
        assert closed and time.monotonic() - start < 3.0


def test_slow_authenticated_senders_are_dropped(make_site) -> None:
    """64 authenticated clients sending one byte at a time used to hold every slot for ever."""
    site = make_site(limits=Limits(frames=FrameDeadlines(idle=30, frame=1.0, min_rate=16 * 1024)))
    slow = [site.tls() for _ in range(8)]
    start = time.monotonic()
    for sock in slow:
        sock.sendall(b"\x00")  # the first byte of a frame: its deadline starts
    for _ in range(4):
        time.sleep(0.3)
        for sock in slow:
            try:
                sock.sendall(b"\x00")
            except OSError:
                pass
    assert all(closed_within(s, 3.0) is not None for s in slow)
    assert time.monotonic() - start < 6
    site.wait_log(r"compute-a: connection dropped: too slow: frame not complete in time")
    for sock in slow:
        sock.close()
    assert ship_bytes(site, "slow/ok.bin", b"ok")["bytes"] == 2


def test_idle_connections_are_closed(make_site) -> None:
    site = make_site(limits=Limits(frames=FrameDeadlines(idle=1.0)))
    with site.tls() as tls:
        waited = closed_within(tls, 4.0)
    assert waited is not None and 0.8 < waited < 3
    site.wait_log(r"connection dropped: too slow: idle for 1 s")


def test_one_compute_site_cannot_hold_every_connection(make_site) -> None:
    site = make_site(limits=Limits(max_connections=8, max_connections_per_peer=4))
    held = [site.tls("compute-b") for _ in range(4)]
    try:
        for tls in held:  # authenticated and answered: each holds a slot
            send_frame(tls, {"op": "ping"})
            assert recv_frame(tls)[0]["op"] == "pong"
        with site.tls("compute-b") as extra:
            assert recv_frame(extra)[0]["op"] == "busy"
        assert ship_bytes(site, "fair/a.bin", b"fair")["bytes"] == 4  # compute-a still gets in
    finally:
        for tls in held:
            tls.close()


def test_a_connection_is_closed_between_frames_after_its_lifetime(make_site) -> None:
    site = make_site(limits=Limits(connection_seconds=0.5))
    with site.tls() as tls:
        send_frame(tls, {"op": "ping"})
        assert recv_frame(tls)[0]["op"] == "pong"
        time.sleep(0.7)
        send_frame(tls, {"op": "ping"})
        assert recv_frame(tls)[0]["op"] == "pong"  # the frame that was read is still answered
        assert closed_within(tls, 2.0) is not None


# -- 10. frame headers nested deeply --------------------------------------------------------------------------


def test_deeply_nested_frame_header_is_one_line_in_the_log(make_site) -> None:
    site = make_site()
    head = b'{"op":"ping","x":' + b"[" * 30000 + b"]" * 30000 + b"}"
    with site.tls() as tls:
        tls.sendall(struct.pack(">II", len(head), 0) + head)
        assert closed_within(tls, 5.0) is not None
    site.wait_log(r"compute-a: connection dropped: header is not acceptable JSON: nested too deeply")
    assert "Traceback" not in site.log()
    with site.tls() as tls:
        head = b'{"op":"ping","x":' + b"[" * 40 + b"]" * 40 + b"}"
        tls.sendall(struct.pack(">II", len(head), 0) + head)
        assert closed_within(tls, 5.0) is not None
    site.wait_log(r"header is not acceptable JSON: nested deeper than 32 levels")


# -- 8. the compute side's finish loop honours --ship-timeout ---------------------------------------------------


def test_finish_gives_up_on_a_site_that_stays_pending(make_site, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site that always answers "pending", with nothing decoding, used to hold the search for ever."""
    site = make_site()
    monkeypatch.setattr(site.server.store, "finish", lambda job, header: None)
    shipper = site.shipper("direct", {"out": "stuck/x.bin"}, timeout=1.5)
    try:
        shipper.start()
        from paramedic.ship.codecs import DirectCodec

        shipper.send(*DirectCodec().encode((0, b"x")))
        start = time.monotonic()
        with pytest.raises(SiteError, match=r"made no progress on the output for 2 s \(--ship-timeout\)"):
            shipper.finish({"size": 1, "sha256": "0" * 64})
        assert time.monotonic() - start < 5
    finally:
        shipper.close()


def test_a_stream_with_nothing_to_send_keeps_its_connection(
    make_site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes silent connections; a compute site between chunks sends keep-alives instead."""
    from paramedic.ship import client

    monkeypatch.setattr(client, "KEEPALIVE_SECONDS", 0.3)
    site = make_site(limits=Limits(frames=FrameDeadlines(idle=1.0)))
    shipper = site.shipper("direct", {"out": "alive/x.bin"})
    try:
        shipper.start()
        time.sleep(2.5)  # more than twice the idle limit, with nothing to send
        from paramedic.ship.codecs import DirectCodec

        shipper.send(*DirectCodec().encode((0, b"late")))
        assert shipper.finish({"size": 4, "sha256": __import__("hashlib").sha256(b"late").hexdigest()})
        assert shipper.stats.reconnects == 0
    finally:
        shipper.close()
    assert "too slow" not in site.log()


def test_an_out_name_too_long_for_the_site_is_refused_before_the_search(world: dict[str, Path]) -> None:
    """A 213-255 character name used to pass, the search ran, and the site failed at the very end."""
    name = "n" * 212
    proc = paramedic(
        "search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]), "-out", f"x/{name}",
        "--site", "tls://localhost:9", "--keys", str(world["keys"] / "compute-a"), "--quiet", check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "a name of 212 bytes (at most 211)" in proc.stderr and "Traceback" not in proc.stderr


def test_the_site_refuses_an_out_name_too_long_at_open(make_site) -> None:
    site = make_site()
    with pytest.raises(SiteError, match=r"a name of 212 bytes \(at most 211\)"):
        ship_bytes(site, "n" * 212, b"x")
    assert ship_bytes(site, "n" * 211, b"x")["bytes"] == 1  # the longest accepted name works to the end


# -- 2. decompression bombs -------------------------------------------------------------------------------------


def _bomb(inflated_mib: int) -> bytes:
    import zstandard

    packer = zstandard.ZstdCompressor(level=19).compressobj()
    parts = [packer.compress(b'[["q","')]
    parts += [packer.compress(b"A" * 2**20) for _ in range(inflated_mib)]
    parts += [packer.compress(b'"]]'), packer.flush()]
    return b"".join(parts)


def _blast_setup(world: dict[str, Path], site: Site) -> dict:
    return {
        "out": "bomb/out.txt", "program": "blastp", "options": ["-outfmt", "6"], "db_arg": "db/uni",
        "manifest_sha256": site.server.replica.manifest_sha256, "n_queries": 1, "pieces": [[0, 1]],
    }  # fmt: skip


def test_a_decompression_bomb_setup_is_refused_while_inflating(world, make_site) -> None:
    import resource

    site = make_site()
    bomb = _bomb(200)
    assert len(bomb) < 20_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    shipper = site.shipper("blast-metadata", _blast_setup(world, site), bomb)
    start = time.monotonic()
    with pytest.raises(SiteError, match=r"setup inflates beyond 16777216 bytes \(\d+ compressed\): refused"):
        shipper.start()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert time.monotonic() - start < 3
    assert grown_mib < 40, f"the server's peak memory grew by {grown_mib:.0f} MiB"
    assert not any(site.server.store.jobs)


def test_a_bomb_left_in_the_state_by_an_older_site_does_not_stop_a_restart(world, make_site) -> None:
    """A job stored before the bound existed is failed at restart (it used to be inflated again each time)."""
    import json

    site = make_site()
    state, job = site.server.store.state, "e" * 32
    (state / job / "chunks").mkdir(parents=True)
    (state / job / "decoded").mkdir()
    (state / job / "setup.bin").write_bytes(_bomb(100))
    record = {
        "job": job,
        "peer": "tls:compute-a",
        "codec": "blast-metadata",
        "setup": _blast_setup(world, site),
    }
    (state / job / "job.json").write_text(json.dumps(record))
    site.stop()
    again = make_site(root=site.root)
    assert again.server.store.jobs[job].failure.startswith(
        "cannot resume after a restart: setup inflates beyond"
    )
    assert not (state / job / "setup.bin").exists()
