"""`paramedic serve`: the storage-site daemon.

It accepts TLS 1.3 connections from compute sites that hold a client certificate from the site's CA
(anything else fails in the handshake, before a request is read), receives chunks of output or of
metadata, checks each chunk's SHA-256, stores it durably, acknowledges it, and decodes it on its I/O
workers: for metadata, BLAST+ regenerates the report from the site's replica of the database. When a
job is finished the output is made durable under --root and its digest is sent back.

One thread per connection (at most MAX_CONNECTIONS); requests on a connection are answered in order,
so a client can keep several chunks in flight. With --inbox the same jobs also arrive as files through a
shared directory (`site.inbox`).
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paramedic.engine.job import resolve_database
from paramedic.errors import UsageError
from paramedic.ship.wire import (
    MAX_PAYLOAD_BYTES,
    ConnectionClosed,
    ProtocolError,
    field_int,
    field_str,
    recv_frame,
    send_frame,
)
from paramedic.site.store import DEFAULT_EXPIRE_SECONDS, STATE_DIR_NAME, JobFailed, JobStore, Replica
from paramedic.site.tls import peer_name, server_context

PROTOCOL_VERSION = 1
MAX_CONNECTIONS = 64
HANDSHAKE_SECONDS = 10.0
IDLE_SECONDS = 600.0


@dataclass(frozen=True)
class ServeSettings:
    replica: Path
    root: Path
    listen: str  # host:port
    keys: Path | None  # None: only the --inbox transport, no TLS listener
    io_workers: int = 2
    inbox: Path | None = None
    state: Path | None = None  # default: <root>/.paramedic-state
    expire_hours: float = DEFAULT_EXPIRE_SECONDS / 3600


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def log(message: str) -> None:
    print(f"paramedic serve: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class SiteServer:
    def __init__(self, settings: ServeSettings):
        self.settings = settings
        root = settings.root.resolve()
        if not root.is_dir():
            raise UsageError(f"--root {root}: not a directory")
        database, manifest = resolve_database(str(settings.replica), Path.cwd())
        workdir = (settings.state or root / STATE_DIR_NAME) / "work"
        workdir.mkdir(parents=True, exist_ok=True)
        self.replica = Replica(database, manifest.checksum(), workdir)
        self.context = server_context(settings.keys) if settings.keys is not None else None
        self.store = JobStore(
            root,
            settings.state or root / STATE_DIR_NAME,
            self.replica,
            settings.io_workers,
            log,
            settings.expire_hours * 3600,
        )
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.listener: socket.socket | None = None
        self.stopping = threading.Event()

    def bind(self) -> tuple[str, int]:
        host, port = parse_listen(self.settings.listen)
        try:
            self.listener = socket.create_server((host, port), reuse_port=False, backlog=64)
        except OSError as exc:
            raise UsageError(f"--listen {self.settings.listen}: {exc.strerror}") from exc
        return self.listener.getsockname()[:2]

    def serve_forever(self) -> None:
        assert self.listener is not None
        self.listener.settimeout(0.5)
        while not self.stopping.is_set():
            try:
                sock, address = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            if not self.slots.acquire(blocking=False):
                sock.close()
                log(f"refused {address[0]}: too many connections")
                continue
            threading.Thread(target=self._connection, args=(sock, address), daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        if self.listener is not None:
            self.listener.close()
        self.store.close()

    # -- one connection -------------------------------------------------------------------------------
    def _connection(self, raw: socket.socket, address: tuple[Any, ...]) -> None:
        try:
            raw.settimeout(HANDSHAKE_SECONDS)
            try:
                assert self.context is not None
                tls = self.context.wrap_socket(raw, server_side=True)
                peer = peer_name(tls)
            except (ssl.SSLError, OSError) as exc:
                log(f"refused {address[0]}: {getattr(exc, 'reason', None) or exc}")
                raw.close()
                return
            tls.settimeout(IDLE_SECONDS)
            with tls:
                self._serve_requests(tls, peer)
        finally:
            self.slots.release()

    def _serve_requests(self, tls: ssl.SSLSocket, peer: str) -> None:
        while True:
            try:
                header, payload = recv_frame(tls)
            except ConnectionClosed:
                return
            except (ProtocolError, OSError) as exc:
                log(f"{peer}: connection dropped: {exc}")
                return
            try:
                reply = self._handle(peer, header, payload)
            except JobFailed as exc:
                reply = {"op": "error", "message": str(exc), "fatal": True}
            except ProtocolError as exc:
                reply = {"op": "error", "message": str(exc), "fatal": True}
                log(f"{peer}: refused request {header.get('op')!r}: {exc}")
            except OSError as exc:  # e.g. the disk is full: the job cannot go on here
                reply = {"op": "error", "message": f"storage site I/O error: {exc}", "fatal": True}
                log(f"{peer}: request {header.get('op')!r} failed: {exc}")
            try:
                send_frame(tls, reply)
            except OSError:
                return
            if reply["op"] == "error":
                return

    def _handle(self, peer: str, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        op = header["op"]
        if op == "hello":
            return {
                "op": "hello",
                "version": PROTOCOL_VERSION,
                "manifest_sha256": self.replica.manifest_sha256,
                "max_payload": MAX_PAYLOAD_BYTES,
            }
        if op == "ping":  # link measurement: the payload only tests the bandwidth
            return {"op": "pong", "bytes": len(payload)}
        if op == "open":
            has_setup = header.get("with_setup") is True
            job = self.store.open(peer, header, payload if has_setup else None)
            if job is None:
                return {"op": "need_setup"}
            with job.lock:
                acked = sorted(job.acked)
            return {"op": "opened", "acked": acked}
        job = self.store.get(peer, field_str(header, "job", 32))
        if op == "chunk":
            index = field_int(header, "index", 0)
            if self.store.put_chunk(job, header, payload):
                return {"op": "ack", "index": index}
            log(f"job {job.job_id}: chunk {index} failed its SHA-256 check; asking again")
            return {"op": "nack", "index": index, "reason": "sha256 mismatch"}
        if op == "finish":
            done = self.store.finish(job, header)
            return {"op": "pending"} if done is None else {"op": "done", **done}
        raise ProtocolError(f"unknown request {op!r}")


def serve(settings: ServeSettings) -> int:
    if settings.keys is None and settings.inbox is None:
        raise UsageError("paramedic serve needs --keys (TLS listener) or --inbox (shared directory), or both")
    server = SiteServer(settings)
    inbox = None
    if settings.inbox is not None:
        from paramedic.site.inbox import InboxWatcher

        inbox = InboxWatcher(settings.inbox, server.store, log)
        inbox.start()
        log(f"watching inbox {settings.inbox}, replica {settings.replica}")
    try:
        if settings.keys is not None:
            host, port = server.bind()
            log(f"listening on {host}:{port} (TLS 1.3, client certificates), replica {settings.replica}")
            server.serve_forever()
        else:
            server.stopping.wait()
    except KeyboardInterrupt:
        log("stopping")
    finally:
        if inbox is not None:
            inbox.stop()
        server.stop()
    return 0
