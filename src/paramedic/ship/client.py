"""The compute site's side of the link: chunks go out over several TLS streams and are never lost.

Each chunk carries its SHA-256; the storage site acknowledges a chunk only once it is stored durably, or
asks for it again when the digest does not match. A stream that breaks (a cut connection, a restarted
server) reconnects with backoff, reopens the job, learns which chunks the site already holds and resends
only the others. `finish` returns once the site reports the final file durable, with its digest.

Streams keep up to WINDOW chunks in flight, so a long round trip does not serialise the transfer. A stream
with nothing to send says so every KEEPALIVE_SECONDS (the site closes silent connections and expires jobs
nobody asks about). Waiting for the final file, the client gives up after --ship-timeout without progress
(the site reports chunks decoded and decodes running). A compute job that fails cancels its site job.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramedic.ship.tls import client_context
from paramedic.ship.transport import Opening, ShipStats, SiteAddress, SiteError
from paramedic.ship.wire import ProtocolError, recv_frame, send_frame

WINDOW = 32
CONNECT_SECONDS = 10.0
REPLY_SECONDS = 120.0
KEEPALIVE_SECONDS = 30.0  # well under the server's idle limit between frames (wire.FrameDeadlines.idle)
CANCEL_SECONDS = 5.0
# How often a run again asks the site whether its earlier job, still open there, is done (finished_job).
FINISH_POLL_SECONDS = 0.2
KEEPALIVE = -1  # the in-flight index of a keep-alive request
# Waiting for a reply, allow this rate for the bytes still in flight ahead of it (in kernel buffers and
# relays): on a slow link shared by several streams a 4 MiB chunk alone takes minutes. Never longer than
# --ship-timeout, the time after which the site counts as lost.
SLOWEST_LINK_BYTES_PER_SECOND = 16 * 1024


def open_tls(address: SiteAddress, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection to the site (server certificate and host name checked by `context`)."""
    raw = socket.create_connection((address.host, address.port), timeout=CONNECT_SECONDS)
    try:
        tls = context.wrap_socket(raw, server_hostname=address.host)
    except BaseException:
        raw.close()
        raise
    tls.settimeout(REPLY_SECONDS)
    return tls


def tls_refusal(address: SiteAddress, exc: BaseException) -> SiteError | None:
    """The error to stop with when `exc` is a TLS refusal (retrying cannot help); None for a lost link."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return SiteError(f"{address}: the server's certificate is not trusted: {exc.verify_message}")
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return SiteError(f"{address}: TLS refused: {exc.reason or exc}")
    return None


@dataclass
class _Chunk:
    index: int
    header: dict[str, Any]
    payload: bytes
    sent_before: bool = False


@dataclass
class _Shared:
    pending: dict[int, _Chunk] = field(default_factory=dict)  # sent or queued, not acknowledged
    # every index the site acknowledged, also before it was queued here (a reopened job's `acked`)
    acked: set[int] = field(default_factory=set)
    queue: deque[int] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=threading.Condition)
    failure: BaseException | None = None
    closing: bool = False


class TlsShipper:
    """Ships one job's chunks to a storage site over `streams` TLS connections."""

    def __init__(
        self,
        address: SiteAddress,
        keys: Path,
        codec: str,
        setup: dict[str, Any],
        setup_payload: bytes,
        streams: int = 4,
        timeout: float = 300.0,
        tamper: Callable[[int, bytes], bytes] | None = None,
        job_id: str | None = None,
    ):
        self.address = address
        self.context = client_context(keys)
        self.job_id = job_id or uuid.uuid4().hex
        self.codec = codec
        self.setup = setup
        self.setup_payload = setup_payload
        self.timeout = timeout
        self.tamper = tamper  # tests: corrupt a payload on its first sending
        self.stats = ShipStats()
        self.shared = _Shared()
        self.next_index = 0
        self.opened = False  # a stream has opened the job (`start` waits for it)
        self.stats_lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._stream, args=(i,), daemon=True, name=f"ship-{i}")
            for i in range(streams)
        ]

    # -- connections ----------------------------------------------------------------------------------
    def connect(self) -> ssl.SSLSocket:
        return open_tls(self.address, self.context)

    def request(self, tls: ssl.SSLSocket, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        self._count(send_frame(tls, header, payload))
        reply, _ = recv_frame(tls)
        if reply.get("op") == "error":
            raise SiteError(f"storage site: {reply.get('message')}")
        if reply.get("op") == "busy":  # no connection slot free now: retried
            raise ProtocolError(f"storage site busy: {reply.get('message')}")
        return reply

    def _open(self, tls: ssl.SSLSocket) -> set[int]:
        header = {"op": "open", "job": self.job_id, "codec": self.codec, "setup": self.setup}
        reply = self.request(tls, header)
        if reply.get("op") == "need_setup":
            reply = self.request(tls, {**header, "with_setup": True}, self.setup_payload)
            with self.stats_lock:
                self.stats.setup_bytes += len(self.setup_payload)
        if reply.get("op") != "opened" or not isinstance(reply.get("acked"), list):
            raise ProtocolError(f"unexpected reply to open: {reply.get('op')}")
        return set(reply["acked"])

    def start(self) -> None:
        """Open the job on the first stream (fails fast if the site refuses it), then start the others. The
        first stream goes on with the job it opened: chunks leave a TLS handshake and a round trip sooner
        than when the job was opened on a connection of its own first."""
        self.threads[0].start()
        with self.shared.cond:
            while not self.opened and self.shared.failure is None:
                self.shared.cond.wait(0.5)
            self._raise_failure()
        for thread in self.threads[1:]:
            thread.start()

    def _with_retry(self, action: Callable[[], Any], deadline: float) -> Any:
        delay = 0.2
        while True:
            try:
                return action()
            except (OSError, ProtocolError) as exc:
                refusal = tls_refusal(self.address, exc)
                if refusal is not None:
                    raise refusal from exc
                if time.monotonic() + delay > deadline:
                    raise SiteError(f"cannot reach the storage site {self.address}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- sending --------------------------------------------------------------------------------------
    def send(self, header: dict[str, Any], payload: bytes) -> None:
        """Queue the next chunk (numbered in call order)."""
        chunk = _Chunk(self.next_index, header, payload)
        self.next_index += 1
        with self.stats_lock:
            self.stats.chunks += 1
            self.stats.payload_bytes += len(payload)
        with self.shared.cond:
            self._raise_failure()
            if chunk.index in self.shared.acked:  # a resumed job: the site holds it already
                return
            self.shared.pending[chunk.index] = chunk
            self.shared.queue.append(chunk.index)
            self.shared.cond.notify_all()

    def _stream(self, number: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                tls = self._with_retry(self.connect, deadline)
                with tls:
                    acked = self._open(tls)
                    self._acknowledge(acked)
                    with self.shared.cond:
                        self.opened = True
                        self.shared.cond.notify_all()
                    deadline = time.monotonic() + self.timeout
                    if self._pump(tls):
                        return
            except SiteError as exc:
                self._fail(exc)
                return
            except (OSError, ProtocolError) as exc:
                refusal = tls_refusal(self.address, exc)
                if refusal is not None:
                    self._fail(refusal)
                    return
                with self.stats_lock:
                    self.stats.reconnects += 1
                if time.monotonic() > deadline:
                    if not self.opened:
                        self._fail(SiteError(f"cannot reach the storage site {self.address}: {exc}"))
                    else:
                        self._fail(
                            SiteError(f"lost the storage site {self.address} for {self.timeout:.0f} s")
                        )
                    return
                time.sleep(0.2)
            except BaseException as exc:  # a bug: fail the job instead of hanging it
                self._fail(exc)
                return

    def _pump(self, tls: ssl.SSLSocket) -> bool:
        """Send queued chunks and read acknowledgements until closing (True) or the stream breaks."""
        inflight: deque[tuple[int, int]] = deque()  # (chunk index, bytes on the wire), oldest first
        last_frame = time.monotonic()
        try:
            while True:
                keepalive = False
                with self.shared.cond:
                    while not self.shared.queue and not inflight:
                        if self.shared.closing or self.shared.failure is not None:
                            return True
                        if time.monotonic() - last_frame >= KEEPALIVE_SECONDS:
                            keepalive = True
                            break
                        self.shared.cond.wait(0.5)
                    chunk = None
                    if self.shared.queue and len(inflight) < WINDOW:
                        chunk = self.shared.pending.get(self.shared.queue.popleft())
                if keepalive:
                    last_frame = time.monotonic()
                    inflight.append((KEEPALIVE, 0))
                    self._count(send_frame(tls, {"op": "keepalive", "job": self.job_id}))
                    continue
                if chunk is not None:
                    last_frame = time.monotonic()
                    self._send_chunk(tls, chunk, inflight)
                    continue
                self._take_reply(tls, inflight)
        finally:
            with self.shared.cond:  # whatever was in flight on a broken stream goes out again
                for index, _ in reversed(inflight):
                    if index != KEEPALIVE and index in self.shared.pending:
                        self.shared.queue.appendleft(index)
                self.shared.cond.notify_all()

    def _send_chunk(self, tls: ssl.SSLSocket, chunk: _Chunk, inflight: deque[tuple[int, int]]) -> None:
        """One chunk on the stream, in flight until its reply (the tamper hook, for tests, sees its first
        sending only)."""
        payload = chunk.payload
        if self.tamper is not None and not chunk.sent_before:
            payload = self.tamper(chunk.index, payload)
        chunk.sent_before = True
        header = {
            **chunk.header,
            "op": "chunk",
            "job": self.job_id,
            "index": chunk.index,
            "sha256": hashlib.sha256(chunk.payload).hexdigest(),
        }
        inflight.append((chunk.index, 0))
        if self.stats.first_send is None:
            self.stats.first_send = time.perf_counter()
        sent = send_frame(tls, header, payload)
        inflight[-1] = (chunk.index, sent)
        self._count(sent)

    def _take_reply(self, tls: ssl.SSLSocket, inflight: deque[tuple[int, int]]) -> None:
        """The reply to the oldest frame in flight, waited for as long as the bytes ahead of it take on the
        slowest link served: an ack, a nack (the chunk queued again), or the site's refusal raised."""
        ahead = sum(size for _, size in inflight)
        tls.settimeout(min(self.timeout, REPLY_SECONDS + ahead / SLOWEST_LINK_BYTES_PER_SECOND))
        reply, _ = recv_frame(tls)
        index, _ = inflight.popleft()
        if index == KEEPALIVE and reply.get("op") == "alive":
            return
        if reply.get("op") == "ack" and reply.get("index") == index:
            self._acknowledge({index})
        elif reply.get("op") == "nack" and reply.get("index") == index:
            with self.stats_lock:
                self.stats.resent += 1
            with self.shared.cond:
                self.shared.queue.appendleft(index)
        elif reply.get("op") == "error":
            raise SiteError(f"storage site: {reply.get('message')}")
        else:
            raise ProtocolError(f"unexpected reply {reply.get('op')!r}")

    def _acknowledge(self, indices: set[int]) -> None:
        if indices:
            self.stats.last_ack = time.perf_counter()
        with self.shared.cond:
            self.shared.acked |= indices
            for index in indices:
                self.shared.pending.pop(index, None)
            if indices:
                self.shared.queue = deque(i for i in self.shared.queue if i in self.shared.pending)
            self.shared.cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self.shared.cond:
            if self.shared.failure is None:
                self.shared.failure = exc
            self.shared.cond.notify_all()

    def _raise_failure(self) -> None:
        failure = self.shared.failure
        if failure is not None:
            raise failure if isinstance(failure, SiteError) else SiteError(f"shipping failed: {failure!r}")

    def _count(self, n: int) -> None:
        with self.stats_lock:
            self.stats.wire_bytes += n

    # -- finishing ------------------------------------------------------------------------------------
    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        """Wait until every chunk is acknowledged, then until the site's file is durable; its digest. The
        connection that asks is made while the last chunks are on their way (a TLS handshake and the job's
        reopening: 50-60 ms after the last acknowledgement before)."""
        early = _EarlyConnection(self)
        try:
            return self._finish(final, early)
        finally:
            early.close()

    def _finish(self, final: dict[str, Any], early: _EarlyConnection) -> dict[str, Any]:
        with self.shared.cond:
            while self.shared.pending and self.shared.failure is None:
                self.shared.cond.wait(0.5)
            self._raise_failure()
            self.shared.closing = True
            self.shared.cond.notify_all()
        header = {"op": "finish", "job": self.job_id, "chunks": self.next_index, **final}
        # --ship-timeout bounds the whole wait for the file, whatever the site answers ("pending",
        # "running", progress that never ends): a site stuck in a regeneration cannot hold the search.
        deadline = time.monotonic() + self.timeout
        asked = time.monotonic()
        poll = [0.01]

        def ask() -> dict[str, Any]:
            tls = early.take()
            if tls is None:
                tls = self.connect()
                try:
                    self._open(tls)
                except BaseException:
                    tls.close()
                    raise
            with tls:
                while True:
                    tls.settimeout(min(REPLY_SECONDS, max(deadline - time.monotonic(), 0.5)))
                    reply = self.request(tls, header)
                    if reply.get("op") == "done":
                        return reply
                    if reply.get("op") != "pending":
                        raise ProtocolError(f"unexpected reply {reply.get('op')!r}")
                    if time.monotonic() > deadline:
                        raise SiteError(
                            f"the storage site {self.address} did not finish the output within "
                            f"{self.timeout:.0f} s (--ship-timeout)"
                        )
                    # asked again soon, then less often: a small file is written within a few tens of
                    # milliseconds of the first ask, which a fixed 0.2 s would add to every command
                    time.sleep(poll[0])
                    # every 50 ms for the first seconds (a trace's regeneration takes 0.1-0.5 s: the 0.2 s
                    # step overshot it by 0.1-0.2 s on average), then every FINISH_POLL_SECONDS
                    cap = 0.05 if time.monotonic() - asked < 2.0 else FINISH_POLL_SECONDS
                    poll[0] = min(poll[0] * 2, cap)

        delay = 0.2
        while True:
            try:
                return ask()
            except SiteError:
                raise
            except (OSError, ProtocolError) as exc:
                refusal = tls_refusal(self.address, exc)
                if refusal is not None:
                    raise refusal from exc
                if time.monotonic() + delay > deadline:
                    raise SiteError(f"cannot reach the storage site {self.address}: {exc}") from exc
                with self.stats_lock:
                    self.stats.reconnects += 1
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def cancel(self) -> None:
        """The compute job failed: tell the site to drop the job now (best effort, a few seconds at most)."""
        self._fail(SiteError("cancelled"))
        try:  # one connection, CANCEL_SECONDS per step: a lost site delays the failure a little, no more
            raw = socket.create_connection((self.address.host, self.address.port), timeout=CANCEL_SECONDS)
            with self.context.wrap_socket(raw, server_hostname=self.address.host) as tls:
                send_frame(tls, {"op": "cancel", "job": self.job_id})
                recv_frame(tls)
        except (OSError, ProtocolError):
            pass

    def close(self) -> None:
        with self.shared.cond:
            self.shared.closing = True
            self.shared.cond.notify_all()
        for thread in self.threads:
            if thread.is_alive():
                thread.join(timeout=2)


class _EarlyConnection:
    """A connection to the site, the job reopened on it, made on a thread of its own: `take` gives it once
    it is made (None when making it failed, or when it is older than KEEPALIVE_SECONDS: the site may have
    closed it as idle), and only once; `close` closes one nobody took."""

    def __init__(self, shipper: TlsShipper):
        self.shipper = shipper
        self.tls: ssl.SSLSocket | None = None
        self.made = 0.0
        self.taken = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._make, daemon=True, name="ship-finish")
        self.thread.start()

    def _make(self) -> None:
        try:
            tls = self.shipper.connect()
        except (OSError, ProtocolError):
            return  # the finish connects again itself (and says why if it cannot)
        try:
            self.shipper._open(tls)
        except (OSError, ProtocolError, SiteError):
            tls.close()
            return
        with self.lock:
            if self.taken:
                tls.close()
                return
            self.tls, self.made = tls, time.monotonic()

    def take(self) -> ssl.SSLSocket | None:
        if not self.taken:
            self.thread.join(CONNECT_SECONDS + REPLY_SECONDS)
        with self.lock:
            tls, self.tls, self.taken = self.tls, None, True
        if tls is not None and time.monotonic() - self.made > KEEPALIVE_SECONDS:
            tls.close()
            return None
        return tls

    def close(self) -> None:
        with self.lock:
            tls, self.tls, self.taken = self.tls, None, True
        if tls is not None:
            tls.close()


def finished_job(address: SiteAddress, keys: Path, job_id: str, out: str) -> dict[str, Any] | None:
    """The site's `done` answer (final size and digest) for a job this compute site opened earlier to
    write `out`, or None when it is not done, unknown, wrote another path, or the site cannot say now
    (best effort, a few seconds at most). A job the site still holds open is asked again for up to
    CANCEL_SECONDS: a run killed just as the site published may be run again before the site has recorded
    the job done (its file already in place), and would else be refused for the file it finds there."""
    deadline = time.monotonic() + CANCEL_SECONDS
    while True:
        try:
            raw = socket.create_connection((address.host, address.port), timeout=CANCEL_SECONDS)
            with client_context(keys).wrap_socket(raw, server_hostname=address.host) as tls:
                tls.settimeout(CANCEL_SECONDS)
                send_frame(tls, {"op": "status", "job": job_id})
                reply, _ = recv_frame(tls)
        except (OSError, ProtocolError):
            return None
        still_open = reply.get("op") == "status" and reply.get("state") == "open"
        if not still_open or time.monotonic() + FINISH_POLL_SECONDS > deadline:
            break
        time.sleep(FINISH_POLL_SECONDS)
    if reply.get("op") != "done" or not isinstance(reply.get("sha256"), str) or reply.get("out") != out:
        return None
    return reply


def tls_shipper(opening: Opening) -> TlsShipper:
    assert opening.keys is not None
    return TlsShipper(
        opening.address,
        opening.keys,
        opening.codec,
        opening.setup,
        opening.payload,
        opening.streams,
        opening.timeout,
        job_id=opening.job_id,
    )
