"""A storage site's replica read over parallel TLS streams: the `tls://` scheme of `--mirror`.

`paramedic serve --replica DB` serves its database's fragment volume files read-only to compute sites
with a certificate from its CA (`site.replica_reads`). This is the compute site's side: a `Replica`
(`db.replicas`) whose reads are byte ranges at explicit offsets, each on one of up to `streams` TLS
connections (SEMPLAR's parallel streams, as the output path's `--streams`). `parallelism` tells
`db.stripes` to keep one read in flight per stream. A URL is `tls://HOST:PORT/<name>[?streams=N]`: the
path only names the mirror in messages (the site serves the one database it has; the manifest checksum
decides whether it is the right one), `streams` defaults to 4.

The `tls://` scheme plugin (`ship.tls_scheme`) opens it for a `--mirror` URL.
Everything the site sends is untrusted: frames are bounded (`ship.wire`), listings are checked here and
in `db.stripes`, and every volume is verified against the manifest's SHA-256 before it is used.
"""

from __future__ import annotations

import queue
import ssl
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from paramedic.db.manifest import Manifest
from paramedic.db.replicas import MAX_READ_BYTES, ReplicaError, VolumeFile
from paramedic.errors import UsageError
from paramedic.ship.client import open_tls, tls_refusal
from paramedic.ship.tls import client_context
from paramedic.ship.transport import SiteAddress
from paramedic.ship.wire import FrameDeadlines, ProtocolError, loads_json, recv_frame, send_frame

DEFAULT_STREAMS = 4
MAX_STREAMS = 64  # the site admits 80 connections per compute site
MAX_LISTED_FILES = 64  # a makeblastdb volume has about a dozen files
READ_SECONDS = 120.0  # without a byte of the reply, a stream counts as lost
# A reply, once begun, is complete within 30 s plus one per 64 KiB: a mirror that trickles is dropped (and
# its stripes read from the others), never waited on for ever
REPLY_DEADLINES = FrameDeadlines(idle=READ_SECONDS, frame=30.0, min_rate=64 * 1024)


class TlsReplica:
    """The replica a storage site serves, read over up to `streams` TLS connections."""

    def __init__(self, url: str, keys: Path | None, streams: int | None = None):
        parsed = urlparse(url)
        if parsed.scheme != "tls" or not parsed.hostname or parsed.port is None:
            raise UsageError(f"--mirror {url}: expected tls://HOST:PORT/NAME")
        if keys is None:
            raise UsageError(f"--mirror {url}: a storage site's replica needs --keys (a client certificate)")
        query = parse_qs(parsed.query)
        if streams is None:
            text = query.get("streams", [str(DEFAULT_STREAMS)])[-1]
            if not text.isdigit():
                raise UsageError(f"--mirror {url}: streams must be a number")
            streams = int(text)
        if not 1 <= streams <= MAX_STREAMS:
            raise UsageError(f"--mirror {url}: streams must be 1..{MAX_STREAMS}")
        self.address = SiteAddress("tls", parsed.hostname, parsed.port)
        self.context = client_context(keys)
        self.parallelism = streams
        self._label = f"tls://{parsed.hostname}:{parsed.port}{parsed.path}"
        self._slots = threading.BoundedSemaphore(streams)
        self._idle: queue.SimpleQueue[ssl.SSLSocket] = queue.SimpleQueue()
        self._closed = False

    @property
    def label(self) -> str:
        return self._label

    # -- one request on one stream ------------------------------------------------------------------------
    def _request(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Send a request on a free stream and return the site's reply; ReplicaError if it cannot."""
        with self._slots:
            for attempt in range(2):  # an idle stream the site closed meanwhile: once more, on a new one
                fresh = False
                try:
                    tls = self._idle.get_nowait()
                except queue.Empty:
                    tls, fresh = self._connect(), True
                try:
                    tls.settimeout(READ_SECONDS)
                    send_frame(tls, header)
                    reply, payload = recv_frame(tls, REPLY_DEADLINES)
                except (OSError, ProtocolError) as exc:
                    tls.close()
                    refusal = tls_refusal(self.address, exc)
                    if refusal is not None:
                        raise ReplicaError(f"replica {self.label}: {refusal}") from exc
                    if fresh or attempt:
                        raise ReplicaError(f"replica {self.label}: connection lost ({exc})") from exc
                    continue
                if reply.get("op") in ("error", "busy"):
                    tls.close()  # the site closes the connection after an error
                    raise ReplicaError(
                        f"replica {self.label}: the site refused: {str(reply.get('message'))[:300]}"
                    )
                if self._closed:
                    tls.close()
                else:
                    self._idle.put(tls)
                return reply, payload
        raise AssertionError("unreachable")

    def _connect(self) -> ssl.SSLSocket:
        try:
            return open_tls(self.address, self.context)
        except (OSError, ssl.SSLError) as exc:
            refusal = tls_refusal(self.address, exc)
            why = str(refusal) if refusal is not None else f"cannot connect ({exc})"
            raise ReplicaError(f"replica {self.label}: {why}") from exc

    # -- the Replica protocol -------------------------------------------------------------------------------
    def manifest(self) -> Manifest:
        reply, payload = self._request({"op": "replica_manifest"})
        try:
            loads_json(payload, "the replica's manifest")  # bounded before the dataclass sees it
            manifest = Manifest.from_json(payload.decode())
        except (ProtocolError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ReplicaError(f"replica {self.label}: unreadable manifest ({exc})") from exc
        if reply.get("manifest_sha256") != manifest.checksum():
            raise ReplicaError(f"replica {self.label}: the manifest does not match its own checksum")
        return manifest

    def volume_files(self, volume: str) -> list[VolumeFile]:
        reply, _ = self._request({"op": "volume_files", "volume": volume})
        files = reply.get("files")
        if reply.get("op") != "volume_files" or not isinstance(files, list) or len(files) > MAX_LISTED_FILES:
            raise ReplicaError(f"replica {self.label}: bad listing of volume {volume}")
        listing = []
        for entry in files:
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not isinstance(entry[0], str)
                or not isinstance(entry[1], int)
                or isinstance(entry[1], bool)
                or entry[1] < 0
            ):
                raise ReplicaError(f"replica {self.label}: bad listing of volume {volume}")
            listing.append(VolumeFile(entry[0], entry[1]))
        return sorted(listing, key=lambda f: f.name)

    def read(self, name: str, offset: int, length: int) -> bytes:
        if not 0 < length <= MAX_READ_BYTES or offset < 0:
            raise ReplicaError(f"replica {self.label}: bad read {name!r} {offset}+{length}")
        reply, payload = self._request({"op": "read", "name": name, "offset": offset, "length": length})
        if (
            reply.get("op") != "data"
            or reply.get("name") != name
            or reply.get("offset") != offset
            or len(payload) != length
        ):
            raise ReplicaError(f"replica {self.label}: a read of {name} came back wrong")
        return payload

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
