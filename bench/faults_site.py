"""bench/faults_site: the soak's attacks of issue 41 on the storage site and on the compute-side commands.

Each is bounded in count and time and runs against the soak's real `paramedic serve` on 127.0.0.1:

  - burst: ~1,500 TCP connections from 6 addresses 127.0.0.x, closed at once, half with SO_LINGER 0
    (resets): the site once died of it ("Invalid file descriptor: -1"); it must live and greet a client;
  - bombs: trace metadata whose zstd column declares 1 GiB (83 KB took the site to 2 GiB), and a BLAST
    setup holding 15 MiB of `[],` (an object bomb, parsed in the store's lock): both refused in one reply
    naming the reason, the site's memory not grown by them;
  - small jobs: 32 small direct jobs from one compute site on 8 connections at once, while another compute
    site ships a job of its own: that job must finish within a fair share (--fair-seconds);
  - signals: SIGTERM to a running `paramedic trace` (2 MPICH ranks) and to a running `paramedic ship`
    crossing a slow link: exit 130, one line, no process, /dev/shm segment or file of the job left, and
    the site job cancelled.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ATTACKER, BYSTANDER = "attack-a", "attack-b"  # compute sites of their own, beside the soak's clients
BURST_ADDRESSES = [f"127.0.0.{i}" for i in range(20, 26)]
OPENED = re.compile(r"job ([0-9a-f]{32}): opened by")


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    found = [int(x) for x in out.split()]
    return found + [d for child in found for d in _descendants(child)]


def _mapped_shm(pids: list[int]) -> set[Path]:
    """The /dev/shm files the processes map (MPICH's segments): what a stopped job must not leave."""
    found: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1]
                if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                    found.add(Path(path))
    return found


def _is_mpi(pid: int) -> bool:
    """A process of a traced job still alive (its pid not reused by another command)."""
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in line for name in (b"random_comm", b"hydra", b"mpiexec"))


def _peak_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _one_line(stderr: str, prefix: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith(prefix)


def declared_bomb(content: int) -> bytes:
    """One zstd frame of `content` zero bytes that declares its size (about 32 KB per GiB)."""
    import zstandard

    packer = zstandard.ZstdCompressor(level=1).compressobj(size=content)
    block = bytes(1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(content >> 20)), packer.flush()])


def trace_bomb(content: int) -> tuple[bytes, bytes]:
    """A small real trace's metadata with its first column swapped for a frame declaring `content` bytes
    (the header still claims the small file: a budget that trusts it counts little)."""
    from paramedic.trace import codec
    from tests.unit.test_trace_codec import make_trace, periodic_kinds

    data = make_trace([periodic_kinds(0, 200), periodic_kinds(1, 200)], period=9)
    header, blobs = codec.parse_header(codec.encode(data, check=False).data, len(data))
    blobs[0] = declared_bomb(content)
    return data, codec._frame(header, blobs)


def object_bomb(mib: int) -> bytes:
    """A setup's query list of `mib` MiB of empty lists (`[[],[],...]`), zstd: a few KB on the wire."""
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(b"[" + b"[]," * ((mib << 20) // 3) + b"[]]")


class SlowProxy(threading.Thread):
    """A loopback proxy carrying `rate` bytes a second towards the site: a shipment stays in flight (so a
    signal finds its job open). Bounded: it stops with `close()`, its connections with it."""

    def __init__(self, target: int, rate: float):
        super().__init__(daemon=True)
        self.target, self.rate = target, rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
                self.sockets += [client, upstream]
                threading.Thread(target=self.pump, args=(client, upstream, True), daemon=True).start()
                threading.Thread(target=self.pump, args=(upstream, client, False), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        with contextlib.suppress(OSError):
            while not self.stopped.is_set() and (data := src.recv(4096)):
                dst.sendall(data)
                if up:
                    time.sleep(len(data) / self.rate)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for sock in self.sockets:
            sock.close()
        self.join(timeout=5)


class SiteAttacks:
    """The four kinds, as soak actions: each judges itself and reports through the soak's `event` and
    `violation` (the soak's own checks go on meanwhile: every other job must still equal its reference)."""

    def __init__(self, soak: Any, faults: Any):
        sys.path.insert(0, str(REPO))  # the tests' trace builder, for the declared-size bomb
        self.soak = soak
        self.faults = faults
        self.mark = faults.MARK
        self.paramedic = faults.PARAMEDIC
        self.work: Path = soak.work / "attacks"
        self.work.mkdir()
        self.rng = random.Random(soak.args.seed * 7 + 41)
        self.keys = soak.work / "keys"
        self.program: Path | None = None
        self.trace_file: Path | None = None
        self.figures: dict[str, list[float]] = {}
        self.turn = 0

    # -- bookkeeping ------------------------------------------------------------------------------------
    def figure(self, name: str, value: float) -> None:
        with self.soak.lock:
            self.figures.setdefault(name, []).append(round(value, 3))

    def site_up(self) -> bool:
        return not self.soak.site_down.is_set() and bool(self.soak.site.pid)

    def shipper(self, client: str, codec: str, setup: dict, payload: bytes = b"", port: int = 0) -> Any:
        from paramedic.ship.client import TlsShipper
        from paramedic.ship.transport import SiteAddress

        address = SiteAddress("tls", "localhost", port or self.soak.site.port)
        return TlsShipper(address, self.keys / client, codec, setup, payload, streams=1, timeout=20)

    def ship_direct(self, client: str, out: str, data: bytes) -> float:
        """A whole direct job of `data` to `out`; its seconds (SiteError or OSError when it fails)."""
        from paramedic.ship.codecs import DirectCodec

        start = time.monotonic()
        shipper = self.shipper(client, "direct", {"out": out})
        try:
            shipper.start()
            shipper.send(*DirectCodec().encode((0, data)))
            shipper.finish({"size": len(data), "sha256": sha256(data).hexdigest()})
        finally:
            shipper.close()
        (self.soak.site_root / out).unlink(missing_ok=True)  # the user takes it away
        return time.monotonic() - start

    # -- (a) connection bursts --------------------------------------------------------------------------
    def burst(self) -> None:
        """~1,500 connections opened, then closed at once (half reset): the site lives and greets."""
        port, pid = self.soak.site.port, self.soak.site.pid
        count = self.rng.randint(1200, 1600)
        opened: list[socket.socket] = []
        deadline = time.monotonic() + 20
        for i in range(count):
            if time.monotonic() > deadline:
                break
            with contextlib.suppress(OSError):
                source = (BURST_ADDRESSES[i % len(BURST_ADDRESSES)], 0)
                opened.append(socket.create_connection(("127.0.0.1", port), timeout=2, source_address=source))
        for i, sock in enumerate(opened):
            if i % 2:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        self.soak.event("connection burst", connections=len(opened))
        time.sleep(1.0)
        if not pid or pid != self.soak.site.pid or self.soak.site_down.is_set():
            return  # the chaos killed the site meanwhile: nothing to judge
        if self.soak.site.proc.poll() is not None:
            self.soak.violation("the site exited after a connection burst", connections=len(opened))
            return
        start = time.monotonic()
        try:
            self.soak.hello(port)
        except OSError as exc:
            if self.site_up():
                self.soak.violation("no hello after a connection burst", error=str(exc)[:200])
            return
        self.figure("hello after a burst (s)", time.monotonic() - start)
        self.figure("burst connections", len(opened))

    # -- (b) declared-size and object bombs -------------------------------------------------------------
    def bombs(self) -> None:
        """Both bombs, each refused with its reason; the site's peak memory grows by less than 100 MiB."""
        from paramedic.db.manifest import load_manifest

        if not self.site_up():
            return
        pid = self.soak.site.pid
        before = _peak_kib(pid)
        data, meta = trace_bomb(1 << 30)
        self.refused(
            "trace declared-size bomb", r"declares \d+ bytes", lambda: self.send_trace_bomb(data, meta)
        )
        checksum = load_manifest(self.soak.work / "site" / "replica" / "uni").checksum()
        setup = {
            "out": "bombs/object.out", "program": "blastp", "options": ["-outfmt", "6"], "db_arg": "db/uni",
            "manifest_sha256": checksum, "n_queries": 1, "pieces": [[0, 1]],
        }  # fmt: skip
        bomb = object_bomb(15)  # within the site's --max-setup (16 MiB by default): refused by its values
        self.refused("object bomb setup", r"holds more than \d+ values", lambda: self.open_job(setup, bomb))
        if pid == self.soak.site.pid:
            grown = (_peak_kib(pid) - before) / 1024
            self.figure("site peak growth over both bombs (MiB)", grown)
            if grown > 100:
                self.soak.violation("a bomb grew the site's memory", mib=round(grown), trace_bytes=len(meta))

    def open_job(self, setup: dict, payload: bytes) -> None:
        shipper = self.shipper(ATTACKER, "blast-metadata", setup, payload)
        try:
            shipper.start()
        finally:
            shipper.close()

    def send_trace_bomb(self, data: bytes, meta: bytes) -> None:
        shipper = self.shipper(ATTACKER, "trace-metadata", {"out": "bombs/bomb.clog2"})
        try:
            shipper.start()
            shipper.send({"offset": 0, "size": len(data), "mode": "periodic"}, meta)
            shipper.finish({"size": len(data), "sha256": "0" * 64})
        finally:
            shipper.close()

    def refused(self, what: str, reason: str, attempt: Callable[[], Any]) -> None:
        from paramedic.ship.client import SiteError

        start = time.monotonic()
        try:
            attempt()
        except SiteError as exc:
            if re.search(reason, str(exc)):
                self.soak.event(f"{what} refused")
                self.figure(f"{what} refused in (s)", time.monotonic() - start)
                return
            self.judge_other(what, str(exc))
            return
        except OSError as exc:
            if self.site_up():
                self.soak.violation(f"{what}: connection failed", error=str(exc)[:300])
            return
        self.soak.violation(f"{what} accepted")

    def judge_other(self, what: str, error: str) -> None:
        """A refusal for another reason: the soak's other faults (a full disk, a changed replica, the site
        killed) are reasons; an internal error never is."""
        if "internal" in error:
            self.soak.violation(f"{what}: internal error", error=error[:300])
        else:
            self.soak.event(f"{what}: refused for another fault", error=re.sub(r"\d[\d,]*", "N", error)[:120])

    # -- (c) many small jobs from one compute site ------------------------------------------------------
    def small_jobs(self) -> None:
        """32 small jobs of one compute site on 8 connections at once; another's job meanwhile is timed."""
        if not self.site_up():
            return
        jobs, threads, failures = 32, 8, []

        def one_site(t: int) -> None:
            for n in range(t, jobs, threads):
                data = self.rng.randbytes(self.rng.randint(1_000, 200_000))
                try:
                    self.ship_direct(ATTACKER, f"small/j{t}-{n}.bin", data)
                except Exception as exc:  # noqa: BLE001 (counted: the chaos may kill the site meanwhile)
                    failures.append(str(exc))
                    if "internal" in str(exc):
                        self.soak.violation("a small job: internal error", error=str(exc)[:300])

        workers = [threading.Thread(target=one_site, args=(t,), daemon=True) for t in range(threads)]
        start = time.monotonic()
        for worker in workers:
            worker.start()
        time.sleep(0.3)
        try:
            other = self.ship_direct(BYSTANDER, "small/other.bin", self.rng.randbytes(100_000))
        except Exception as exc:  # noqa: BLE001
            other = -1.0
            self.judge_other("another compute site's job beside many small jobs", str(exc))
        for worker in workers:
            worker.join(timeout=120)
        self.soak.event("many small jobs", jobs=jobs, failed=len(failures), other_s=round(other, 2))
        self.figure("32 small jobs of one site (s)", time.monotonic() - start)
        if other >= 0:
            self.figure("another site's job meanwhile (s)", other)
            if other > self.soak.args.fair_seconds:
                self.soak.violation("another compute site's job waited", seconds=round(other, 1))

    # -- (d) signals to trace and ship ------------------------------------------------------------------
    def prepare_signals(self, mpicc: str, mpiexec: str) -> None:
        """random_comm built with MPICH and one finished trace of it (what `ship` sends)."""
        self.mpiexec = mpiexec
        self.program = self.work / "random_comm"
        source = REPO / "examples" / "trace" / "random_comm.c"
        subprocess.run([mpicc, "-O2", "-o", str(self.program), str(source)], check=True, capture_output=True)
        self.trace_file = self.work / "big.clog2"
        proc = self.run_trace(self.trace_file, "3000")
        proc.wait(timeout=300)
        if proc.returncode != 0 or not self.trace_file.exists():
            raise SystemExit(f"faults: the trace for ship failed: {proc.stderr.read()[-300:]}")

    def run_trace(self, out: Path, steps: str, tmp: Path | None = None) -> subprocess.Popen:
        tmp = tmp or self.work / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmp), self.mark: f"{self.soak.run_id}:attack:trace:"}
        argv = [self.paramedic, "trace", "-out", str(out), "--buffer", "65536", "--",
                self.mpiexec, "-n", "2", str(self.program), steps, "5"]  # fmt: skip
        return subprocess.Popen(argv, cwd=out.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip

    def signals(self) -> None:
        """SIGTERM to `trace` and to `ship`, by turns."""
        self.turn += 1
        (self.stop_trace if self.turn % 2 else self.stop_ship)()

    def stop_trace(self) -> None:
        run = self.work / f"trace{self.turn}"
        run.mkdir()
        tmp = run / "tmp"
        proc = self.run_trace(run / "run.clog2", str(10**9), tmp)
        pids: list[int] = []
        segments: set[Path] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            pids = _descendants(proc.pid)
            segments = _mapped_shm(pids)
            if segments and len(pids) >= 3:
                break
            time.sleep(0.1)
        time.sleep(self.rng.uniform(0.5, 3.0))
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.soak.violation("trace did not stop within 30 s of SIGTERM")
            proc.kill()
            _, stderr = proc.communicate()
        self.figure("trace stopped by SIGTERM in (s)", time.monotonic() - start)
        time.sleep(0.5)
        left = [p for p in pids if _is_mpi(p)]
        leftovers = {
            "exit": proc.returncode,
            "not one line": not _one_line(stderr, "paramedic: interrupted"),
            "processes": [p for p in self.soak_marked("attack:trace:")] + left,
            "segments": sorted(str(s) for s in segments if s.exists()),
            "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p != tmp),
        }
        self.soak.event("trace SIGTERM", ranks=len(pids), segments=len(segments))
        if proc.returncode != 130 or any(v for k, v in leftovers.items() if k != "exit"):
            self.soak.violation("trace stopped by SIGTERM left something", **leftovers, stderr=stderr[-300:])
        self.soak_kill("attack:trace:")

    def soak_marked(self, label: str) -> list[int]:
        return self.faults.marked(f"{self.soak.run_id}:{label}")

    def soak_kill(self, label: str) -> None:
        self.faults.kill_marked(f"{self.soak.run_id}:{label}")

    def stop_ship(self) -> None:
        if not self.site_up():
            return
        site = self.soak.site
        offset = site.logfile.stat().st_size
        proxy = SlowProxy(site.port, rate=100_000)
        proxy.start()
        out = f"ship/sig{self.turn}.clog2"
        env = {**os.environ, self.mark: f"{self.soak.run_id}:attack:ship:"}
        argv = [self.paramedic, "ship", str(self.trace_file), "-out", out, "--ship", "direct",
                "--site", f"tls://localhost:{proxy.port}", "--keys", str(self.keys / BYSTANDER)]  # fmt: skip
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        try:
            job = self.wait_log(
                offset, re.compile(OPENED.pattern + rf" tls:{BYSTANDER}, .* output {re.escape(out)}"), 30
            )
            if job is None or proc.poll() is not None:
                if self.site_up():
                    self.soak.event("ship not stopped (it ended or the site did not open its job)")
                return
            time.sleep(self.rng.uniform(0.2, 1.5))
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                _, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.soak.violation("ship did not stop within 30 s of SIGTERM")
                proc.kill()
                _, stderr = proc.communicate()
            self.figure("ship stopped by SIGTERM in (s)", time.monotonic() - start)
            cancelled = self.wait_log(offset, re.compile(rf"job ({job.group(1)}): failed: cancelled"), 15)
            self.soak.event("ship SIGTERM", cancelled=cancelled is not None)
            if proc.returncode != 130 or not _one_line(stderr, "paramedic: interrupted"):
                self.soak.violation("ship stopped by SIGTERM: not exit 130 and one line",
                                    exit=proc.returncode, stderr=stderr[-300:])  # fmt: skip
            if cancelled is None and self.site_up():
                self.soak.violation("ship stopped by SIGTERM: its site job not cancelled", job=job.group(1))
            if (self.soak.site_root / out).exists():
                self.soak.violation("ship stopped by SIGTERM: its output published", out=out)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            proxy.close()
            self.soak_kill("attack:ship:")

    def wait_log(self, offset: int, pattern: re.Pattern, seconds: float) -> re.Match | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with open(self.soak.site.logfile, "rb") as fh:
                fh.seek(offset)
                match = pattern.search(fh.read().decode(errors="replace"))
            if match:
                return match
            time.sleep(0.1)
        return None

    def result(self) -> dict[str, Any]:
        """Each figure as its count, median and maximum."""
        out = {}
        for name, values in sorted(self.figures.items()):
            ordered = sorted(values)
            out[name] = {"n": len(values), "median": ordered[len(values) // 2], "max": ordered[-1]}
        return out
