"""Pending TLS handshakes, held by one event loop (issue 23, item 13).

A connection that has not authenticated costs the site a descriptor and a few hundred bytes, never a
thread: thousands can wait at once, each for `handshake_seconds` in all. A silent connection is not even
wrapped in TLS until its first byte arrives. When the table is full, or one address holds its share, the
*oldest* pending handshake of the address holding the most is closed to make room: a flood pushes out its
own connections, and a real client, whose handshake takes one round trip, gets through however many
silent connections share its address. IPv6 sources count per /64, the block one host can spend freely.

`HandshakeTable` is the bookkeeping (pure, unit-tested); `HandshakeLoop` drives the sockets.
"""

from __future__ import annotations

import errno
import ipaddress
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

ACCEPTS_PER_WAKE = 256  # a burst of new connections does not starve the handshakes already under way
# A refused handshake (a client certificate of another CA) is closed in two steps: its write side first,
# after the TLS alert that says why, then the socket once the client has read it and closed, or after
# this long. Closed at once, the client's first request, already sent and not read here, made the close a
# reset, which can drop the alert: the client saw "EOF occurred in violation of protocol", took it for a
# lost link and retried until --ship-timeout instead of saying "refused" (seen under load).
LINGER_SECONDS = 2.0
MAX_LINGERING = 1024  # refused connections closing at once (the oldest is closed outright past it)
NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def address_key(host: str) -> str:
    """Whose share a connection counts against: the address, or its /64 for IPv6."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else str(ip)


@dataclass(eq=False)
class Entry(Generic[T]):
    item: T
    key: str
    deadline: float


@dataclass
class HandshakeTable(Generic[T]):
    """Pending handshakes in arrival order, counted per address; full means evict the heaviest's oldest."""

    max_total: int
    max_per_key: int
    entries: dict[int, Entry[T]] = field(default_factory=dict)  # id -> entry, oldest first
    by_key: dict[str, dict[int, Entry[T]]] = field(default_factory=dict)  # oldest first per key
    buckets: dict[int, set[str]] = field(default_factory=dict)  # count -> keys holding that many
    heaviest: int = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, item: T, key: str, deadline: float) -> tuple[Entry[T], list[Entry[T]]]:
        """Hold `item`; also return the entries pushed out to make room for it (closed by the caller)."""
        entry = Entry(item, key, deadline)
        self.entries[id(entry)] = entry
        mine = self.by_key.setdefault(key, {})
        mine[id(entry)] = entry
        self._move(key, len(mine) - 1, len(mine))
        evicted: list[Entry[T]] = []
        while len(mine) > max(1, self.max_per_key):
            evicted.append(self._remove(next(iter(mine.values()))))
        while len(self.entries) > max(1, self.max_total):
            victim = self.evict_one()
            assert victim is not None
            evicted.append(victim)
        return entry, evicted

    def discard(self, entry: Entry[T]) -> bool:
        """Forget `entry` (done or failed); False if it was no longer held."""
        if id(entry) not in self.entries:
            return False
        self._remove(entry)
        return True

    def evict_one(self) -> Entry[T] | None:
        """Remove and return the oldest entry of an address holding the most (None when empty)."""
        if not self.entries:
            return None
        if self.heaviest == 1:  # every address holds one: the oldest of all
            return self._remove(next(iter(self.entries.values())))
        key = next(iter(self.buckets[self.heaviest]))
        return self._remove(next(iter(self.by_key[key].values())))

    def expired(self, now: float) -> list[Entry[T]]:
        """Remove and return the entries past their deadline (deadlines grow with arrival order)."""
        out: list[Entry[T]] = []
        while self.entries:
            oldest = next(iter(self.entries.values()))
            if oldest.deadline > now:
                break
            out.append(self._remove(oldest))
        return out

    def next_deadline(self) -> float | None:
        return next(iter(self.entries.values())).deadline if self.entries else None

    def count(self, key: str) -> int:
        return len(self.by_key.get(key, ()))

    def _remove(self, entry: Entry[T]) -> Entry[T]:
        del self.entries[id(entry)]
        mine = self.by_key[entry.key]
        del mine[id(entry)]
        self._move(entry.key, len(mine) + 1, len(mine))
        if not mine:
            del self.by_key[entry.key]
        return entry

    def _move(self, key: str, old: int, new: int) -> None:
        if old > 0:
            bucket = self.buckets[old]
            bucket.discard(key)
            if not bucket:
                del self.buckets[old]
        if new > 0:
            self.buckets.setdefault(new, set()).add(key)
        if new > self.heaviest:
            self.heaviest = new
        while self.heaviest > 0 and self.heaviest not in self.buckets:
            self.heaviest -= 1


@dataclass(eq=False)
class Pending:
    sock: socket.socket  # raw until the first byte comes, then the SSLSocket
    host: str
    started: bool = False  # wrapped in TLS


@dataclass(eq=False)
class Lingering:
    """A refused connection whose write side is shut: what the client still sends is read and dropped."""

    sock: socket.socket
    deadline: float


class HandshakeLoop:
    """Accepts connections and runs their TLS handshakes without blocking, in the calling thread.

    `done(tls, host)` receives each authenticated connection (blocking again) and must not block;
    `refused(host, why)` logs sparsely. Runs until `stopping()` is true.
    """

    def __init__(
        self,
        listener: socket.socket,
        context: ssl.SSLContext,
        seconds: float,
        max_total: int,
        max_per_address: int,
        done: Callable[[ssl.SSLSocket, str], None],
        refused: Callable[[str, str], None],
        stopping: Callable[[], bool],
    ):
        self.listener = listener
        self.context = context
        self.seconds = seconds
        self.table: HandshakeTable[Pending] = HandshakeTable(max_total, max_per_address)
        self.done = done
        self.refused = refused
        self.stopping = stopping
        self.selector = selectors.DefaultSelector()
        self.lingering: dict[int, Lingering] = {}  # id -> refused connection closing, oldest first

    def run(self) -> None:
        try:
            self.listener.setblocking(False)
            self.selector.register(self.listener, selectors.EVENT_READ, None)
        except (OSError, ValueError):  # stopped (the listener closed) before this thread got here
            return
        try:
            while not self.stopping():
                nearest = self.table.next_deadline()
                wait = 0.5 if nearest is None else min(0.5, max(0.0, nearest - time.monotonic()))
                for key, _ in self.selector.select(wait):
                    self._dispatch(key)
                now = time.monotonic()
                for entry in self.table.expired(now):
                    self._close(entry)
                    self.refused(entry.item.host, f"no TLS handshake within {self.seconds:g} s")
                for lingering in [x for x in self.lingering.values() if x.deadline <= now]:
                    self._end(lingering)
        finally:
            while (left := self.table.evict_one()) is not None:
                self._close(left)
            for lingering in list(self.lingering.values()):
                self._end(lingering)
            self.selector.close()

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        """One ready socket. A socket closed earlier in the same batch (evicted by an accept, ended by an
        expiry) still has its event here: it is skipped. Nothing an unauthenticated peer does may end the
        loop: any other error closes that one connection and is logged (issue 41, item 1: a burst of
        connections closed at once stopped the site with "Invalid file descriptor: -1")."""
        data = key.data
        try:
            if data is None:
                self._accept()
            elif isinstance(data, Lingering):
                if self.lingering.get(id(data)) is data:
                    self._drain(data)
            elif isinstance(data, Entry) and self.table.entries.get(id(data)) is data:
                self._advance(data)
        except Exception as exc:  # noqa: BLE001 - the accept loop survives any error of one socket
            if isinstance(data, Lingering):
                self._end(data)
            elif isinstance(data, Entry):
                self.table.discard(data)
                self._close(data)
            self.refused("-", f"connection dropped: {type(exc).__name__}: {exc}")

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return
            except (ConnectionAbortedError, InterruptedError):  # gone before it was accepted: the next one
                continue
            except OSError as exc:
                if self.stopping():
                    return
                if exc.errno in NO_DESCRIPTORS and (victim := self.table.evict_one()) is not None:
                    self._close(victim)  # the heaviest address's oldest makes room for this one
                    self.refused(victim.item.host, "too many connections in their TLS handshake")
                    continue
                self.refused("-", f"cannot accept: {exc.strerror or exc}")
                time.sleep(0.05)  # nothing to free: do not spin on a listener that stays readable
                return
            host = str(address[0])
            sock.setblocking(False)
            pending = Pending(sock, host)
            entry, evicted = self.table.add(pending, address_key(host), time.monotonic() + self.seconds)
            for victim in evicted:
                self._close(victim)
                self.refused(victim.item.host, "too many connections in their TLS handshake")
            try:
                self.selector.register(sock, selectors.EVENT_READ, entry)
            except (OSError, ValueError):
                self.table.discard(entry)
                sock.close()

    def _advance(self, entry: Entry[Pending]) -> None:
        pending = entry.item
        if not pending.started:  # its first bytes: only now does it cost a TLS state
            self.selector.unregister(pending.sock)
            try:
                pending.sock = self.context.wrap_socket(
                    pending.sock, server_side=True, do_handshake_on_connect=False
                )
            except (ssl.SSLError, OSError, ValueError) as exc:
                self.table.discard(entry)
                pending.sock.close()
                self.refused(pending.host, str(getattr(exc, "reason", None) or exc))
                return
            pending.started = True
            self.selector.register(pending.sock, selectors.EVENT_READ, entry)
        tls = pending.sock
        assert isinstance(tls, ssl.SSLSocket)
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self.selector.modify(tls, selectors.EVENT_READ, entry)
            return
        except ssl.SSLWantWriteError:
            self.selector.modify(tls, selectors.EVENT_WRITE, entry)
            return
        except (ssl.SSLError, OSError, ValueError) as exc:
            self.table.discard(entry)
            self._linger(tls)
            self.refused(pending.host, str(getattr(exc, "reason", None) or exc))
            return
        self.table.discard(entry)
        self.selector.unregister(tls)
        tls.setblocking(True)
        self.done(tls, pending.host)

    def _linger(self, sock: socket.socket) -> None:
        """Shut the write side (the alert is already written: the client reads it, then end of file) and
        read what the client still sends until it closes or LINGER_SECONDS pass."""
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        try:
            socket.socket.shutdown(sock, socket.SHUT_WR)  # the descriptor's, under the TLS object
            lingering = Lingering(sock, time.monotonic() + LINGER_SECONDS)
            self.selector.register(sock, selectors.EVENT_READ, lingering)
        except (OSError, ValueError):
            sock.close()
            return
        self.lingering[id(lingering)] = lingering
        if len(self.lingering) > MAX_LINGERING:
            self._end(next(iter(self.lingering.values())))

    def _drain(self, lingering: Lingering) -> None:
        try:
            data = socket.socket.recv(lingering.sock, 1 << 16)  # raw bytes, dropped unread
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset): nothing left to protect
            self._end(lingering)

    def _end(self, lingering: Lingering) -> None:
        self.lingering.pop(id(lingering), None)
        try:
            self.selector.unregister(lingering.sock)
        except (KeyError, ValueError):
            pass
        lingering.sock.close()

    def _close(self, entry: Entry[Pending]) -> None:
        try:
            self.selector.unregister(entry.item.sock)
        except (KeyError, ValueError):
            pass
        entry.item.sock.close()
