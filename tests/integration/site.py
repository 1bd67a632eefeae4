"""Helpers for the two-site tests: a real `paramedic serve` process, and a TCP proxy that cuts a connection.

`StorageSite` runs the storage-site daemon as a user would (subprocess, real TLS), logs its stderr to a file,
and can be killed with SIGKILL and restarted on the same port. `CuttingProxy` forwards TCP bytes between a
compute site and the server and, once, closes both sides of a connection mid-transfer.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from tests.conftest import BIN

LISTENING = re.compile(r"listening on [^ ]*:(\d+) ")


class StorageSite:
    """`paramedic serve` in a subprocess; always `stop()` it (the fixtures do, in their teardown)."""

    def __init__(self, replica: Path, root: Path, keys: Path, log: Path, io_workers: int = 2):
        self.replica = replica
        self.root = root
        self.keys = keys
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
            str(BIN / "paramedic"), "serve", "--replica", str(self.replica), "--root", str(self.root),
            "--listen", f"127.0.0.1:{self.port}", "--keys", str(self.keys), "--io-workers", str(self.io_workers),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = LISTENING.search(self.log()[offset:])
            if match:
                self.port = int(match.group(1))
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
    server (over all connections), close both sides of the connection that carried the last of them."""

    def __init__(self, target: int, cut_after: int):
        self.target = target
        self.cut_after = cut_after
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
                data = src.recv(16384)
                if not data:
                    break
                dst.sendall(data)
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
