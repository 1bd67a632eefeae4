"""The storage site for every test that needs one: a real `paramedic serve` process, a TCP proxy that cuts
a connection, and a `SiteServer` in the test process.

`StorageSite` runs the storage-site daemon as a user would (subprocess, real TLS and/or a shared-directory
inbox), logs its stderr to a file, and can be killed with SIGKILL and restarted on the same port; it is
the one `paramedic serve` harness (a test that needs another flag passes it in `extra`). `CuttingProxy`
forwards TCP bytes between a compute site and the server and, once, closes both sides of a connection
mid-transfer. `start_site` runs a `SiteServer` in this process (real sockets, real TLS 1.3, real files)
with limits small enough that a fault probe takes seconds.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from paramedic.ship.client import SiteAddress, TlsShipper
from paramedic.site import server as server_module
from paramedic.site.server import ServeSettings, SiteServer
from tests.conftest import BIN

LISTENING = re.compile(r"listening on [^ ]*:(\d+) ")
INBOX_READY = re.compile(r"watching inbox ")


class StorageSite:
    """`paramedic serve` in a subprocess; always `stop()` it (the fixtures do, in their teardown)."""

    def __init__(
        self,
        replica: Path | None,  # None: a site without a replica (traces and plain output only)
        root: Path,
        keys: Path | None,  # None: no TLS listener (an inbox site taking unsigned jobs)
        log: Path,
        io_workers: int = 2,
        extra: tuple[str, ...] = (),
        inbox: Path | None = None,  # a shared-directory inbox the site watches (`serve --inbox`)
    ):
        self.extra = extra  # more `paramedic serve` flags
        self.replica = replica
        self.root = root
        self.keys = keys
        self.inbox = inbox
        self.log_path = log
        self.io_workers = io_workers
        self.port = 0  # 0 until the first start: then the port it bound, kept for restarts
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def state(self) -> Path:
        return self.root / ".paramedic-state"

    @property
    def url(self) -> str:
        return f"tls://localhost:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        argv = [
            str(BIN / "paramedic"), "serve", *(["--replica", str(self.replica)] if self.replica else []), "--root", str(self.root),
            *(["--listen", f"127.0.0.1:{self.port}", "--keys", str(self.keys)] if self.keys else []),
            *(["--inbox", str(self.inbox)] if self.inbox else []), "--io-workers", str(self.io_workers), *self.extra,
        ]  # fmt: skip
        ready = LISTENING if self.keys else INBOX_READY  # an inbox site says so before it listens, if it does
        # the daemon's BLAST+ temporary files stay beside its log: a test that kills it leaves nothing in /tmp
        tmp = self.log_path.with_name(self.log_path.name + ".tmp")
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmp)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, env=env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = ready.search(self.log()[offset:])
            if match:
                self.port = int(match.group(1)) if self.keys else 0
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"paramedic serve exited {self.proc.returncode}:\n{self.log()[offset:]}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"paramedic serve did not listen within {timeout} s:\n{self.log()[offset:]}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill9()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, pattern: str, timeout: float = 10.0, start: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the log after character `start`, waiting for it to appear."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.log()[start:])
            if match:
                return match
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not in the server log:\n{self.log()[start:]}")
            time.sleep(0.05)


class CuttingProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<target>; once `cut_after` bytes went from clients to the
    server (over all connections), close both sides of the connection that carried the last of them.
    With `down_rate`, each connection's server-to-client bytes are held to that many bytes a second (a
    slow link to a replica)."""

    def __init__(self, target: int, cut_after: int = 2**62, down_rate: float | None = None):
        self.target = target
        self.cut_after = cut_after
        self.down_rate = down_rate
        self.forwarded = 0  # client-to-server bytes, all connections
        self.cuts = 0
        self.connections = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True, name="proxy")

    def __enter__(self) -> CuttingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                _close(sock)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            client.settimeout(None)
            with self.lock:
                self.connections += 1
                self.sockets += [client, server]
            pair = (client, server)
            threading.Thread(target=self._pump, args=(client, server, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, False), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, ...], up: bool
    ) -> None:
        try:
            while True:
                data = src.recv(4096 if self.down_rate else 16384)
                if not data:
                    break
                dst.sendall(data)
                if not up and self.down_rate:
                    time.sleep(len(data) / self.down_rate)
                if up:
                    with self.lock:
                        self.forwarded += len(data)
                        cut = self.cuts == 0 and self.forwarded >= self.cut_after
                        if cut:
                            self.cuts += 1
                    if cut:
                        break
        except OSError:
            pass
        for sock in pair:  # one side ended (or the cut): end the other too, as a broken link would
            _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# -- an in-process storage site for fault probes -----------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Site:
    """A running in-process storage site; `lines` is its log."""

    server: SiteServer
    thread: threading.Thread
    keys: Path
    root: Path
    lines: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        assert self.server.listener is not None
        return self.server.listener.getsockname()[1]

    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_log(self, pattern: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not in the log:\n{self.log()}")
            time.sleep(0.02)

    def shipper(self, codec: str, setup: dict, payload: bytes = b"", client: str = "compute-a", **kw: Any):
        kw.setdefault("timeout", 10.0)
        kw.setdefault("streams", 1)
        return TlsShipper(
            SiteAddress("tls", "localhost", self.port), self.keys / client, codec, setup, payload, **kw
        )

    def client_context(self, client: str = "compute-a") -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(self.keys / client / "ca.pem"))
        ctx.load_cert_chain(self.keys / client / "cert.pem", self.keys / client / "key.pem")
        return ctx

    def tls(self, client: str = "compute-a", timeout: float = 10.0) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.client_context(client).wrap_socket(raw, server_hostname="localhost")

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=5)


def start_site(settings: ServeSettings, keys: Path, monkeypatch) -> Site:
    lines: list[str] = []
    monkeypatch.setattr(server_module, "log", lines.append)
    settings = replace(settings, listen="127.0.0.1:0", keys=keys / "server")
    server = SiteServer(settings)
    server.bind()
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="site")
    thread.start()
    return Site(server, thread, keys, settings.root, lines)


def ship_bytes(site: Site, out: str, data: bytes, client: str = "compute-a") -> dict:
    """A whole direct job: `data` lands at `out` under the site's root; the site's reply."""
    from paramedic.ship.codecs import DirectCodec

    shipper = site.shipper("direct", {"out": out}, client=client)
    try:
        shipper.start()
        shipper.send(*DirectCodec().encode((0, data)))
        return shipper.finish({"size": len(data), "sha256": sha256(data)})
    finally:
        shipper.close()


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed `sock` (reading and discarding), or None if still open after `seconds`."""
    start = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except (ConnectionResetError, ssl.SSLError, OSError):
            return time.monotonic() - start
    return None
