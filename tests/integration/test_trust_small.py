"""Issue 23, item 18 (the small ones) at the storage site: a real in-process `SiteServer`, real TLS, real
files (the fixtures of test_site_faults)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from paramedic.ship.client import SiteError
from paramedic.site.space import Quota
from tests.integration.test_site_faults import _ship_ranges, make_site, world  # noqa: F401  (fixtures)
from tests.support.databases import Databases

pytestmark = pytest.mark.integration


def test_an_ended_job_leaves_no_decoded_markers_and_a_failed_one_no_empty_directories(make_site) -> None:  # noqa: F811
    site = make_site(quota=Quota(job_bytes=10_000))
    assert _ship_ranges(site, "kept/ok.bin", [1000, 1000])["bytes"] == 2000
    with pytest.raises(SiteError, match=r"per-job quota"):
        _ship_ranges(site, "made/for/it/big.bin", [3000, 3000])
    assert sorted(p.name for p in site.root.iterdir() if not p.name.startswith(".")) == ["kept"]
    state = site.root / ".paramedic-state"
    left = sorted(
        str(p.relative_to(state)) for p in state.rglob("*") if p.parent.name in ("decoded", "chunks")
    )
    assert left == []
    for job in site.server.store.jobs.values():
        assert not (job.directory / "decoded").exists()


def test_a_restart_failure_names_its_reason() -> None:
    from paramedic.site.jobs import describe

    assert describe(MemoryError()) == "MemoryError" and describe(ValueError()) == "ValueError"
    assert describe(ValueError("bad setup")) == "bad setup"


# -- items 7 and 8: every wait of the compute side is bounded by --ship-timeout ---------------------------------


def raised_within(call, seconds: float) -> BaseException | None:
    """What `call()` raised (None: it returned), failing the test if it is still waiting after `seconds`
    (a daemon thread: a hang is a failure, never a stuck test run)."""
    import threading

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting after {seconds:g} s")
    return outcome[0]


def test_a_site_that_answers_running_for_ever_is_given_up_in_time(make_site, monkeypatch) -> None:  # noqa: F811
    """Item 7: "pending, running" used to restart the client's clock on every answer."""
    import time

    from paramedic.ship.codecs import DirectCodec

    site = make_site()

    def stuck(job, header):
        job.running = 1  # as a BLAST+ that never returns
        return None

    monkeypatch.setattr(site.server.store, "finish", stuck)
    shipper = site.shipper("direct", {"out": "stuck/running.bin"}, timeout=1.5)
    try:
        shipper.start()
        shipper.send(*DirectCodec().encode((0, b"x")))
        start = time.monotonic()
        error = raised_within(lambda: shipper.finish({"size": 1, "sha256": "0" * 64}), 10)
        assert isinstance(
            error, SiteError
        ) and "did not finish the output within 2 s (--ship-timeout)" in str(error)
        assert time.monotonic() - start < 5
    finally:
        shipper.close()


def _real_site(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, **serve: float) -> Any:
    """A real site in this process (keys, a 40-protein replica, 3 queries in tmp_path)."""
    from paramedic.site.server import ServeSettings
    from tests.conftest import paramedic, take_fasta
    from tests.support.site import start_site

    take_fasta(data_dir / "mmseqs2" / "DB.fasta", tmp_path / "db.fasta", 40)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", tmp_path / "q.fasta", 3)
    paramedic("format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "2", "--out", "db/uni", "--quiet",
              cwd=tmp_path)  # fmt: skip
    paramedic("keys", "--out", str(tmp_path / "keys"), "--server", "localhost", "--client", "compute-a")
    (tmp_path / "root").mkdir()
    settings = ServeSettings(tmp_path / "db" / "uni", tmp_path / "root", "127.0.0.1:0", None, **serve)  # type: ignore[arg-type]
    return start_site(settings, tmp_path / "keys", monkeypatch)


def _site_whose_regeneration_never_returns(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, **serve: float
) -> tuple[Any, list[int]]:
    """A real site (`_real_site`) whose every regeneration starts a process in the regeneration's own
    directory that never ends, and the list its pids go into."""
    import subprocess

    from paramedic.ship import blast_codec

    started: list[int] = []

    def never_returns(program, options, db, queries, subjects, workdir):  # type: ignore[no-untyped-def]
        run_dir = workdir / "regen-stuck"
        run_dir.mkdir(exist_ok=True)
        proc = subprocess.Popen(["sleep", "600"], cwd=run_dir)
        started.append(proc.pid)
        proc.wait()
        raise blast_codec.ParamedicError(f"blastp failed (exit {proc.returncode})")

    monkeypatch.setattr(blast_codec, "regenerate", never_returns)
    return _real_site(tmp_path, data_dir, monkeypatch, **serve), started


def _search_shipping_to(
    site: Any, tmp_path: Path, ship_timeout: str, out: str = "x.out"
) -> subprocess.CompletedProcess[str]:
    from tests.integration.test_trust import run_bounded

    return run_bounded(
        ["search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out", out, "--site",
         f"tls://localhost:{site.port}", "--keys", str(tmp_path / "keys/compute-a"), "--ship", "metadata",
         "--strategy", "fragments", "--quiet", "--ship-timeout", ship_timeout, "--np", "1"],
        tmp_path, seconds=60,
    )  # fmt: skip


def _kill(pids: list[int]) -> None:
    for pid in pids:  # (before the fixes nothing ended them)
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def test_a_regeneration_that_never_returns_fails_its_job_and_is_killed(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7: the site bounds a regeneration in time (--regen-timeout): its BLAST+ (here a real process
    that never ends, in the regeneration's own directory) is killed and the search told, in seconds."""
    site, started = _site_whose_regeneration_never_returns(tmp_path, data_dir, monkeypatch, regen_seconds=1.0)
    try:
        begun = time.monotonic()
        proc = _search_shipping_to(site, tmp_path, "120")
        took = time.monotonic() - begun
    finally:
        _kill(started)
        site.stop()
    assert proc.returncode == 8, proc.stderr
    assert "regenerating took longer than 1 s (serve --regen-timeout)" in proc.stderr
    assert took < 60
    assert started and not os.path.exists(f"/proc/{started[0]}/cwd")  # killed (and reaped)
    assert not (site.root / "x.out").exists()


def test_a_regeneration_of_a_job_cancelled_by_its_compute_site_is_killed(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7, probed again: a BLAST+ of the site that never returns (a real one stopped with SIGSTOP in the
    probe; here a process in the regeneration's own directory) under the default --regen-timeout of an
    hour, and a compute site that gives up first (--ship-timeout) and cancels the job. The job failed
    ("cancelled by the compute site"), its scratch directory was removed, but the process ran on: the
    timeout's kill looked only at jobs not failed yet. It held the I/O worker thread that waited for it
    (the site's --io-workers, one each) for good."""
    site, started = _site_whose_regeneration_never_returns(tmp_path, data_dir, monkeypatch)
    try:
        proc = _search_shipping_to(site, tmp_path, "3")
        deadline = time.monotonic() + 10
        while started and os.path.exists(f"/proc/{started[0]}/cwd") and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [pid for pid in started if os.path.exists(f"/proc/{pid}/cwd")]
    finally:
        _kill(started)
        site.stop()
    assert proc.returncode == 8, proc.stderr
    assert "--ship-timeout" in proc.stderr and proc.stderr.count("paramedic: error:") == 1, proc.stderr
    assert started and not alive, "the cancelled job's BLAST+ still runs"
    assert not (site.root / "x.out").exists()


def test_a_fork_server_that_stops_answering_is_killed_and_replaced(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7, probed again: the site's BLAST+ fork server itself stopped (SIGSTOP), not a BLAST+ it forked
    (that one runs in the job's scratch directory, where the --regen-timeout kill finds it). The job failed
    at the timeout, but its I/O worker thread waited for the stopped server's reply for good: with one I/O
    worker, every later job then waited until its compute site gave up. Now the server is killed at the
    regeneration's bound and the thread's next regeneration starts a new one."""
    from paramedic.blast import forkserver

    site = _real_site(tmp_path, data_dir, monkeypatch, regen_seconds=6.0, io_workers=1)
    stopped: list[int] = []
    try:
        first = _search_shipping_to(site, tmp_path, "60", "first.out")
        assert first.returncode == 0, first.stderr
        # the case this test exists for: the site's regeneration ran through a fork server of this process
        stopped = [server._proc.pid for server in forkserver._servers.values()]
        assert stopped, "the site's regeneration started no fork server"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        second = _search_shipping_to(site, tmp_path, "60", "second.out")
        third = _search_shipping_to(site, tmp_path, "40", "third.out")
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        site.stop()
    assert second.returncode == 8 and second.stderr.count("paramedic: error:") == 1, second.stderr
    assert "took longer than 6 s" in second.stderr or "fork server" in second.stderr, second.stderr
    assert third.returncode == 0, third.stderr  # before: "did not finish the output within 40 s"
    assert (site.root / "third.out").read_bytes() == (site.root / "first.out").read_bytes()
    assert not (site.root / "second.out").exists()
    assert not any(os.path.exists(f"/proc/{pid}/cwd") for pid in stopped)  # killed and reaped


def test_an_inbox_client_waits_no_longer_than_its_timeout_whatever_progress_says(
    inbox_world, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 8: a forged progress.json ("running") used to restart the inbox client's clock for ever."""
    import json
    import threading
    import time

    from paramedic.ship.codecs import DirectCodec
    from paramedic.ship.inbox_client import InboxShipper
    from paramedic.ship.transport import SiteAddress
    from paramedic.site.inbox import InboxWatcher
    from paramedic.site.server import ServeSettings
    from tests.support.site import start_site

    (tmp_path / "root").mkdir()
    settings = ServeSettings(inbox_world["replica"], tmp_path / "root", "127.0.0.1:0", None, io_workers=1)
    site = start_site(settings, inbox_world["keys"], monkeypatch)
    monkeypatch.setattr(site.server.store, "finish", lambda job, header: None)
    inbox = tmp_path / "inbox"
    watcher = InboxWatcher(
        inbox, site.server.store, site.lines.append, inbox_world["keys"] / "server", 3600.0
    )
    watcher.start()
    stop = threading.Event()
    client = InboxShipper(SiteAddress("file", path=inbox), "direct", {"out": "p/x.bin"}, b"", 1.5,
                          inbox_world["keys"] / "compute-a")  # fmt: skip

    def forge() -> None:
        n = 0
        while not stop.wait(0.1):
            n += 1
            try:
                (client.directory / "progress.json").write_text(json.dumps({"running": 1, "decoded": n}))
            except OSError:
                pass

    forger = threading.Thread(target=forge, daemon=True)
    try:
        client.start()
        client.send(*DirectCodec().encode((0, b"abc")))
        forger.start()
        begun = time.monotonic()
        error = raised_within(lambda: client.finish({"size": 3, "sha256": "0" * 64}), 10)
        assert isinstance(error, SiteError) and "no final file from the storage site in 2 s" in str(error)
        assert time.monotonic() - begun < 6
    finally:
        stop.set()
        client.close()
        watcher.stop()
        site.stop()


def test_an_inbox_client_never_blocks_on_a_fifo_swapped_in_for_a_reply(inbox_world, tmp_path: Path) -> None:
    """Item 8, probed again: the client looked at a reply (`is_file`) and then opened it; a FIFO renamed
    over it in between (by anyone who can write the job's directory) blocked `open` for ever, a wait no
    --ship-timeout bounds. Replies are opened without blocking and taken only when regular files."""
    import threading

    from paramedic.ship.inbox_client import InboxShipper
    from paramedic.ship.transport import SiteAddress

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    client = InboxShipper(SiteAddress("file", path=inbox), "direct", {"out": "p/x.bin"}, b"", 1.0,
                          inbox_world["keys"] / "compute-a")  # fmt: skip
    client.directory.mkdir()
    fifo, regular, reply = tmp_path / "fifo", tmp_path / "regular", client.directory / "done.json"
    os.mkfifo(fifo)
    regular.write_text("{}")
    stop = threading.Event()

    def swap() -> None:  # done.json alternately a regular file and the FIFO, each put in place by rename
        while not stop.is_set():
            for source in (regular, fifo):
                os.link(source, client.directory / "next")
                os.rename(client.directory / "next", reply)

    swapper = threading.Thread(target=swap, daemon=True)
    reader = threading.Thread(
        target=lambda: [client._reply("done.json", "done") for _ in range(20000)], daemon=True
    )
    swapper.start()
    reader.start()
    reader.join(20)
    stop.set()
    swapper.join(5)
    blocked = reader.is_alive()
    if blocked:  # let it go: a writer opens the FIFO it waits on
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not blocked, "a reply's open blocked on a FIFO"


@pytest.fixture(scope="module")
def inbox_world(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("inbox-trust")
    databases.place(base, 40, fragments=2)
    databases.keys(base / "keys")
    return {"replica": base / "db" / "uni", "keys": base / "keys"}


# -- item 15: without --site-quota, one compute site cannot fill the disk for every other -------------------


def test_one_compute_site_cannot_take_all_the_space_without_a_site_quota(make_site, tmp_path: Path) -> None:  # noqa: F811
    import subprocess
    import time
    import uuid

    from paramedic.ship.wire import recv_frame, send_frame
    from tests.support.site import sha256

    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        site = make_site(root=disk, quota=Quota(reserve_bytes=64 * 1024))
        job = uuid.uuid4().hex  # compute site b: a job that goes on sending and never finishes
        with site.tls("compute-b") as tls:
            send_frame(tls, {"op": "open", "job": job, "codec": "direct", "setup": {"out": "b/held.bin"}})
            assert recv_frame(tls)[0]["op"] == "opened"
            block = b"z" * 330_000
            replies = []
            for index in range(5):  # stored twice (the chunk, its range): 3.3 MB of the 4 MB disk
                header = {"op": "chunk", "job": job, "index": index, "offset": index * len(block),
                          "length": len(block), "sha256": sha256(block)}  # fmt: skip
                send_frame(tls, header, block)
                reply = recv_frame(tls)[0]
                replies.append(reply.get("op"))
                if reply.get("op") == "error":
                    break
        deadline = time.monotonic() + 10
        while site.server.store.jobs[job].active and time.monotonic() < deadline:
            time.sleep(0.05)
        failure = site.server.store.jobs[job].failure or ""
        assert "default share" in failure, (replies, failure)
        assert _ship_ranges(site, "a/x.bin", [500_000])["bytes"] == 500_000  # compute site a still writes
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def _hold(site, client: str, out: str, block: int, blocks: int) -> list[str]:  # noqa: ANN001
    """A job of `client` that sends `blocks` chunks (while the site takes them) and never finishes: it
    holds their space until it expires. The site's replies."""
    import uuid

    from paramedic.ship.wire import recv_frame, send_frame
    from tests.support.site import sha256

    job = uuid.uuid4().hex
    data = b"z" * block
    replies = []
    with site.tls(client) as tls:
        send_frame(tls, {"op": "open", "job": job, "codec": "direct", "setup": {"out": out}})
        assert recv_frame(tls)[0]["op"] == "opened"
        for index in range(blocks):
            header = {"op": "chunk", "job": job, "index": index, "offset": index * block, "length": block,
                      "sha256": sha256(data)}  # fmt: skip
            send_frame(tls, header, data)
            replies.append(recv_frame(tls)[0].get("op"))
            if replies[-1] == "error":
                break
    return replies


def test_two_compute_sites_cannot_take_all_the_space_without_a_site_quota(make_site, tmp_path: Path) -> None:  # noqa: F811
    """Item 15, probed again: each site's default share was half of all the space jobs may use, counting
    what the other sites hold: two sites held 40% each and a third site's job failed (storage site nearly
    full). A site's share is now half of what is free plus what it holds itself: whoever comes next
    always finds half of the free space."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        site = make_site(root=disk, quota=Quota(reserve_bytes=64 * 1024))
        # stored twice (the chunk, its range): 1.6 MB each, 40% of the disk, within the old share of half
        assert _hold(site, "compute-b", "b/held.bin", 200_000, 4) == ["ack"] * 4
        _hold(site, "compute-c", "c/held.bin", 200_000, 4)
        assert _ship_ranges(site, "a/x.bin", [500_000])["bytes"] == 500_000  # compute site a still writes
    finally:
        subprocess.run(["umount", "-l", str(disk)])
