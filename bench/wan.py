"""bench/wan: writing BLAST output to a remote storage site over an emulated wide-area link (issue 3).

The mmseqs2-examples queries against its 20,000 proteins, outfmt 0, side by side at every point:
  (a) blastp -num_threads 2 with -out on an sshfs mount of the storage root (what users do today)
  (b) paramedic search --ship direct       (output bytes regenerated here, streamed to `paramedic serve`)
  (c) paramedic search --ship compressed   (the same bytes, compressed on the wire)
  (d) paramedic search --ship metadata     (only the metadata crosses; the storage site regenerates)
  (e) paramedic search, output written locally (the limit: no link at all)
The link is emulated in user space (no netem in this kernel) for every connection to `paramedic serve`
and to a private sshd: Toxiproxy adds a latency toxic of RTT/2 in BOTH directions, and the rate is one
bottleneck shared by all connections, each way (a relay in this harness; `--shaper toxiproxy` uses
Toxiproxy's bandwidth toxic instead, which limits each connection separately, so parallel streams get a
multiple of the rate). Each link setting is checked first with a TCP probe (RTT, throughput both ways,
and 4 parallel streams together).

Sweeps (points as in the ParaMEDIC paper; settings shared by two sweeps run once):
  rtt              round-trip delay 0, 50, 100, 200 ms at --rate-mbit (10)
  rate             link rate 100, 10, 1 Mbit/s at --rtt-ms (50)
  queries          100, 250, 500 queries
  max_target_seqs  -max_target_seqs 50, 250, 1000
Every output is compared with (e)'s by sha256. Writes --out (JSON, rewritten after every point), a
Markdown table (RESULTS-table.md next to it) and a plot (results.png, needs matplotlib). Not a test:
timings are noisy; the full sweep takes hours on 2 cores. Prerequisites: `bash bench/wan/setup.sh`.

    .venv/bin/python bench/wan.py --quick
    .venv/bin/python bench/wan.py [--sweep rtt [--points 0,100]] [--queries 500] [--configs a,e]
    .venv/bin/python bench/wan.py --render-only      # table + plot again from --out
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from paramedic.report.record import RunRecord

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
TOOLS = Path(os.environ.get("PARAMEDIC_TOOLS", Path.home() / ".cache/paramedic/tools"))
BIN = Path(sys.executable).parent
PARAMEDIC = str(BIN / "paramedic")
SSHD = "/usr/sbin/sshd"
POSTED = re.compile(rb"^ *Posted date: .*$", re.M)  # the text reports indent it by four spaces
FRAGMENTS = 4

CONFIGS = {
    "a": "blastp -num_threads 2, -out on sshfs",
    "b": "paramedic --ship direct",
    "c": "paramedic --ship compressed",
    "d": "paramedic --ship metadata",
    "e": "paramedic, local output",
}
RUN_ORDER = "eabcd"  # (e) first: it is the reference output of the point
SWEEPS = {
    "rtt": [0, 50, 100, 200],
    "rate": [100, 10, 1],
    "queries": [100, 250, 500],
    "max_target_seqs": [50, 250, 1000],
}
SWEEP_UNITS = {"rtt": "RTT ms", "rate": "Mbit/s", "queries": "queries", "max_target_seqs": "-max_target_seqs"}
QUICK_QUERIES = 20
QUICK_POINTS = {"rtt": [50], "rate": [10], "queries": [QUICK_QUERIES], "max_target_seqs": [50]}


class Interrupted(Exception):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so every process and mount is cleaned up."""


# ----------------------------------------------------------------------------- the model (Eq. 3)


def predicted_speedup(
    D: float, x: float, B: float, f: float, g: float, compute_seconds: float
) -> dict[str, float]:
    """The ParaMEDIC paper's sequential model (Eq. 3) of shipping metadata instead of the output.

    D: output bytes; x: metadata bytes that cross the link; B: link rate in bytes per second;
    f: seconds to produce the metadata at the compute site (beyond the search itself);
    g: seconds to regenerate the output from the metadata at the storage site;
    compute_seconds: the search itself (here: the local run (e), which writes to a local disk).

      baseline time = compute + D / B                 (compute, then move the whole output)
      metadata time = compute + f + x / B + g         (compute, make metadata, move it, regenerate)
      speedup       = baseline / metadata

    Sequential: nothing overlaps, and the link is its rate alone (latency, TCP and SSH/TLS costs are not
    in the model). Shipping metadata pays when D - x > B * (f + g), the rule `--ship auto` uses.
    """
    baseline = compute_seconds + D / B
    metadata = compute_seconds + f + x / B + g
    return {"baseline_s": baseline, "metadata_s": metadata, "speedup": baseline / metadata}


# ----------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {last_line(log.read_text())}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


def start(stack: contextlib.ExitStack, cmd: list[str], log: Path, **kwargs: Any) -> subprocess.Popen:
    """Start a background process in its own session; the stack stops it (and its group) at the end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )
    stack.callback(stop, proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def error_line(stderr: str, stdout: str, returncode: int) -> str:
    """paramedic's own last error line when there is one (not MPI's abort notice), else the last line."""
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("paramedic")]
    return (ours or lines or [f"exit {returncode}"])[-1]


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# ----------------------------------------------------------------------------- the emulated link


class Toxiproxy:
    """A toxiproxy-server of our own on a free port, driven through its HTTP API."""

    def __init__(self, stack: contextlib.ExitStack, work: Path) -> None:
        binary = TOOLS / "toxiproxy-server"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run `bash bench/wan/setup.sh`")
        self.port = free_port()
        log = work / "logs" / "toxiproxy.log"
        env = {**os.environ, "LOG_LEVEL": "warn"}
        proc = start(stack, [str(binary), "-host", "127.0.0.1", "-port", str(self.port)], log, env=env)
        wait_for_port(self.port, proc, "toxiproxy-server", log)
        stamp = TOOLS / "toxiproxy-server.version"  # `go install` builds report the version "git"
        self.version = stamp.read_text().strip() if stamp.exists() else self.api("GET", "/version")
        self.proxies: dict[str, int] = {}

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text.strip()

    def proxy(self, name: str, upstream_port: int) -> int:
        """A proxy on a free local port to 127.0.0.1:upstream_port; returns the listening port."""
        made = self.api(
            "POST", "/proxies",
            {"name": name, "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{upstream_port}", "enabled": True},
        )  # fmt: skip
        self.proxies[name] = int(made["listen"].rsplit(":", 1)[1])
        return self.proxies[name]

    def set_link(self, rtt_ms: float, rate_mbit: float) -> None:
        """Latency RTT/2 and the rate in both directions on every proxy (latency first: the bandwidth
        toxic keeps the chunk's timestamp, so in the other order the two delays would overlap)."""
        for name in self.proxies:
            for toxic in self.api("GET", f"/proxies/{name}/toxics") or []:
                self.api("DELETE", f"/proxies/{name}/toxics/{toxic['name']}")
            for stream in ("upstream", "downstream"):
                if rtt_ms > 0:
                    self.api("POST", f"/proxies/{name}/toxics", {
                        "name": f"latency_{stream}", "type": "latency", "stream": stream, "toxicity": 1.0,
                        "attributes": {"latency": round(rtt_ms / 2), "jitter": 0},
                    })  # fmt: skip
                if rate_mbit > 0:  # Toxiproxy's rate is in KB/s of 1000 bytes: 1 Mbit/s = 125
                    self.api("POST", f"/proxies/{name}/toxics", {
                        "name": f"bandwidth_{stream}", "type": "bandwidth", "stream": stream, "toxicity": 1.0,
                        "attributes": {"rate": round(rate_mbit * 125)},
                    })  # fmt: skip


class _ProbeHandler(socketserver.BaseRequestHandler):
    """Requests of 9 bytes (op, u64 n): E echoes n bytes, U reads n bytes and answers one, D sends n."""

    def handle(self) -> None:
        sock = self.request
        while True:
            head = _recv_exact(sock, 9)
            if head is None:
                return
            op, n = head[:1], int.from_bytes(head[1:], "big")
            if op == b"E":
                sock.sendall(_recv_exact(sock, n) or b"")
            elif op == b"U":
                while n:
                    got = sock.recv(min(n, 1 << 20))
                    if not got:
                        return
                    n -= len(got)
                sock.sendall(b"K")
            elif op == b"D":
                block = b"\0" * (1 << 16)
                while n:
                    sock.sendall(block[: min(n, len(block))])
                    n -= min(n, len(block))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        got = sock.recv(min(left, 1 << 20))
        if not got:
            return None
        parts.append(got)
        left -= len(got)
    return b"".join(parts)


class _ProbeServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def probe_server(stack: contextlib.ExitStack) -> int:
    server = _ProbeServer(("127.0.0.1", 0), _ProbeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.callback(server.server_close)
    stack.callback(server.shutdown)
    return server.server_address[1]


class SharedLink:
    """The link's rate as ONE bottleneck for every connection, each way: relays (asyncio, in a thread of
    the harness) in front of the Toxiproxy proxies, every chunk taking the next free slot of a serial wire
    of the given rate. Toxiproxy's bandwidth toxic limits each connection on its own, so the 4 parallel
    streams of `paramedic search --site` would get 4x the rate of sshfs's single one (measured: 4 probe
    streams moved 39.6 Mbit/s through a 10 Mbit/s toxic); with --shaper shared (the default) Toxiproxy
    adds only the latency."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="shared-link", daemon=True)
        self.thread.start()
        self.rate = 0.0  # bytes per second; 0: no limit
        self.free_at = {"up": 0.0, "down": 0.0}  # loop time when the wire is free again, per direction
        self.servers: list[asyncio.Server] = []
        self.tasks: set[asyncio.Task] = set()
        stack.callback(self.close)

    def set_rate(self, rate_mbit: float) -> None:
        async def apply() -> None:
            self.rate = rate_mbit * 1e6 / 8
            self.free_at = {"up": 0.0, "down": 0.0}

        asyncio.run_coroutine_threadsafe(apply(), self.loop).result(10)

    def relay(self, target_port: int) -> int:
        """A relay on a free local port to 127.0.0.1:target_port; returns its port."""
        return asyncio.run_coroutine_threadsafe(self._listen(target_port), self.loop).result(10)

    async def _listen(self, target_port: int) -> int:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.tasks.add(task)
            try:
                await self._connection(reader, writer, target_port)
            finally:
                self.tasks.discard(task)

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def _connection(
        self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, port: int
    ) -> None:
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            cwriter.close()
            return
        for w in (cwriter, swriter):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pump(creader, swriter, "up"), self._pump(sreader, cwriter, "down"))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        try:
            while True:
                # ~10 ms of the rate per chunk: fine-grained sharing between connections, few wake-ups.
                size = int(min(max(self.rate * 0.01, 1460), 65536)) if self.rate else 65536
                data = await reader.read(size)
                if not data:
                    break
                if self.rate:
                    # A token bucket 20 ms deep: the relay's own overhead between chunks is not lost to the
                    # rate; waits under 1 ms are skipped (epoll's resolution) and paid by the next chunk.
                    now = self.loop.time()
                    self.free_at[direction] = max(now - 0.02, self.free_at[direction]) + len(data) / self.rate
                    if self.free_at[direction] - now > 0.001:
                        await asyncio.sleep(self.free_at[direction] - now)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()  # no half-close (Toxiproxy carries none either): the other pump sees EOF

    def close(self) -> None:
        async def shut() -> None:
            for server in self.servers:
                server.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class EmulatedLink:
    """Toxiproxy for the latency (and, with shaper "toxiproxy", the rate per connection), SharedLink for
    the rate of the whole link (shaper "shared"). expose() gives the port clients use for a service."""

    def __init__(self, stack: contextlib.ExitStack, work: Path, shaper: str) -> None:
        self.toxiproxy = Toxiproxy(stack, work)
        self.shared = SharedLink(stack) if shaper == "shared" else None

    def expose(self, name: str, port: int) -> int:
        proxy_port = self.toxiproxy.proxy(name, port)
        return self.shared.relay(proxy_port) if self.shared else proxy_port

    def set(self, rtt_ms: float, rate_mbit: float) -> None:
        self.toxiproxy.set_link(rtt_ms, 0 if self.shared else rate_mbit)
        if self.shared:
            self.shared.set_rate(rate_mbit)


def _upload(port: int, nbytes: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(b"U" + nbytes.to_bytes(8, "big"))
        block, left = b"\0" * (1 << 16), nbytes
        while left:
            sock.sendall(block[: min(left, len(block))])
            left -= min(left, len(block))
        _recv_exact(sock, 1)


def check_link(
    port: int, rtt_ms: float, rate_mbit: float, pings: int = 7, streams: int = 4
) -> dict[str, Any]:
    """Measure the link through a proxy: RTT (median of one-byte echoes, the first discarded: it also
    opens the proxy's upstream connection), throughput each way over ~2 s worth of bytes, and the
    aggregate of `streams` parallel uploads of the same bytes in all (a shared bottleneck gives the rate)."""
    rate_bps = rate_mbit * 1e6 / 8 if rate_mbit > 0 else 0
    nbytes = int(min(max(rate_bps * 2, 256 * 1024), 32 * 2**20)) if rate_bps else 32 * 2**20
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(pings + 1):
            t0 = time.perf_counter()
            sock.sendall(b"E" + (1).to_bytes(8, "big") + b"x")
            _recv_exact(sock, 1)
            rtts.append(time.perf_counter() - t0)
        rtt = statistics.median(rtts[1:])
        t0 = time.perf_counter()
        sock.sendall(b"D" + nbytes.to_bytes(8, "big"))
        _recv_exact(sock, nbytes)
        down_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _upload(port, nbytes)
    up_s = time.perf_counter() - t0
    threads = [threading.Thread(target=_upload, args=(port, nbytes // streams)) for _ in range(streams)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parallel_s = time.perf_counter() - t0
    # Each transfer takes one RTT (request one way, last byte or answer the other) plus bytes / rate.
    up = nbytes * 8 / max(up_s - rtt, 1e-6) / 1e6
    down = nbytes * 8 / max(down_s - rtt, 1e-6) / 1e6
    parallel = nbytes // streams * streams * 8 / max(parallel_s - rtt, 1e-6) / 1e6
    rtt_ok = abs(rtt * 1e3 - rtt_ms) <= max(5.0, 0.1 * rtt_ms)
    rate_ok = rate_mbit <= 0 or all(abs(r - rate_mbit) <= 0.1 * rate_mbit for r in (up, down, parallel))
    return {
        "rtt_ms": rtt_ms, "rate_mbit": rate_mbit,
        "measured_rtt_ms": round(rtt * 1e3, 2), "rtt_samples_ms": [round(r * 1e3, 2) for r in rtts[1:]],
        "probe_bytes": nbytes, "upload_s": round(up_s, 3), "download_s": round(down_s, 3),
        "measured_up_mbit": round(up, 3), "measured_down_mbit": round(down, 3),
        "parallel_streams": streams, "parallel_up_s": round(parallel_s, 3),
        "measured_parallel_up_mbit": round(parallel, 3), "ok": rtt_ok and rate_ok,
    }  # fmt: skip


# ----------------------------------------------------------------------------- sshd and sshfs


def start_sshd(stack: contextlib.ExitStack, work: Path) -> tuple[int, Path]:
    """A private sshd on a free port (own host key, one authorized key); returns (port, client key)."""
    ssh = work / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    for key in ("host_ed25519", "id_ed25519"):
        if not (ssh / key).exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench-wan", "-f", str(ssh / key)],
                check=True,
            )
    shutil.copyfile(ssh / "id_ed25519.pub", ssh / "authorized_keys")
    port = free_port()
    (ssh / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {ssh / 'host_ed25519'}\nPidFile {ssh / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    log = work / "logs" / "sshd.log"
    proc = start(stack, [SSHD, "-D", "-e", "-f", str(ssh / "sshd_config")], log)
    wait_for_port(port, proc, "sshd", log)
    return port, ssh / "id_ed25519"


@contextlib.contextmanager
def sshfs_mount(port: int, key: Path, remote: Path, mount: Path, log: Path) -> Iterator[Path]:
    """Mount remote (a local directory reached through sshd on port) at mount; always unmounted after."""
    mount.mkdir(parents=True, exist_ok=True)
    options = f"IdentityFile={key},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["sshfs", "-f", "-p", str(port), "-o", options, f"root@127.0.0.1:{remote}", str(mount)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mount):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshfs mount failed: {last_line(log.read_text()) or 'timeout'}")
            time.sleep(0.1)
        yield mount
    finally:
        unmount(mount)
        stop(proc)


def unmount(mount: Path) -> None:
    if os.path.ismount(mount):
        done = subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)
        if done.returncode != 0:
            subprocess.run(["fusermount", "-u", "-z", str(mount)], capture_output=True)


# ----------------------------------------------------------------------------- the storage site


class StorageSite:
    """`paramedic keys` + `paramedic serve` on a free port; a server that died between runs is restarted on
    the same port (the Toxiproxy proxy keeps pointing at it). `error` says why there is no site at all."""

    def __init__(self, stack: contextlib.ExitStack, work: Path) -> None:
        self.stack, self.work, self.log = stack, work, work / "logs" / "serve.log"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self.events: list[str] = []
        keys = subprocess.run(
            [PARAMEDIC, "keys", "--out", str(work / "keys"), "--server", "localhost", "--client", "compute"],
            capture_output=True, text=True,
        )  # fmt: skip
        if keys.returncode != 0:
            self.error = f"paramedic keys failed: {error_line(keys.stderr, keys.stdout, keys.returncode)}"
            return
        self.port = free_port()
        self._start()

    def _start(self) -> None:
        self.proc = start(
            self.stack,
            [PARAMEDIC, "serve", "--replica", str(self.work / "storage/replica/uniprot"), "--root",
             str(self.work / "storage/root"), "--listen", f"127.0.0.1:{self.port}", "--keys",
             str(self.work / "keys/server"), "--io-workers", "1"],
            self.log,
        )  # fmt: skip
        try:
            wait_for_port(self.port, self.proc, "paramedic serve", self.log)
            self.error = None
        except RuntimeError as exc:
            self.error, self.proc = str(exc), None

    def dead(self) -> str | None:
        """Why the server is not running, or None while it runs."""
        if self.proc is None:
            return self.error or "paramedic serve is not running"
        if self.proc.poll() is None:
            return None
        return f"paramedic serve exited with {self.proc.returncode}: {last_line(self.log.read_text())}"

    def ensure(self) -> str | None:
        """Before a run: restart a server that died since the last one; the error when none can run."""
        why = self.dead()
        if why is None or self.port is None:
            return why
        self.events.append(f"{time.strftime('%H:%M:%S')} restarted: {why}")
        print(f"  storage site: {why}; restarting", flush=True)
        self._start()
        return self.dead()


# ----------------------------------------------------------------------------- one point


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_one(
    config: str,
    cmd: list[str],
    cwd: Path,
    output: Path,
    timeout: float,
    mount_view: Path | None = None,
    watch: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Run cmd, timed; the output is stat-ed and hashed where the storage site keeps it. watch() is asked
    every second: an answer (the storage site died) stops the run instead of waiting for its timeouts."""
    result: dict[str, Any] = {"config": config, "label": CONFIGS[config], "cmd": cmd, "ok": False}
    output.unlink(missing_ok=True)
    start_time = time.perf_counter()
    # Its own session: on a timeout or an interrupt the whole group goes (mpiexec and its ranks too).
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=1)
                break
            except subprocess.TimeoutExpired:
                why = watch() if watch else None
                if time.perf_counter() - start_time > timeout:
                    why = f"timeout after {timeout:g} s"
                if why:
                    stop(proc)
                    result.update(wall_s=round(time.perf_counter() - start_time, 3), error=f"stopped: {why}")
                    return result
    finally:
        stop(proc)
    result["wall_s"] = round(time.perf_counter() - start_time, 3)
    result["returncode"] = proc.returncode
    if proc.returncode != 0:
        result["error"] = error_line(stderr, stdout, proc.returncode)
        return result
    if mount_view is not None:  # sshfs: did blastp's exit wait for every byte to reach the storage side?
        exited = time.perf_counter()
        at_exit = output.stat().st_size if output.exists() else 0
        seen = mount_view.stat().st_size
        while (not output.exists() or output.stat().st_size < seen) and time.perf_counter() - exited < 60:
            time.sleep(0.02)
        result["bytes_pending_at_exit"] = seen - at_exit
        if seen > at_exit:
            result["settle_s"] = round(time.perf_counter() - exited, 3)
    if not output.exists():
        result["error"] = f"no output at {output}"
        return result
    result.update(ok=True, output_bytes=output.stat().st_size, sha256=file_sha256(output))
    out_arg = cmd[cmd.index("-out") + 1]
    # the record: beside a local -out; with --site, at -out's relative path under the working directory
    path = cwd / f"{out_arg}.run.json" if "--site" in cmd else Path(f"{output}.run.json")
    if path.is_file():
        record = RunRecord.load(path)
        result["run_record"] = str(path)
        result["record_wall_s"] = record.wall_seconds
        result["phase_totals"] = record.phase_totals()  # seconds summed over ranks
        result["workers"] = record.workers
        if record.ship is not None:
            result["ship"] = record.ship
            result["payload_bytes"] = record.ship["shipped_payload_bytes"]
            result["wire_bytes"] = record.ship["wire_bytes"]
    return result


def run_point(
    number: int,
    setting: dict[str, Any],
    configs: str,
    work: Path,
    site: dict[str, Any],
    timeout: float,
    keep: bool,
) -> dict[str, Any]:
    queries, mts = setting["queries"], setting["max_target_seqs"]
    # A new name per point: sshfs caches names, so a file deleted behind its back must not come back.
    tag = f"p{number:02d}-q{queries}-rtt{setting['rtt_ms']:g}-r{setting['rate_mbit']:g}-m{mts or 'default'}"
    compute, root = work / "compute", work / "storage" / "root"
    query_file = write_queries(work, queries)
    blast = ["-query", str(query_file), "-db", "db/uniprot", "-outfmt", "0"]
    if mts:
        blast += ["-max_target_seqs", str(mts)]
    runs: dict[str, dict[str, Any]] = {}
    outputs: dict[str, Path] = {}
    for config in (c for c in RUN_ORDER if c in configs):
        name = f"{tag}-{config}.txt"
        mount_view, watch, not_run = None, None, None
        if config == "e":
            outputs[config] = compute / "local" / name
            cmd = [PARAMEDIC, "search", "blastp", *blast, "-out", f"local/{name}", "--strategy", "fragments",
                   "--quiet"]  # fmt: skip
        elif config == "a":
            not_run = None if site["mount"] else site["mount_error"]
            outputs[config] = root / "runs" / name
            mount_view = site["mount"] / "runs" / name if site["mount"] else None
            cmd = ["blastp", *blast, "-num_threads", "2", "-out", str(mount_view)]
        else:
            storage: StorageSite | None = site["storage"]
            not_run = storage.ensure() if storage else "not started"
            watch = storage.dead if storage else None
            outputs[config] = root / "runs" / name
            ship = {"b": "direct", "c": "compressed", "d": "metadata"}[config]
            cmd = [PARAMEDIC, "search", "blastp", *blast, "-out", f"runs/{name}", "--site",
                   f"tls://localhost:{site.get('serve_proxy_port')}", "--keys", str(work / "keys/compute"),
                   "--ship", ship, "--quiet"]  # fmt: skip
        print(f"  ({config}) {CONFIGS[config]} ...", end=" ", flush=True)
        if not_run:
            runs[config] = {
                "config": config,
                "label": CONFIGS[config],
                "cmd": cmd,
                "ok": False,
                "error": not_run,
            }
        else:
            runs[config] = run_one(config, cmd, compute, outputs[config], timeout, mount_view, watch)
        r = runs[config]
        print(f"{r['wall_s']:.1f} s" if r["ok"] else f"FAILED ({r.get('error')})", flush=True)
    reference = runs.get("e", {})
    for config, r in runs.items():
        if not r.get("ok") or not reference.get("ok"):
            continue
        r["same_as_local"] = r["sha256"] == reference["sha256"]
        if not r["same_as_local"]:
            r["same_except_posted_date"] = POSTED.sub(b"", outputs[config].read_bytes()) == POSTED.sub(
                b"", outputs["e"].read_bytes()
            )
    if not keep:
        if "a" in outputs and site["mount"]:  # through the mount, so that sshfs's caches stay right
            with contextlib.suppress(OSError):
                (site["mount"] / "runs" / outputs["a"].name).unlink(missing_ok=True)
        for path in outputs.values():
            path.unlink(missing_ok=True)
    return {**setting, "tag": tag, "runs": runs, "model": model_for(setting, runs)}


def model_for(setting: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Eq. 3 with D = (e)'s output bytes, compute = (e)'s wall time, B = the link rate, and x (bytes on
    the wire), f, g from (d)'s run record when it gives them; measured speedups of (d) over (a) and (b)
    next to it. (e)'s wall time includes regenerating the output locally, which (d) leaves to the storage
    site (that is g): the predicted metadata time counts regeneration twice, by local_regen_s (the
    regenerate phase of (e) over its workers), so the predicted speedup is a lower bound."""
    local = runs.get("e", {})
    if not local.get("ok") or setting["rate_mbit"] <= 0:
        return {}
    D, compute, B = local["output_bytes"], local["wall_s"], setting["rate_mbit"] * 1e6 / 8
    model: dict[str, Any] = {"D": D, "B": B, "compute_s": compute, "baseline_s": round(compute + D / B, 3)}
    if (local.get("phase_totals") or {}).get("regenerate") is not None and local.get("workers"):
        model["local_regen_s"] = round(local["phase_totals"]["regenerate"] / local["workers"], 3)
    meta = runs.get("d", {})
    if meta.get("ok"):
        ship = meta.get("ship") or {}
        x = meta.get("wire_bytes") or meta.get("payload_bytes")
        f, g = ship.get("f_encode_seconds"), ship.get("g_site_decode_seconds")
        model.update(x=x, f=f, g=g)
        if None not in (x, f, g):
            model.update({k: round(v, 3) for k, v in predicted_speedup(D, x, B, f, g, compute).items()})
        for base in ("a", "b"):
            if runs.get(base, {}).get("ok"):
                model[f"measured_speedup_d_over_{base}"] = round(runs[base]["wall_s"] / meta["wall_s"], 3)
    return model


def write_queries(work: Path, n: int) -> Path:
    path = work / "compute" / f"queries-{n}.fasta"
    if not path.exists():
        records = (DATA / "mmseqs2" / "QUERY.fasta").read_text().split("\n>")
        if n > len(records):
            raise SystemExit(f"--queries {n}: QUERY.fasta has only {len(records)} queries")
        text = "\n>".join(records[:n]).rstrip("\n") + "\n"
        path.write_text(text if text.startswith(">") else ">" + text)
    return path


# ----------------------------------------------------------------------------- plan, report


def plan(args: argparse.Namespace) -> list[tuple[str, float, dict[str, Any]]]:
    """(sweep, point, setting) for every selected point; equal settings are run once."""
    sweeps = args.sweep or list(SWEEPS)
    if args.points and len(sweeps) != 1:
        raise SystemExit("--points needs exactly one --sweep")
    out = []
    for sweep in sweeps:
        points = args.points or (QUICK_POINTS if args.quick else SWEEPS)[sweep]
        for point in points:
            setting = {"rtt_ms": args.rtt_ms, "rate_mbit": args.rate_mbit, "queries": args.queries,
                       "max_target_seqs": None}  # fmt: skip
            key = {
                "rtt": "rtt_ms",
                "rate": "rate_mbit",
                "queries": "queries",
                "max_target_seqs": "max_target_seqs",
            }
            setting[key[sweep]] = int(point) if sweep in ("queries", "max_target_seqs") else float(point)
            out.append((sweep, point, setting))
    return out


def render_table(results: dict[str, Any]) -> str:
    configs = results["meta"]["configs"]
    lines = [
        f"# bench/wan results ({results['meta']['date']})",
        "",
        f"Command: `{results['meta']['command']}` ({results['meta']['cores']} cores; "
        f"BLAST+ {results['meta']['blast_version']}; Toxiproxy {results['meta']['toxiproxy']})",
        "",
        "Link checks (a TCP probe through the emulated link: Toxiproxy latency RTT/2 each way; the rate "
        + (
            "one bottleneck shared by all connections, each way):"
            if results["meta"].get("shaper", "shared") == "shared"
            else "per connection, Toxiproxy's bandwidth toxic each way):"
        ),
        "",
        "| RTT set ms | rate set Mbit/s | RTT measured ms (median) | up Mbit/s | down Mbit/s "
        "| 4 streams up, total Mbit/s | probe bytes | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in results["link_checks"]:
        lines.append(
            f"| {c['rtt_ms']:g} | {c['rate_mbit']:g} | {c['measured_rtt_ms']:.1f} | {c['measured_up_mbit']:.2f} "
            f"| {c['measured_down_mbit']:.2f} | {fmt(c.get('measured_parallel_up_mbit'), '{:.2f}')} "
            f"| {c['probe_bytes']:,} | {'yes' if c['ok'] else 'NO'} |"
        )
    errors: dict[str, str] = {}  # error text -> footnote mark
    for sweep in SWEEPS:
        points = [p for p in results["points"] if p["sweep"] == sweep]
        if not points:
            continue
        lines += [
            "",
            f"## sweep {sweep} ({SWEEP_UNITS[sweep]} varies)",
            "",
            "| RTT ms | Mbit/s | queries | -max_target_seqs | "
            + " | ".join(f"({c}) {CONFIGS[c]}" for c in configs)
            + " | output MB | shipped bytes (b / c / d) | model baseline s | model metadata s | model speedup | "
            "measured (a)/(d) |",
            "|---" * (4 + len(configs) + 6) + "|",
        ]
        for p in points:
            cells = []
            for c in configs:
                r = p["runs"].get(c, {})
                if r.get("ok"):
                    same = r.get("same_as_local")
                    mark = (
                        ""
                        if same is None
                        else "="
                        if same
                        else "~"
                        if r.get("same_except_posted_date")
                        else "!"
                    )
                    cells.append(f"{r['wall_s']:.1f}{mark}")
                else:
                    error = r.get("error", "not run")
                    errors.setdefault(error, f"[{len(errors) + 1}]")
                    cells.append(f"failed {errors[error]}")
            local, model = p["runs"].get("e", {}), p.get("model", {})
            output_mb = local["output_bytes"] / 1e6 if local.get("ok") else None
            cells += [
                fmt(output_mb, "{:.2f}"),
                " / ".join(fmt(p["runs"].get(c, {}).get("payload_bytes"), "{:,.0f}") or "-" for c in "bcd"),
                fmt(model.get("baseline_s")),
                fmt(model.get("metadata_s")),
                fmt(model.get("speedup"), "{:.2f}"),
                fmt(model.get("measured_speedup_d_over_a"), "{:.2f}"),
            ]
            lines.append(
                f"| {p['rtt_ms']:g} | {p['rate_mbit']:g} | {p['queries']} | {p['max_target_seqs'] or 'default'} | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        "Wall seconds. `=`: output identical to (e)'s by sha256; `~`: identical apart from the Posted date "
        "line; `!`: different.",
    ]
    if errors:
        lines += ["", "Failed runs:", ""]
        lines += [f"- {note} {error}" for error, note in errors.items()]
    lines += [
        "",
        "Model: Eq. 3 of the ParaMEDIC paper, sequential (`predicted_speedup` in bench/wan.py): baseline = "
        "compute + D/B, metadata = compute + f + x/B + g, with compute = (e)'s wall time, D = (e)'s output "
        "bytes, B = the link rate, x, f, g from (d)'s run record.",
        "",
    ]
    return "\n".join(lines)


def fmt(value: float | None, spec: str = "{:.1f}") -> str:
    return "" if value is None else spec.format(value)


def plot_results(results: dict[str, Any], png: Path) -> str:
    """One panel per sweep: wall seconds of every configuration against the swept value."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "plot skipped: matplotlib is not installed (`.venv/bin/pip install matplotlib`, then "
            f"`.venv/bin/python bench/wan.py --render-only --out {results['meta']['out']}`)"
        )
    sweeps = [s for s in SWEEPS if any(p["sweep"] == s for p in results["points"])]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.5 * len(sweeps), 4), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps, strict=True):
        points = [p for p in results["points"] if p["sweep"] == sweep]
        for config in results["meta"]["configs"]:
            xs = [p["point"] for p in points if p["runs"].get(config, {}).get("ok")]
            ys = [p["runs"][config]["wall_s"] for p in points if p["runs"].get(config, {}).get("ok")]
            if xs:
                ax.plot(xs, ys, marker="o", label=f"({config}) {CONFIGS[config]}")
        if sweep == "rate":
            ax.set_xscale("log")
        ax.set_xlabel(SWEEP_UNITS[sweep])
        ax.set_ylabel("wall s")
        ax.set_title(f"sweep {sweep}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return f"plot: {png}"


def render(results: dict[str, Any], out: Path) -> None:
    table = out.parent / "RESULTS-table.md"
    table.write_text(render_table(results))
    print(f"table: {table}")
    print(plot_results(results, out.with_suffix(".png")))


# ----------------------------------------------------------------------------- main


def prepare(work: Path, fragments: int) -> None:
    """A fresh work directory: the formatted database at the compute site and a byte copy at storage."""
    unmount(work / "mnt")  # a mount left by a killed run: never delete through it
    if os.path.ismount(work / "mnt"):
        raise SystemExit(f"{work / 'mnt'} is still mounted: fusermount -u -z {work / 'mnt'}")
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("compute/local", "compute/runs", "storage/root/runs", "logs"):
        (work / sub).mkdir(parents=True)
    subprocess.run(
        [PARAMEDIC, "format", "--in", str(DATA / "mmseqs2" / "DB.fasta"), "--dbtype", "prot", "--fragments",
         str(fragments), "--out", "db/uniprot", "--title", "mmseqs2-examples DB", "--quiet"],
        cwd=work / "compute", check=True,
    )  # fmt: skip
    shutil.copytree(work / "compute" / "db", work / "storage" / "replica")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_QUERIES} queries, one point per sweep")
    parser.add_argument("--sweep", action="append", choices=list(SWEEPS), help="repeatable (default: all)")
    parser.add_argument("--points", type=lambda s: [float(v) for v in s.split(",")], help="e.g. 0,100")
    parser.add_argument("--queries", type=int, help="queries when not swept (default 500; --quick: 20)")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="RTT when not swept (default 50)")
    parser.add_argument("--rate-mbit", type=float, default=10.0, help="link rate when not swept (default 10)")
    parser.add_argument("--configs", default="abcde", help="subset of abcde (default: all)")
    parser.add_argument(
        "--shaper",
        choices=["shared", "toxiproxy"],
        default="shared",
        help="shared (default): the rate is one bottleneck for all connections (relay in the harness); "
        "toxiproxy: Toxiproxy's bandwidth toxic, a separate rate per connection",
    )
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    parser.add_argument("--out", type=Path, default=HERE / "wan" / "results.json")
    parser.add_argument("--work", type=Path, default=HERE / "wan" / "work")
    parser.add_argument("--keep-outputs", action="store_true", help="keep every output file in --work")
    parser.add_argument("--render-only", action="store_true", help="table and plot from --out, no runs")
    args = parser.parse_args()
    if args.render_only:
        render(json.loads(args.out.read_text()), args.out)
        return
    args.queries = args.queries or (QUICK_QUERIES if args.quick else 500)
    wanted = args.configs.replace(",", "")
    configs = "".join(c for c in "abcde" if c in wanted)
    if not configs or set(wanted) - set(CONFIGS):
        raise SystemExit(f"--configs: letters of {''.join(CONFIGS)}")
    todo = plan(args)
    for name in ("sshfs", "fusermount", "blastp", "ssh-keygen"):
        if shutil.which(name) is None:
            raise SystemExit(f"{name} is missing: run `bash bench/wan/setup.sh`")

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    work, out = args.work.resolve(), args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    blast_version = subprocess.run(["blastp", "-version"], capture_output=True, text=True).stdout.split()[1]
    results: dict[str, Any] = {
        "meta": {
            "command": "bench/wan.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
            "cores": os.cpu_count(), "blast_version": blast_version, "configs": configs,
            "config_labels": {c: CONFIGS[c] for c in configs}, "fragments": FRAGMENTS, "out": str(args.out),
            "shaper": args.shaper,
        },
        "link_checks": [], "points": [],
    }  # fmt: skip
    done: dict[str, dict[str, Any]] = {}
    try:
        with contextlib.ExitStack() as stack:
            print(f"work: {work}", flush=True)
            prepare(work, FRAGMENTS)
            emulated = EmulatedLink(stack, work, args.shaper)
            results["meta"]["toxiproxy"] = emulated.toxiproxy.version
            probe_port = emulated.expose("probe", probe_server(stack))
            sshd_port, key = start_sshd(stack, work)
            ssh_proxy_port = emulated.expose("ssh", sshd_port)
            site: dict[str, Any] = {"mount": None, "mount_error": "not mounted", "storage": None}
            if set(configs) & set("bcd"):
                site["storage"] = storage = StorageSite(stack, work)
                results["meta"]["serve_events"] = storage.events
                if storage.port is not None:
                    site["serve_proxy_port"] = emulated.expose("serve", storage.port)
            link = None
            mount_stack = contextlib.ExitStack()
            stack.enter_context(mount_stack)
            for sweep, point, setting in todo:
                key_str = json.dumps(setting, sort_keys=True)
                if key_str not in done:
                    if link != (setting["rtt_ms"], setting["rate_mbit"]):
                        mount_stack.close()  # a fresh ssh connection per link setting
                        link = (setting["rtt_ms"], setting["rate_mbit"])
                        emulated.set(*link)
                        check = check_link(probe_port, *link)
                        results["link_checks"].append(check)
                        print(
                            f"link RTT {link[0]:g} ms, {link[1]:g} Mbit/s: measured RTT {check['measured_rtt_ms']}"
                            f" ms, up {check['measured_up_mbit']} / down {check['measured_down_mbit']} / 4 streams"
                            f" up {check['measured_parallel_up_mbit']} Mbit/s"
                            f"{'' if check['ok'] else '  (OFF by more than 10%)'}",
                            flush=True,
                        )
                        if "a" in configs:
                            try:
                                site["mount"] = mount_stack.enter_context(
                                    sshfs_mount(ssh_proxy_port, key, work / "storage/root", work / "mnt",
                                                work / "logs" / "sshfs.log")
                                )  # fmt: skip
                            except RuntimeError as exc:
                                site["mount"], site["mount_error"] = None, str(exc)
                    print(f"point {sweep}={point:g}: {setting}", flush=True)
                    done[key_str] = run_point(
                        len(done) + 1, setting, configs, work, site, args.timeout, args.keep_outputs
                    )
                results["points"].append({"sweep": sweep, "point": point, **done[key_str]})
                out.write_text(json.dumps(results, indent=1) + "\n")
    except (KeyboardInterrupt, Interrupted) as exc:
        print(
            f"\ninterrupted ({str(exc) or 'SIGINT'}): every process stopped, mount released", file=sys.stderr
        )
        if results["points"]:
            render(results, out)
        sys.exit(130)
    print(f"results: {out}")
    render(results, out)


if __name__ == "__main__":
    main()
