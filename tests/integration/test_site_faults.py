"""The storage site under hostile or unlucky clients (issue 11, items 1-10): real sockets, real TLS 1.3,
real files, a real `SiteServer` (in this process, with small limits so that each probe takes seconds).

Every test here reproduces a probe that the site failed before its fix: floods of silent connections,
slow senders, decompression bombs, decode errors lost in the pool, corrupted pieces, symbolic links swapped
in, replaced outputs, idle jobs, full disks, long names, deeply nested JSON.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from paramedic.ship import codecs
from paramedic.ship.client import SiteError
from paramedic.ship.codecs import Codec, DirectCodec, Segment
from paramedic.ship.wire import FrameDeadlines, recv_frame, send_frame
from paramedic.site.server import Limits, ServeSettings
from paramedic.site.space import PUBLISHED_FRESH_SECONDS, Quota
from tests.conftest import paramedic
from tests.support.databases import Databases
from tests.support.site import Site, closed_within, sha256, ship_bytes, start_site

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small formatted database (the replica) and keys for three compute sites."""
    base = tmp_path_factory.mktemp("faults")
    databases.place(base, 40, fragments=2, layout="fragments")
    databases.queries(base / "q.fasta", 3)
    databases.keys(base / "keys", ("compute-a", "compute-b", "compute-c"))
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
        with pytest.raises(SiteError, match=r"did not finish the output within 2 s \(--ship-timeout\)"):
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


def test_a_job_the_site_failed_ends_the_client_at_once(make_site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: a job the site failed (here: its output removed as cancelled) while the compute site
    had nothing to send. Its streams' keep-alives, and a stream reconnecting (reopening the job), used to
    be answered as for a live job: the client learnt of the failure only at finish, after the search.
    Now the next keep-alive or reopening ends the job with the site's reason, and nothing reconnects."""
    from paramedic.ship import client

    monkeypatch.setattr(client, "KEEPALIVE_SECONDS", 0.3)
    site = make_site()
    shipper = site.shipper("direct", {"out": "failed/x.bin"}, streams=2, timeout=30.0)
    try:
        shipper.start()
        job = site.server.store.jobs[shipper.job_id]
        site.server.store.cancel(job)  # the site fails the job (as a failed decode or a full disk does)
        for conn in list(site.server.store.jobs.values()):
            assert conn.failure is not None
        start = time.monotonic()
        while shipper.shared.failure is None and time.monotonic() - start < 5:
            time.sleep(0.05)
        assert shipper.shared.failure is not None, "the client never learnt its job failed"
        assert "cancelled by the compute site" in str(shipper.shared.failure)
        with pytest.raises(SiteError, match="cancelled"):
            shipper.finish({"size": 0, "sha256": "0" * 64})
        assert time.monotonic() - start < 5 and shipper.stats.reconnects <= 2
        # a stream that reconnects now (a cut link) is refused at once, not given the failed job again
        with site.tls() as tls:
            send_frame(
                tls,
                {"op": "open", "job": shipper.job_id, "codec": "direct", "setup": {"out": "failed/x.bin"}},
            )
            reply, _ = recv_frame(tls)
        assert reply["op"] == "error" and "cancelled" in reply["message"]
    finally:
        shipper.close()


def test_an_out_name_too_long_for_the_site_is_refused_before_the_search(world: dict[str, Path]) -> None:
    """A 213-255 character name used to pass, the search ran, and the site failed at the very end."""
    name = "n" * 212
    proc = paramedic(
        "search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]), "-out", f"x/{name}",
        "--site", "tls://localhost:9", "--keys", str(world["keys"] / "compute-a"), "--quiet", check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "a name of 212 bytes (at most 211)" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200b", "\x1b", "\r", "\u2028"])
def test_the_site_refuses_an_out_name_with_an_invisible_character(make_site, char: str) -> None:
    """Issue 41, item 10: U+202E (right-to-left override) was accepted in output names: "report\u202etxt.exe"
    lists as "reportexe.txt". Controls and formatting characters are refused at open, one line."""
    site = make_site()
    with pytest.raises(SiteError, match=rf"contains U\+{ord(char):04X}, a control or formatting character"):
        ship_bytes(site, f"names/report{char}txt.exe", b"x")
    assert not (site.root / "names").exists()
    assert ship_bytes(site, "names/r\u00e9sum\u00e9 \u6587\u4ef6.txt", b"x")["bytes"] == 1  # letters stay


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


def _object_bomb(n_queries: int) -> bytes:
    """A setup of about 1 MiB, zstd: 61 MiB of empty lists (`[[],[],...]`) and 2 MB of random letters,
    within --max-setup (64 MiB) and 64 times its size."""
    import random

    import zstandard

    letters = "".join(random.Random(41).choices("ACDEFGHIKLMNPQRSTVWY", k=2_000_000)).encode()
    lists = (61 * 2**20) // 3
    return zstandard.ZstdCompressor(level=3).compress(b"[" + b"[]," * lists + b'"' + letters + b'"]')


@pytest.mark.parametrize("n_queries", [1, 1_000_000])
def test_an_object_bomb_setup_is_refused_before_it_is_parsed_and_stalls_no_one(
    world, make_site, n_queries: int
) -> None:
    """Issue 41, item 3: 1 MiB of setup holding 64 MiB of `[[],[],...]` was parsed inside the store's lock:
    the site took 3.2 GiB and every other compute site stalled for 39 s. The values of a setup are counted
    before it is parsed (a job of n queries has 3n), and no setup is parsed in the store's lock: another
    compute site's job goes through meanwhile."""
    import resource
    import threading

    site = make_site()
    bomb = _object_bomb(n_queries)
    assert 2**20 <= len(bomb) < 2 * 2**20
    setup = dict(_blast_setup(world, site), n_queries=n_queries, pieces=[[0, n_queries]])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refusal: list[BaseException] = []

    def open_bomb() -> None:
        try:
            site.shipper("blast-metadata", setup, bomb, client="compute-b", timeout=120).start()
        except SiteError as exc:
            refusal.append(exc)

    bomber = threading.Thread(target=open_bomb)
    start = time.monotonic()
    bomber.start()
    time.sleep(0.2)  # the bomb is inflating or parsing now
    assert ship_bytes(site, "other/out.bin", b"x" * 1000)["bytes"] == 1000
    other = time.monotonic() - start
    bomber.join(timeout=120)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert refusal and re.search(r"setup holds more than \d+ values", str(refusal[0])), refusal
    assert other < 5, f"another compute site's job took {other:.1f} s"
    assert grown_mib < 300, f"the server's peak memory grew by {grown_mib:.0f} MiB"
    assert "internal error" not in site.log()
    assert [j.out.name for j in site.server.store.jobs.values()] == ["out.bin"]


def test_a_jobs_saved_queries_are_readable_by_the_site_alone(world, make_site) -> None:
    """Issue 41, item 10: the site's saved query files were mode 0644 (job.json is 0600): another user of
    the storage machine read every compute site's queries. Now 0600, in directories of the site's alone."""
    import stat

    from paramedic.ship.codecs import pack_json

    site = make_site()
    shipper = site.shipper("blast-metadata", _blast_setup(world, site), pack_json([["q1 secret", "MKV"]]))
    try:
        shipper.start()
        job = site.server.store.jobs[shipper.job_id]
        saved = job.context.queries.path
        assert saved.read_bytes().startswith(b"q1 secret")
        for path in (saved, *saved.parents[:3], job.directory / "job.json"):
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path} is mode {mode:o}"
    finally:
        shipper.close()


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


def test_a_job_resumed_after_a_restart_regenerates_only_from_a_replica_that_verifies(
    world, make_site, tmp_path: Path
) -> None:
    """Issue 23, item 1: a replica damaged while the site was down (times kept). A job resumed from
    disk was never digested again (only a new job's open digests the replica): its chunks regenerated
    from the changed bytes, and the report was published. Now it fails at the restart, saying why."""
    import os
    import shutil

    import zstandard

    replica = tmp_path / "replica"
    shutil.copytree(world["replica"].parent, replica)
    site = make_site(replica=replica / "uni")
    state, job = site.server.store.state, "f" * 32
    (state / job / "chunks").mkdir(parents=True)
    (state / job / "decoded").mkdir()
    (state / job / "pieces").mkdir()
    setup = zstandard.ZstdCompressor().compress(json.dumps([["q", "MKVLAAGIVGLLLAQ"]]).encode())
    (state / job / "setup.bin").write_bytes(setup)
    record = {
        "job": job,
        "peer": "tls:compute-a",
        "codec": "blast-metadata",
        "setup": _blast_setup(world, site),
    }
    (state / job / "job.json").write_text(json.dumps(record))
    site.stop()
    whole = replica / "uni" / "whole.psq"
    st = whole.stat()
    data = bytearray(whole.read_bytes())
    data[len(data) // 2] ^= 0x01
    whole.write_bytes(bytes(data))
    os.utime(whole, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = make_site(root=site.root, replica=replica / "uni")
    failure = again.server.store.jobs[job].failure
    assert failure is not None and failure.startswith(
        "cannot resume after a restart: storage site's replica is damaged"
    ), failure


# -- toy codecs (no BLAST): the store's mechanisms, through the real server -------------------------------------


class _BoomCodec(DirectCodec):
    """Output ranges whose decoding raises an error no codec is expected to raise."""

    name = "test-boom"

    def decode(self, header, payload, context):
        return [Segment(0, payload)] if payload != b"boom" else {}["no such key"]


class _PiecesCodec(Codec):
    """Each chunk is one piece (its index), stored as regenerated pieces are, assembled in order."""

    name = "test-pieces"
    layout = "pieces"

    def encode(self, unit):
        index, data = unit
        return {"piece": index}, data

    def prepare(self, setup, payload, site):
        return SimpleNamespace(pieces=range(setup["pieces"]))

    def decode(self, header, payload, context):
        return [Segment(header["piece"], payload)]

    def assemble(self, pieces, context, out):
        for _, data in pieces:
            out.write(data)


class _SlowCodec(DirectCodec):
    """Output ranges that take half a second each to decode (a small trace's regeneration)."""

    name = "test-slow"

    def decode(self, header, payload, context):
        time.sleep(0.5)
        return super().decode(header, payload, context)


@pytest.fixture
def toy_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codecs.CODECS, _BoomCodec.name, _BoomCodec)
    monkeypatch.setitem(codecs.CODECS, _PiecesCodec.name, _PiecesCodec)
    monkeypatch.setitem(codecs.CODECS, _SlowCodec.name, _SlowCodec)


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_one_compute_sites_queued_decodes_do_not_hold_back_anothers(make_site, toy_codecs) -> None:
    """Issue 41, item 4: 32 small trace jobs from one compute site made another's search take 68 s: the I/O
    workers took decodes in arrival order. Here 24 half-second decodes of compute-a wait for 2 workers
    (6 s); compute-b's job is decoded at the next free worker, and compute-a's still completes."""
    site = make_site(io_workers=2)
    data = b"a" * 24_000
    shipper = site.shipper("test-slow", {"out": "fair/a.bin"})
    try:
        shipper.start()
        for offset in range(0, len(data), 1000):
            shipper.send({"offset": offset, "length": 1000}, data[offset : offset + 1000])
        job = site.server.store.jobs[shipper.job_id]
        _wait(lambda: len(job.acked) == 24)
        start = time.monotonic()
        assert ship_bytes(site, "fair/b.bin", b"b" * 1000, client="compute-b")["bytes"] == 1000
        waited = time.monotonic() - start
        assert len(job.decoded) < 20, "compute-a's decodes ended before compute-b's was tried"
        assert waited < 2.0, f"compute-b's job waited {waited:.1f} s behind compute-a's decodes"
        assert shipper.finish({"size": len(data), "sha256": sha256(data)})["bytes"] == len(data)
    finally:
        shipper.close()


def test_a_trace_decode_waits_for_memory_no_longer_than_the_regen_timeout(
    make_site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, item 4: a trace decode waiting for the site's memory budget held its I/O worker for as long
    as others held the budget, past --regen-timeout (its job failed, the worker stayed taken): with one
    worker, every other compute site's job stopped. The wait ends at --regen-timeout, with a reason."""
    from paramedic.ship import trace_codec
    from paramedic.trace import codec
    from tests.unit.test_trace_codec import make_trace, periodic_kinds

    monkeypatch.setattr(trace_codec.MEMORY, "wait_seconds", trace_codec.MEMORY.wait_seconds)  # (put back)
    site = make_site(io_workers=1, regen_seconds=1.5)
    data = make_trace([periodic_kinds(0, 50), periodic_kinds(1, 50)], period=9)
    with trace_codec.MEMORY.take(trace_codec.MEMORY.limit):  # a long regeneration holds all of it
        shipper = site.shipper("trace-metadata", {"out": "wait/t.clog2"})
        try:
            shipper.start()
            shipper.send({"offset": 0, "size": len(data)}, codec.encode(data).data)
            with pytest.raises(
                SiteError, match=r"waited 1.[5-9] s for \d+ MiB|regenerating took longer than 1.5 s"
            ):
                shipper.finish({"size": len(data), "sha256": sha256(data)})
        finally:
            shipper.close()
        start = time.monotonic()  # the worker is free again: another compute site's job is decoded
        assert ship_bytes(site, "wait/b.bin", b"b" * 100, client="compute-b")["bytes"] == 100
        assert time.monotonic() - start < 3
    assert "internal error" not in site.log()


def test_decodes_waiting_for_a_worker_do_not_hold_their_payloads_in_memory(make_site, toy_codecs) -> None:
    """A chunk waiting for an I/O worker held its payload (up to 32 MiB) in memory: 64 queued per compute
    site, 256 in all, could hold gigabytes. Stored on disk before it is acknowledged, it is read back when
    its decode starts. Here 30 chunks of 2 MiB wait behind half-second decodes on one worker."""
    import tracemalloc

    site = make_site(io_workers=1)
    size, chunks = 2 * 2**20, 30
    shipper = site.shipper("test-slow", {"out": "queued/a.bin"}, timeout=60)
    tracemalloc.start()
    try:
        shipper.start()
        for i in range(chunks):
            shipper.send({"offset": i * size, "length": size}, bytes([i]) * size)
        job = site.server.store.jobs[shipper.job_id]
        _wait(lambda: len(job.acked) == chunks, timeout=30)
        held_mib = tracemalloc.get_traced_memory()[0] / 2**20
        assert len(job.decoded) < chunks - 10
        data = b"".join(bytes([i]) * size for i in range(chunks))
        assert shipper.finish({"size": len(data), "sha256": sha256(data)})["bytes"] == len(data)
    finally:
        tracemalloc.stop()
        shipper.close()
    assert held_mib < 20, f"{held_mib:.0f} MiB held while {chunks} chunks of 2 MiB waited for a worker"


# -- 8. an unexpected error while decoding fails the job, in the log and for the client ---------------------


def test_a_trace_stream_key_past_int32_fails_its_job_with_a_reason(make_site) -> None:
    """Issue 41, item 10: a stream key >= 2**31 in trace metadata raised OverflowError at the site, and the
    job failed as an "internal error". Now refused as metadata out of bounds, one line in the log."""
    from paramedic.trace import codec
    from tests.unit.test_trace_codec import _rewrite_header, make_trace, periodic_kinds

    site = make_site()
    data = make_trace([periodic_kinds(0, 50), periodic_kinds(1, 50)], period=9)
    meta = _rewrite_header(codec.encode(data).data, lambda h: h["streams"][0].update(key=2**31))
    shipper = site.shipper("trace-metadata", {"out": "t/key.clog2"})
    try:
        shipper.start()
        shipper.send({"offset": 0, "size": len(data)}, meta)
        with pytest.raises(SiteError, match=r"chunk 0: trace chunk: trace metadata: header out of bounds"):
            shipper.finish({"size": len(data), "sha256": sha256(data)})
    finally:
        shipper.close()
    assert "internal error" not in site.log() and "OverflowError" not in site.log()
    assert len(re.findall(r"failed: chunk 0", site.log())) == 1


def test_an_unexpected_decode_error_fails_the_job(make_site, toy_codecs) -> None:
    """A KeyError in the pool used to vanish: the job stayed pending for ever and nothing was logged."""
    site = make_site()
    shipper = site.shipper("test-boom", {"out": "boom/x.bin"})
    try:
        shipper.start()
        shipper.send({"offset": 0, "length": 4}, b"boom")
        with pytest.raises(
            SiteError, match=r"storage site: chunk 0: internal error while decoding: KeyError"
        ):
            shipper.finish({"size": 4, "sha256": sha256(b"boom")})
    finally:
        shipper.close()
    site.wait_log(r"failed: chunk 0: internal error while decoding: KeyError\('no such key'\)")
    assert "Traceback" not in site.log()
    assert not (site.root / "boom").exists()  # no hidden partial file left (nor, issue 23, its directory)


# -- 5. regenerated pieces carry checksums; the final file is read back -----------------------------------------


def test_a_piece_corrupted_on_disk_is_not_delivered(make_site, toy_codecs) -> None:
    site = make_site()
    shipper = site.shipper("test-pieces", {"out": "p/x.txt", "pieces": 2}, b"setup")
    try:
        shipper.start()
        shipper.send({"piece": 0}, b"first\n")
        shipper.send({"piece": 1}, b"second\n")
        job = site.server.store.jobs[shipper.job_id]
        _wait(lambda: len(job.decoded) == 2)
        piece = job.directory / "pieces" / "1.out"
        piece.write_bytes(b"sec0nd\n")  # a bit flip on the site's disk
        with pytest.raises(SiteError, match=r"regenerated piece 1 changed on disk after it was written"):
            shipper.finish({})
    finally:
        shipper.close()
    assert not (site.root / "p" / "x.txt").exists()
    assert (
        ship_pieces(site, "p/y.txt", [b"first\n", b"second\n"])["bytes"] == 13
    )  # an intact job goes through
    assert (site.root / "p" / "y.txt").read_bytes() == b"first\nsecond\n"


@pytest.mark.parametrize("written", [False, True])
def test_pieces_regenerated_before_a_restart_are_regenerated_again_if_the_replica_was_written(
    world, make_site, toy_codecs, tmp_path: Path, written: bool
) -> None:
    """Issue 23: a restart digests the replica as it is then, which says nothing of the bytes the pieces
    regenerated before it were made from: a replica written while the site was down and put back byte for
    byte (so the restart's digest passes) kept those pieces. The site records the replica's stamps at a
    job's open; a restart that finds them moved (a ctime no one can set back) drops the job's pieces and
    decodes its chunks again. Here a piece regenerated "from changed bytes" (consistent with its own
    checksum, as such a piece is) must be replaced, and kept when the replica was not written."""
    import shutil

    replica = tmp_path / "replica"
    shutil.copytree(world["replica"].parent, replica)
    site = make_site(replica=replica / "uni")
    shipper = site.shipper("test-pieces", {"out": "p/r.txt", "pieces": 2}, b"setup")
    try:
        shipper.start()
        shipper.send({"piece": 0}, b"first\n")
        job = site.server.store.jobs[shipper.job_id]
        _wait(lambda: len(job.decoded) == 1)
    finally:
        shipper.close()
    directory = job.directory
    assert (directory / "replica.json").is_file()
    site.stop()
    made_then = b"fir5t\n"  # what a regeneration from bytes changed at the time would have written
    (directory / "pieces" / "0.out").write_bytes(made_then)
    marker = json.loads((directory / "decoded" / "0.json").read_text())
    marker["segments"] = [[0, len(made_then), sha256(made_then)]]
    (directory / "decoded" / "0.json").write_text(json.dumps(marker))
    if written:  # the same bytes written back: the digest passes, the inode and ctime moved
        volume = next((replica / "uni").glob("*.psq"))
        volume.write_bytes(volume.read_bytes())
    again = make_site(root=site.root, replica=replica / "uni")
    resumed = again.server.store.jobs[job.job_id]
    assert resumed.failure is None
    if written:
        _wait(lambda: (directory / "pieces" / "0.out").is_file() and 0 in resumed.decoded)
        assert (directory / "pieces" / "0.out").read_bytes() == b"first\n"
        again.wait_log(r"the replica was written since its pieces were regenerated")
    else:
        assert 0 in resumed.decoded and (directory / "pieces" / "0.out").read_bytes() == made_then


def ship_pieces(site: Site, out: str, pieces: list[bytes]) -> dict:
    shipper = site.shipper("test-pieces", {"out": out, "pieces": len(pieces)}, b"setup")
    try:
        shipper.start()
        for i, data in enumerate(pieces):
            shipper.send({"piece": i}, data)
        return shipper.finish({})
    finally:
        shipper.close()


# -- 6. symbolic links swapped in after the job opened ----------------------------------------------------------


def test_a_directory_swapped_for_a_symlink_is_not_followed(make_site, tmp_path: Path) -> None:
    site = make_site()
    outside = tmp_path / "outside"
    outside.mkdir()
    shipper = site.shipper("direct", {"out": "d/x.bin"})
    try:
        shipper.start()
        (site.root / "d").rmdir()
        (site.root / "d").symlink_to(outside)  # after the open's check
        shipper.send({"offset": 0, "length": 3}, b"abc")
        with pytest.raises(SiteError, match=r"d is a symbolic link or not a directory"):
            shipper.finish({"size": 3, "sha256": sha256(b"abc")})
    finally:
        shipper.close()
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("codec", ["direct", "test-pieces"])
def test_a_symlink_planted_at_the_temporary_name_is_not_followed(
    make_site, toy_codecs, tmp_path: Path, codec: str
) -> None:
    site = make_site()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    setup = {"out": "t/x.bin", "pieces": 1}
    shipper = site.shipper(codec, setup, b"setup")
    try:
        shipper.start()
        (site.root / "t" / f".x.bin.paramedic-{shipper.job_id}").symlink_to(victim)
        shipper.send({"offset": 0, "length": 3} if codec == "direct" else {"piece": 0}, b"abc")
        with pytest.raises(SiteError, match=r"its temporary file is a symbolic link"):
            shipper.finish({"size": 3, "sha256": sha256(b"abc")} if codec == "direct" else {})
    finally:
        shipper.close()
    assert victim.read_bytes() == b"precious"
    assert not (site.root / "t" / "x.bin").exists()


def test_a_hard_link_planted_at_the_temporary_name_is_not_written(make_site, tmp_path: Path) -> None:
    site = make_site()
    victim = site.root / "victim.txt"
    victim.write_bytes(b"precious")
    shipper = site.shipper("direct", {"out": "h/x.bin"})
    try:
        shipper.start()
        (site.root / "h" / f".x.bin.paramedic-{shipper.job_id}").hardlink_to(victim)
        shipper.send({"offset": 0, "length": 3}, b"abc")
        with pytest.raises(SiteError, match=r"its temporary file was replaced"):
            shipper.finish({"size": 3, "sha256": sha256(b"abc")})
    finally:
        shipper.close()
    assert victim.read_bytes() == b"precious"


# -- 7. an existing output is never replaced; one output path, one job at a time --------------------------------


def test_an_existing_file_is_not_replaced(make_site) -> None:
    site = make_site()
    assert ship_bytes(site, "e/x.bin", b"first", client="compute-b")["bytes"] == 5
    with pytest.raises(SiteError, match=r"a file is already there \(the storage site never replaces one"):
        ship_bytes(site, "e/x.bin", b"second")
    assert (site.root / "e" / "x.bin").read_bytes() == b"first"


def test_two_jobs_cannot_write_the_same_output_at_once(make_site) -> None:
    """Both used to exit 0, and one output was lost."""
    site = make_site()
    first = site.shipper("direct", {"out": "same/x.bin"})
    second = site.shipper("direct", {"out": "same/x.bin"}, client="compute-b")
    try:
        first.start()
        with pytest.raises(SiteError, match=r"another job is writing it now"):
            second.start()
        first.send({"offset": 0, "length": 3}, b"one")
        assert first.finish({"size": 3, "sha256": sha256(b"one")})["bytes"] == 3
    finally:
        first.close()
        second.close()
    assert (site.root / "same" / "x.bin").read_bytes() == b"one"


def test_a_file_that_appears_while_the_job_runs_is_kept(make_site) -> None:
    site = make_site()
    shipper = site.shipper("direct", {"out": "late/x.bin"})
    try:
        shipper.start()
        (site.root / "late" / "x.bin").write_bytes(b"someone else's")
        shipper.send({"offset": 0, "length": 3}, b"abc")
        with pytest.raises(SiteError, match=r"a file appeared there while the job ran; not replaced"):
            shipper.finish({"size": 3, "sha256": sha256(b"abc")})
    finally:
        shipper.close()
    assert (site.root / "late" / "x.bin").read_bytes() == b"someone else's"
    assert sorted(p.name for p in (site.root / "late").iterdir()) == ["x.bin"]


# -- 3. idle jobs, failed compute jobs --------------------------------------------------------------------------


def _open_raw(site: Site, out: str, client: str = "compute-a") -> str:
    """Open a direct job and store one chunk, then go away without a word (a killed search)."""
    import uuid

    job = uuid.uuid4().hex
    with site.tls(client) as tls:
        send_frame(tls, {"op": "open", "job": job, "codec": "direct", "setup": {"out": out}})
        assert recv_frame(tls)[0]["op"] == "opened"
        send_frame(
            tls,
            {"op": "chunk", "job": job, "index": 0, "offset": 0, "length": 1, "sha256": sha256(b"x")},
            b"x",
        )
        assert recv_frame(tls)[0]["op"] == "ack"
    return job


def test_an_abandoned_job_expires_soon_and_frees_its_output_path(make_site) -> None:
    """Killed searches used to hold a job slot, their data and their output path for 168 hours."""
    site = make_site(open_idle_seconds=1.0)
    job = _open_raw(site, "gone/x.bin")
    store = site.server.store
    _wait(lambda: (store.jobs[job].directory / "failed.json").exists(), timeout=5)  # recorded last
    assert store.jobs[job].failure == "expired: no request for 1 s"
    assert not (site.root / "gone").exists()  # the hidden partial file is gone (and, issue 23, its directory)
    assert not (store.jobs[job].directory / "chunks").exists()
    assert ship_bytes(site, "gone/x.bin", b"new")["bytes"] == 3


def test_one_compute_site_cannot_hold_every_job(make_site, monkeypatch: pytest.MonkeyPatch) -> None:
    from paramedic.site import admission

    monkeypatch.setattr(admission, "MAX_ACTIVE_JOBS_PER_PEER", 3)
    site = make_site()
    for i in range(3):
        _open_raw(site, f"many/{i}.bin", client="compute-b")
    with pytest.raises(AssertionError):
        _open_raw(site, "many/3.bin", client="compute-b")
    site.wait_log(r"refused request 'open': storage site busy: this compute site has 3 jobs open")
    assert ship_bytes(site, "many/a.bin", b"a")["bytes"] == 1


def test_a_failed_compute_job_cancels_its_site_job(make_site) -> None:
    from paramedic.ship.destination import Shipping

    site = make_site()
    shipper = site.shipper("direct", {"out": "c/x.bin"})
    shipper.start()
    shipping = Shipping(None, "direct", DirectCodec(), shipper, 1)  # type: ignore[arg-type]
    shipping.write(b"partial output")
    job = site.server.store.jobs[shipper.job_id]
    _wait(lambda: len(job.decoded) == 1)
    shipping.abort()  # what the engine calls when the search fails
    assert job.failure == "cancelled by the compute site"
    assert not (site.root / "c").exists() and not (job.directory / "chunks").exists()


# -- 4. quotas and full disks -----------------------------------------------------------------------------------


def _ship_ranges(site: Site, out: str, sizes: list[int], client: str = "compute-a"):
    shipper = site.shipper("direct", {"out": out}, client=client)
    try:
        shipper.start()
        offset = 0
        for size in sizes:
            shipper.send({"offset": offset, "length": size}, b"y" * size)
            offset += size
        return shipper.finish({"size": offset, "sha256": sha256(b"y" * offset)})
    finally:
        shipper.close()


def test_a_job_over_its_quota_fails_and_leaves_nothing(make_site) -> None:
    site = make_site(quota=Quota(job_bytes=10_000))
    with pytest.raises(SiteError, match=r"per-job quota \(10000 bytes\)"):
        _ship_ranges(site, "q/big.bin", [3000, 3000])  # a chunk and its output range: 2 x 3000 each
    assert not (site.root / "q").exists()  # (issue 23: the directory made for it goes too)
    job = next(iter(site.server.store.jobs.values()))
    assert not (job.directory / "chunks").exists()
    assert _ship_ranges(site, "q/small.bin", [1000])["bytes"] == 1000


def test_a_compute_site_over_its_quota_cannot_crowd_out_the_others(make_site) -> None:
    site = make_site(quota=Quota(peer_bytes=10_000))
    _open_raw(site, "p/held.bin", client="compute-b")
    with pytest.raises(SiteError, match=r"this compute site's jobs would hold more than its quota"):
        _ship_ranges(site, "p/b.bin", [6000], client="compute-b")
    assert _ship_ranges(site, "p/a.bin", [4000])["bytes"] == 4000  # chunk and range: 8000 bytes held


def test_a_compute_sites_quota_counts_the_outputs_it_stored(make_site) -> None:
    """Issue 41, item 5: --site-quota counted open jobs only, and a compute site stored 37 MiB of finished
    outputs under --site-quota 5M. Its published outputs count for as long as they are there (across a
    restart); removing one gives its bytes back; another compute site is not touched."""
    quota = Quota(peer_bytes=10_000)
    site = make_site(quota=quota)
    assert _ship_ranges(site, "s/a1.bin", [3000])["bytes"] == 3000
    assert _ship_ranges(site, "s/a2.bin", [3000])["bytes"] == 3000  # 6,000 stored
    with pytest.raises(SiteError, match=r"more than its quota \(10000 bytes, the outputs they published"):
        _ship_ranges(site, "s/a3.bin", [3000])  # 9,000 in its chunk, 12,000 with its output range
    assert not (site.root / "s" / "a3.bin").exists()
    assert _ship_ranges(site, "s/b.bin", [3000], client="compute-b")["bytes"] == 3000
    site.stop()

    again = make_site(root=site.root, quota=quota)  # a restart counts them still
    with pytest.raises(SiteError, match=r"more than its quota \(10000 bytes"):
        _ship_ranges(again, "s/a4.bin", [3000])
    (site.root / "s" / "a1.bin").unlink()  # the operator (or the user) took one away: 3,000 stored
    time.sleep(PUBLISHED_FRESH_SECONDS)  # (seen when the files are next looked at)
    assert _ship_ranges(again, "s/a5.bin", [3000])["bytes"] == 3000
    assert "internal error" not in again.log()


@pytest.mark.parametrize("seen", ["before", "by the kernel"])
def test_a_full_disk_fails_the_job_and_frees_its_space(
    make_site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: str
) -> None:
    """After a disk-full failure its chunks, pieces and partial file used to stay: every later job failed.
    The site sees a full disk coming (free space checked before each write) or gets ENOSPC itself."""
    import os
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]).returncode
    ):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        # (a site quota as large as the disk: issue 23's default share, half of it, is not what this tests)
        site = make_site(root=disk, quota=Quota(reserve_bytes=0, peer_bytes=2**40))
        if seen != "before":
            monkeypatch.setattr(site.server.store.space, "check_free", lambda more: None)
        message = r"nearly full \(\d+ bytes free" if seen == "before" else r"no space left on device"
        with pytest.raises(SiteError, match=message):
            _ship_ranges(site, "full/x.bin", [1_000_000] * 6)
        # a job is no longer active once it failed, and its data is removed after that
        jobs = site.server.store.jobs.values()
        _wait(lambda: all(not j.active and (j.failure is None or j.cleaned.is_set()) for j in jobs))
        used = sum(p.stat().st_size for p in disk.rglob("*") if p.is_file())
        assert used < 10_000, sorted(str(p) for p in disk.rglob("*") if p.is_file())
        assert _ship_ranges(site, "full/y.bin", [1_000_000])["bytes"] == 1_000_000
        site.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_nearly_full_disk_refuses_new_jobs_with_a_reason(make_site) -> None:
    site = make_site(quota=Quota(reserve_bytes=2**62))
    with pytest.raises(SiteError, match=r"storage site nearly full \(\d+ bytes free, \d+ kept in reserve\)"):
        ship_bytes(site, "n/x.bin", b"x")


def test_a_job_refused_at_open_leaves_no_directory(make_site) -> None:
    """A job refused as it opens (here: the disk nearly full) left the directories on its output's way,
    empty, at the site (seen probing item 15 with `paramedic serve` on a small tmpfs)."""
    site = make_site(quota=Quota(reserve_bytes=2**62))
    with pytest.raises(SiteError, match="storage site nearly full"):
        ship_bytes(site, "run7/deep/x.bin", b"x")
    assert sorted(p.name for p in site.root.iterdir() if not p.name.startswith(".")) == []


def test_a_killed_search_started_again_supersedes_its_silent_job(make_site) -> None:
    """The same compute site, the same output, its earlier job silent for minutes: a search killed (no
    cancel) and run again must not wait for the old job to expire. Another site's job is never taken."""
    from paramedic.site.jobs import STALE_SECONDS

    site = make_site()
    old = _open_raw(site, "again/x.bin")
    with pytest.raises(SiteError, match=r"another job is writing it now"):
        ship_bytes(site, "again/x.bin", b"b", client="compute-b")
    with pytest.raises(SiteError, match=r"another job is writing it now"):
        ship_bytes(site, "again/x.bin", b"new")  # the old one may still be alive
    site.server.store.jobs[old].touched -= STALE_SECONDS + 1
    with pytest.raises(SiteError, match=r"another job is writing it now"):
        ship_bytes(site, "again/x.bin", b"b", client="compute-b")
    assert ship_bytes(site, "again/x.bin", b"new")["bytes"] == 3
    assert site.server.store.jobs[old].failure.startswith("superseded")
    assert sorted(p.name for p in (site.root / "again").iterdir()) == ["x.bin"]


# -- found by the fault soak (bench/faults.py) ---------------------------------------------------------------


def test_a_metadata_search_resumes_after_the_site_failed_it(
    world: dict[str, Path], make_site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --ship metadata search whose site was lost after the search (exit 8, the searches kept in the
    journal), run again: every search came from the journal, the pieces they released were held for
    shipping and nothing shipped them, so the run ended with exit 7 "internal: scheduler stalled with every
    worker idle" (8 of 148 runs in the soak)."""
    from paramedic.site.jobs import JobFailed

    site = make_site()
    store = site.server.store
    real_put_chunk = store.put_chunk
    failing = [True]

    def put_chunk(job, header, payload):
        if failing[0]:
            raise JobFailed("the test fails this job")
        return real_put_chunk(job, header, payload)

    monkeypatch.setattr(store, "put_chunk", put_chunk)
    local = tmp_path / "local.out"
    paramedic("search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]),
              "-out", str(local), "--np", "1", "--quiet")  # fmt: skip
    search = [
        "search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]), "-out", "re/x.out",
        "--np", "1", "--site", f"tls://localhost:{site.port}", "--keys", str(world["keys"] / "compute-a"),
        "--ship", "metadata", "--quiet",
    ]  # fmt: skip
    first = paramedic(*search, cwd=tmp_path, check=False)
    assert first.returncode == 8, first.stderr
    assert (tmp_path / "re" / ".x.out.journal").is_dir(), "nothing kept: the test no longer tests a resume"
    failing[0] = False
    again = paramedic(*search, cwd=tmp_path, check=False)
    assert again.returncode == 0, again.stderr
    assert (site.root / "re" / "x.out").read_bytes() == local.read_bytes()


def test_a_real_search_ships_through_a_handshake_flood(
    world: dict[str, Path], make_site, tmp_path: Path
) -> None:
    """Issue 23, item 13: 200 silent connections from the compute site's own address, and 40 from each of 8
    others, held while a real `paramedic search --site` (real ranks, BLAST+) ships: it used to fail
    (exit 8); now its output is BLAST+'s, through the site's default limits."""
    site = make_site()
    held = [
        socket.create_connection(("127.0.0.1", site.port), timeout=5, source_address=(source, 0))
        for source in ["127.0.0.1"] * 200 + [f"127.0.0.{2 + i % 8}" for i in range(320)]
    ]
    try:
        local = tmp_path / "local.out"
        paramedic("search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]),
                  "-out", str(local), "--np", "1", "--quiet")  # fmt: skip
        proc = paramedic(
            "search", "blastp", "-query", str(world["queries"]), "-db", str(world["replica"]),
            "-out", "flood/x.out", "--np", "1", "--site", f"tls://localhost:{site.port}", "--keys",
            str(world["keys"] / "compute-a"), "--ship", "metadata", "--quiet", cwd=tmp_path, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (site.root / "flood" / "x.out").read_bytes() == local.read_bytes()
    finally:
        for sock in held:
            sock.close()


# -- found by bench/fuzz.py (`make fuzz`) -----------------------------------------------------------------------


def test_an_unknown_request_with_a_huge_name_gets_a_clear_refusal(make_site) -> None:
    """The refusal echoed the whole request name: 20,000 "é" (40 KB in the header, UTF-8) made a 120 KB reply
    (JSON escapes), too large for a frame: the client got no answer, the log an "internal error"."""
    site = make_site()
    job = "0123456789abcdef0123456789abcdef"
    with site.tls() as tls:
        send_frame(tls, {"op": "open", "job": job, "codec": "direct", "setup": {"out": "fz/a.txt"}})
        assert recv_frame(tls)[0]["op"] == "opened"
        head = json.dumps({"op": "é" * 20000, "job": job}, ensure_ascii=False).encode()
        tls.sendall(struct.pack(">II", len(head), 0) + head)
        reply, _ = recv_frame(tls)
    assert reply["op"] == "error" and reply["message"].startswith("unknown request 'éééé")
    assert len(reply["message"]) < 200
    site.wait_log(r"refused request 'é+': unknown request")
    assert "internal error" not in site.log()
    assert max(len(line) for line in site.lines) < 1000


def test_a_refusal_quoting_a_huge_option_fits_in_a_frame(world, make_site) -> None:
    """A BLAST+ option of 15,000 "💥" (60 KB in the header) is quoted by its refusal ("unexpected argument
    ..."): 180 KB as JSON, too large for a reply frame. Every refusal's message is now bounded."""
    site = make_site()
    setup = {**_blast_setup(world, site), "options": ["-outfmt", "6", "💥" * 15000]}
    with site.tls() as tls:
        opening = {
            "op": "open",
            "job": "0" * 32,
            "codec": "blast-metadata",
            "setup": setup,
            "with_setup": True,
        }
        head = json.dumps(opening, ensure_ascii=False).encode()
        payload = codecs.pack_json([["q1", "MKVLAAGIVGLLLA"]])
        tls.sendall(struct.pack(">II", len(head), len(payload)) + head + payload)
        reply, _ = recv_frame(tls)
    assert reply["op"] == "error" and reply["message"].startswith("setup: unexpected argument '💥💥")
    assert len(reply["message"]) < 1100
    assert "internal error" not in site.log()
    assert max(len(line) for line in site.lines) < 1200


def test_a_restarted_site_removes_what_a_killed_one_was_regenerating(
    world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the fault soak (bench/faults.py): kill -9 of the site while it regenerated a piece left the
    run's scratch directory (queries, subject mask, alias, partial report) in <state>/work for ever."""
    root = tmp_path / "root"
    stale = root / ".paramedic-state" / "work" / "regen-0badf00d"
    stale.mkdir(parents=True)
    (stale / "report.out").write_bytes(b"x" * 1000)
    settings = ServeSettings(world["replica"], root, "127.0.0.1:0", world["keys"] / "server", io_workers=1)
    site = start_site(settings, world["keys"], monkeypatch)
    try:
        assert not stale.exists()
        assert ship_bytes(site, "after/x.bin", b"ok")["bytes"] == 2
    finally:
        site.stop()
