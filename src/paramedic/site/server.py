"""`paramedic serve`: the storage-site daemon.

It accepts TLS 1.3 connections from compute sites that hold a client certificate from the site's CA
(anything else fails in the handshake, before a request is read), receives chunks of output or of
metadata, checks each chunk's SHA-256, stores it durably, acknowledges it, and decodes it on its I/O
workers: for metadata, BLAST+ regenerates the report from the site's replica of the database. When a
job is finished the output is made durable under --root and its digest is sent back.

One thread per authenticated connection; requests on a connection are answered in order, so a client can keep several
chunks in flight. Other transports' receivers take jobs into the same store (`site.receivers`: with --inbox
they also arrive as files through a shared directory, `site.inbox`).
The same connections also serve the replica's fragment volumes read-only to compute sites that mirror
the database from here (`site.replica_reads`; off with --no-replica-reads).

Nobody holds the site with slow or silent connections (`Limits`): a connection that has not completed its
TLS handshake waits on one event loop (`site.handshakes`: a descriptor, no thread) for `handshake_seconds`
in all; when too many wait, in all or from one address, the oldest of the address holding the most is
closed, so a flood pushes out its own and a real client's one-round-trip handshake gets through. Only an
authenticated connection takes one of the `max_connections` slots, and one compute site
at most `max_connections_per_peer` of them. Every frame must arrive by its deadline (`FrameDeadlines`: idle
time between frames, and a whole frame within a time that grows with its declared size), and a connection
is closed between frames after `connection_seconds` (the client reconnects and resends what was not
acknowledged).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramedic.db.locate import resolve_database
from paramedic.db.manifest import verify_volumes
from paramedic.errors import DatabaseError, UsageError
from paramedic.ship.tls import peer_name, server_context
from paramedic.ship.wire import (
    ConnectionClosed,
    FrameDeadlines,
    FrameTimeout,
    ProtocolError,
    recv_frame,
    send_frame,
)
from paramedic.site.handshakes import HandshakeLoop
from paramedic.site.receivers import (
    SiteContext,
    Started,
    check_receivers,
    receivers,
    start_receivers,
    stop_receivers,
)
from paramedic.site.replica import DEFAULT_MAX_SETUP_BYTES, Replica
from paramedic.site.replica_reads import READ_OPS, ReplicaReads
from paramedic.site.requests import JobRequests, Reply, answer_or_refuse
from paramedic.site.space import Quota
from paramedic.site.store import (
    DEFAULT_EXPIRE_SECONDS,
    DEFAULT_OPEN_IDLE_SECONDS,
    DEFAULT_REGEN_SECONDS,
    STATE_DIR_NAME,
    JobStore,
)

REFUSAL_LINES = 50  # refusals logged a minute at most
TLS_OWNER = "tls:"  # a job opened over TLS belongs to "tls:<certificate CN>" (the inbox's jobs do not)


@dataclass(frozen=True)
class Limits:
    """What one client, or many, can hold of the server (defaults for a site serving a few compute sites)."""

    handshake_seconds: float = 10.0  # the whole TLS handshake, however slowly the bytes come
    # connections not yet authenticated, in all, and from one address (an IPv6 /64): held by one event
    # loop, a descriptor each; beyond either bound the oldest of the address holding the most is closed
    max_handshakes: int = 4096
    max_handshakes_per_address: int = 1024
    max_connections: int = 256  # authenticated connections
    max_connections_per_peer: int = 80  # ... of one compute site (--streams is at most 64)
    connection_seconds: float = 3600.0  # then closed between frames (the client reconnects)
    frames: FrameDeadlines = field(default_factory=FrameDeadlines)


@dataclass(frozen=True)
class ServeSettings:
    replica: Path | None  # None: no BLAST metadata; traces and plain output only
    root: Path
    listen: str  # host:port
    keys: Path | None  # None: no TLS listener, only the receivers' transports (e.g. --inbox)
    io_workers: int = 2
    receivers: Mapping[str, Any] = field(default_factory=dict)  # a receiver's name -> its option's value
    state: Path | None = None  # default: <root>/.paramedic-state
    expire_hours: float = DEFAULT_EXPIRE_SECONDS / 3600
    limits: Limits = field(default_factory=Limits)
    quota: Quota = field(default_factory=Quota)
    open_idle_seconds: float = DEFAULT_OPEN_IDLE_SECONDS  # an open job with no request this long expires
    replica_reads: bool = True  # serve the replica's fragment volumes to compute sites (--mirror tls://)
    regen_seconds: float = DEFAULT_REGEN_SECONDS  # one chunk's regeneration at most (--regen-timeout)
    max_setup_bytes: int = DEFAULT_MAX_SETUP_BYTES  # a job's setup (its queries) inflated (--max-setup)
    trace_memory_bytes: int | None = None  # trace regenerations' memory at once (--trace-memory; None: half)

    def __post_init__(self) -> None:
        if self.io_workers < 1:
            raise UsageError("--io-workers must be at least 1")
        if not self.expire_hours > 0:
            raise UsageError("--expire-after must be a positive number of hours")
        if not self.open_idle_seconds > 0:
            raise UsageError("--open-idle must be a positive number of hours")
        if self.max_setup_bytes < 2**20:
            raise UsageError("--max-setup must be at least 1M")
        if not self.regen_seconds > 0:
            raise UsageError("--regen-timeout must be a positive number of hours")
        if self.trace_memory_bytes is not None and self.trace_memory_bytes < 2**20:
            raise UsageError("--trace-memory must be at least 1M")
        parse_listen(self.listen)
        check_receivers(self.receivers)


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
        from paramedic.ship import trace_codec  # the budget of the process's site (one per process)

        trace_codec.MEMORY.limit = settings.trace_memory_bytes or trace_codec.physical_memory() // 2
        trace_codec.MEMORY.wait_seconds = settings.regen_seconds  # a decode's wait for it, bounded too
        root = settings.root.resolve()
        if not root.is_dir():
            raise UsageError(f"--root {root}: not a directory")
        state = settings.state or root / STATE_DIR_NAME
        workdir = state / "work"
        for private in (state, workdir):  # the compute sites' data: the site's alone (mode 0700)
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
        # what a killed server was regenerating: nothing in a run's scratch outlives the run
        for stale in workdir.iterdir():  # (regen-*, and since issue 23 one directory per job)
            shutil.rmtree(stale, ignore_errors=True)
        self.replica: Replica | None = None
        self.reads: ReplicaReads | None = None
        if settings.replica is not None:
            replica = str(settings.replica)  # a path, not a -db list: one name even with a space
            database, manifest = resolve_database(
                f'"{replica}"' if " " in replica else replica, Path.cwd(), digest=False
            )
            try:  # a replica damaged (or being rewritten) now does not keep the site down: every job
                # that regenerates digests it again and is refused while it differs (Replica.verify)
                verify_volumes(database.directory, manifest)
            except DatabaseError as exc:
                log(f"warning: --replica: {exc}; jobs that regenerate are refused until it is whole")
            self.replica = Replica(database, manifest.checksum(), workdir, manifest, settings.max_setup_bytes)
            self.reads = None
            try:
                if settings.replica_reads:
                    self.reads = ReplicaReads(
                        database.directory, manifest, volume_paths=database.span_paths()
                    )
            except DatabaseError as exc:
                if not manifest.in_place:  # (in place, e.g. two volumes of one name: it regenerates still)
                    raise
                log(f"warning: --replica: {exc}; serving no replica reads")
        self.context = server_context(settings.keys) if settings.keys is not None else None
        self.store = JobStore(
            root,
            settings.state or root / STATE_DIR_NAME,
            self.replica,
            settings.io_workers,
            log,
            settings.expire_hours * 3600,
            settings.open_idle_seconds,
            settings.quota,
            settings.regen_seconds,
        )
        manifest_sha256 = self.replica.manifest_sha256 if self.replica is not None else None
        self.requests = JobRequests(self.store, log, manifest_sha256)
        self.limits = settings.limits
        self.count_lock = threading.Lock()
        self.connections: Counter[str] = Counter()  # compute site -> authenticated connections
        self.refusals: Counter[tuple[str, str]] = Counter()  # (address, reason) -> refusals (logged sparsely)
        self.refusal_minute: list[float] = [time.monotonic(), 0, 0]  # start, lines logged, lines not
        self.listener: socket.socket | None = None
        self.stopping = threading.Event()

    def bind(self) -> tuple[str, int]:
        host, port = parse_listen(self.settings.listen)
        try:
            self.listener = socket.create_server((host, port), reuse_port=False, backlog=1024)
        except OSError as exc:
            raise UsageError(f"--listen {self.settings.listen}: {exc.strerror}") from exc
        return self.listener.getsockname()[:2]

    def serve_forever(self) -> None:
        """Accept and authenticate connections on one event loop (`site.handshakes`); each authenticated
        connection is served on its own thread."""
        assert self.listener is not None and self.context is not None
        HandshakeLoop(
            self.listener,
            self.context,
            self.limits.handshake_seconds,
            self.limits.max_handshakes,
            self.limits.max_handshakes_per_address,
            self._authenticated,
            self._refused,
            self.stopping.is_set,
        ).run()

    def _authenticated(self, tls: ssl.SSLSocket, host: str) -> None:
        try:
            threading.Thread(target=self._connection, args=(tls, host), daemon=True).start()
        except RuntimeError:  # no thread to be had: refuse this one, keep serving the others
            tls.close()
            self._refused(host, "no thread for the connection")

    def _refused(self, host: str, why: str) -> None:
        """Log a refusal, but only the 1st, 2nd, 4th, 8th... from one address, and at most
        REFUSAL_LINES a minute from all (then one line says how many went unlogged): a flood, from one
        address or from thousands, must not flood the log."""
        now = time.monotonic()
        with self.count_lock:
            if len(self.refusals) > 10_000:  # many addresses: forget the counts rather than grow
                self.refusals.clear()
            self.refusals[host, why] += 1
            n = self.refusals[host, why]
            if n & (n - 1) != 0:
                return
            if now - self.refusal_minute[0] > 60:
                unlogged = self.refusal_minute[2]
                self.refusal_minute = [now, 0, 0]
                if unlogged:
                    log(f"{unlogged} more refusals in the last minute not logged")
            self.refusal_minute[1] += 1
            if self.refusal_minute[1] > REFUSAL_LINES:
                self.refusal_minute[2] += 1
                return
        log(f"refused {host}: {why} ({n} so from this address)")

    def stop(self) -> None:
        self.stopping.set()
        if self.listener is not None:
            self.listener.close()
        self.store.close()

    # -- one connection -------------------------------------------------------------------------------
    def _connection(self, tls: ssl.SSLSocket, host: str) -> None:
        with tls:
            try:
                peer = peer_name(tls)
            except ssl.SSLError as exc:
                log(f"refused {host}: {exc}")
                return
            with self.count_lock:
                busy = (
                    self.connections.total() >= self.limits.max_connections
                    or self.connections[peer] >= self.limits.max_connections_per_peer
                )
                if not busy:
                    self.connections[peer] += 1
            if busy:
                self._refused(host, f"{peer} holds too many connections (or the site does)")
                try:  # a clear reason for the client, which retries later
                    tls.settimeout(1.0)
                    send_frame(tls, {"op": "busy", "message": "storage site busy: too many connections"})
                except OSError:
                    pass
                return
            try:
                self._serve_requests(tls, peer)
            except Exception as exc:  # a bug must not kill the thread silently or leak the slot
                log(f"{peer}: internal error, connection closed: {type(exc).__name__}: {exc}")
            finally:
                with self.count_lock:
                    self.connections[peer] -= 1
                    if self.connections[peer] <= 0:
                        del self.connections[peer]

    def _serve_requests(self, tls: ssl.SSLSocket, peer: str) -> None:
        closing_time = time.monotonic() + self.limits.connection_seconds
        while time.monotonic() < closing_time:
            try:
                header, payload = recv_frame(tls, self.limits.frames)
            except ConnectionClosed:
                return
            except FrameTimeout as exc:
                log(f"{peer}: connection dropped: too slow: {exc}")
                return
            except (ProtocolError, OSError) as exc:
                log(f"{peer}: connection dropped: {exc}")
                return
            answer = self._answer(peer, header, payload)
            reply, data = answer if isinstance(answer, tuple) else (answer, b"")
            holds_read_slot = reply["op"] == "data" and self.reads is not None  # (ReplicaReads.sent)
            try:
                tls.settimeout(self.limits.frames.frame)  # recv_frame left the frame's remaining time
                frames = self.limits.frames
                end = time.monotonic() + frames.frame + len(data) / frames.min_rate if data else None
                send_frame(tls, reply, data, end)
            except OSError:
                return
            finally:
                if holds_read_slot:
                    assert self.reads is not None
                    self.reads.sent()
            if reply["op"] == "error":
                return

    def _answer(self, peer: str, header: dict[str, Any], payload: bytes) -> Reply:
        """The reply to one request: a replica read (no job, `site.replica_reads`), or one about jobs,
        answered for the owner "tls:<certificate CN>" (`site.requests`); a refusal included."""
        if header["op"] in READ_OPS:  # a compute site reading the replica (--mirror tls://): read-only
            return answer_or_refuse(peer, header, lambda: self._read(header), log)
        return self.requests.answer(TLS_OWNER + peer, header, payload)

    def _read(self, header: dict[str, Any]) -> Reply:
        if self.reads is None:
            raise ProtocolError("this storage site serves no replica reads (--no-replica-reads)")
        return self.reads.answer(header["op"], header)


def _more_descriptors() -> None:
    """Raise the soft limit on open files to the hard one: pending handshakes hold a descriptor each."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
        except (ValueError, OSError):
            pass


def _return_freed_memory_promptly() -> None:
    """Ask glibc to give freed heap back to the system past 1 MiB, in every thread's arena: by default it
    keeps a parsed setup's peak for the job's life (a job is parsed on a connection's thread, whose arena
    `malloc_trim` does not shrink)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-1, 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def serve(settings: ServeSettings) -> int:
    asked = {name: value for name, value in settings.receivers.items() if value is not None}
    if settings.keys is None and not asked:
        others = ", ".join(f"{r.option} {r.metavar}" for r in receivers())
        raise UsageError(
            f"paramedic serve needs --keys (its TLS listener) or another way in ({others}), or both"
        )
    server = SiteServer(settings)
    _more_descriptors()
    _return_freed_memory_promptly()
    replica = str(settings.replica or "none (traces and plain output only)")
    site = SiteContext(server.store, log, settings.keys, settings.open_idle_seconds, server.requests)
    started: list[Started] = []
    try:
        start_receivers(asked, site, replica, started)  # stopped in `finally`, whatever stops the site
        if settings.keys is not None:
            host, port = server.bind()
            reads = (
                "serving its fragment volumes read-only" if server.reads is not None else "no replica reads"
            )
            log(f"listening on {host}:{port} (TLS 1.3, client certificates), replica {replica} ({reads})")
            server.serve_forever()
        else:  # a wait with a timeout: a signal taken by another thread reaches the handler within a second
            while not server.stopping.wait(1.0):
                pass
    except KeyboardInterrupt:
        log("stopping")
    finally:
        stop_receivers(started, log)
        server.stop()
    return 0
