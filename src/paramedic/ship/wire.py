"""Frames on a TLS stream between a compute site and a storage site: bounded, typed, nothing more.

A frame is `u32 header length | u32 payload length | header (JSON object) | payload (bytes)`. The
header names the request (`"op"`) and carries small typed fields; the payload carries the bytes (a
chunk of output or metadata). Both lengths are checked against fixed bounds before anything is read,
so a peer cannot make the other side allocate more than one bounded frame.

Why not gRPC: its Python server cannot require TLS 1.3 (grpc/grpc#37305; the server-side options are
still an open pull request, #43080), and the issue requires TLS 1.3 on every connection. The standard
library's `ssl` module can, so the protocol is these frames over `ssl` sockets.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

MAX_HEADER_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 32 * 2**20
SEND_PIECE_BYTES = 64 * 1024
# JSON off the network or out of a shared directory: nothing the protocol sends nests deeper than 4.
MAX_JSON_DEPTH = 32
_LENGTHS = struct.Struct(">II")


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame (the connection is then closed)."""


class ConnectionClosed(ProtocolError):
    """The peer closed the connection between frames."""


def send_frame(
    sock: socket.socket, header: dict[str, Any], payload: bytes = b"", end: float | None = None
) -> int:
    """Send one frame; returns the bytes put on the wire (before TLS). With `end` (time.monotonic()), the
    whole frame must be out by then (a reader that does not read cannot hold its payload longer);
    TimeoutError otherwise."""
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER_BYTES or len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"frame too large ({len(head)} header, {len(payload)} payload bytes)")
    # In pieces: a socket timeout bounds one whole sendall, and a 4 MiB frame on a 1 Mbit/s link shared by
    # several streams takes minutes. Per piece, the timeout means "no progress", not "a slow link". The
    # payload is not copied into one buffer with the header: a site sending 16 MiB reads holds each once.
    total = 0
    for part in (memoryview(_LENGTHS.pack(len(head), len(payload)) + head), memoryview(payload)):
        for start in range(0, len(part), SEND_PIECE_BYTES):
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("frame not sent in time: the peer does not read")
                sock.settimeout(left)
            sock.sendall(part[start : start + SEND_PIECE_BYTES])
        total += len(part)
    return total


@dataclass(frozen=True)
class FrameDeadlines:
    """How long a peer may take (the server's defence against slow senders that hold a connection).

    `idle`: seconds between frames; `frame`: seconds for a whole frame once its first byte is in, plus one
    second per `min_rate` bytes the frame declares (a 32 MiB chunk on a slow link is not an attack; eight
    bytes over a minute are)."""

    idle: float = 120.0
    frame: float = 30.0
    min_rate: float = 16 * 1024


class FrameTimeout(ProtocolError):
    """The peer was too slow: idle between frames, or a frame not complete by its deadline."""


def recv_frame(sock: socket.socket, deadlines: FrameDeadlines | None = None) -> tuple[dict[str, Any], bytes]:
    """Receive one frame; ConnectionClosed on a clean end between frames, ProtocolError otherwise.

    With `deadlines` every wait is bounded (FrameTimeout); without, the socket's own timeout applies to
    each receive (the client's side: it sets its timeout from what it has in flight)."""
    end = None
    lengths: bytes | None
    if deadlines is not None:
        sock.settimeout(deadlines.idle)
        try:
            first = sock.recv(1)
        except TimeoutError:
            raise FrameTimeout(f"idle for {deadlines.idle:g} s") from None
        if not first:
            raise ConnectionClosed("connection closed")
        start = time.monotonic()
        end = start + deadlines.frame
        lengths = first + _recv_exact(sock, _LENGTHS.size - 1, end=end)  # type: ignore[operator]
    else:
        lengths = _recv_exact(sock, _LENGTHS.size, allow_eof=True)
        if lengths is None:
            raise ConnectionClosed("connection closed")
    head_len, payload_len = _LENGTHS.unpack(lengths)
    if head_len == 0 or head_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"bad header length {head_len}")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {payload_len} bytes exceeds the {MAX_PAYLOAD_BYTES} limit")
    if deadlines is not None:
        end = start + deadlines.frame + (head_len + payload_len) / deadlines.min_rate
    head = _recv_exact(sock, head_len, end=end)
    payload = _recv_exact(sock, payload_len, end=end) if payload_len else b""
    header = loads_json(head, "header")  # type: ignore[arg-type]
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("header is not an object with an op")
    return header, payload or b""


def _recv_exact(
    sock: socket.socket, n: int, allow_eof: bool = False, end: float | None = None
) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if end is not None:
            left = end - time.monotonic()
            if left <= 0:
                raise FrameTimeout(f"frame not complete in time ({len(buf)} of {n} bytes)")
            sock.settimeout(left)
        try:
            part = sock.recv(min(n - len(buf), 1 << 20))
        except TimeoutError:
            if end is None:
                raise
            raise FrameTimeout(f"frame not complete in time ({len(buf)} of {n} bytes)") from None
        if not part:
            if allow_eof and not buf:
                return None
            raise ProtocolError("connection closed inside a frame")
        buf += part
    return bytes(buf)


def json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def loads_json(data: bytes | str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from an untrusted source: ProtocolError (one line) for anything that is not bounded JSON."""
    try:
        value = json.loads(data)
    except RecursionError:  # the parser's own bound, far above max_depth
        raise ProtocolError(f"{what} is not acceptable JSON: nested too deeply") from None
    except ValueError as exc:
        raise ProtocolError(f"{what} is not JSON") from exc
    if json_depth(value) > max_depth:
        raise ProtocolError(f"{what} is not acceptable JSON: nested deeper than {max_depth} levels")
    return value


# -- typed access to untrusted header fields ------------------------------------------------------------


def field_int(header: dict[str, Any], name: str, low: int = 0, high: int = 2**62) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"field {name!r} must be an integer in [{low}, {high}]")
    return value


def field_str(header: dict[str, Any], name: str, max_len: int = 4096) -> str:
    value = header.get(name)
    if not isinstance(value, str) or len(value) > max_len:
        raise ProtocolError(f"field {name!r} must be a string of at most {max_len} characters")
    return value
