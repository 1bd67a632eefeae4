"""`--site file:///shared/inbox`: ship through a shared directory ("through global filesystems").

The compute site writes a job's files into `<inbox>/<job>/`, each under a temporary name and then renamed,
so the storage site (`paramedic serve --inbox`) never reads a half-written file:

    open.json            codec and setup        setup.bin          the setup payload
    chunk-N.bin          a chunk's payload      chunk-N.json       its header with the SHA-256 (last)
    finish.json          chunk count, size and digest of the output (ranges codecs)

The storage site answers with files too: `ack-N` (stored durably), `nack-N` (digest mismatch: the chunk
is written again), `done.json` (the final file's digest) or `error.json`. Access control is the shared
filesystem's; the chunks carry the same checksums as over TLS.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from paramedic.durable import write_durably
from paramedic.ship.client import ShipStats, SiteAddress, SiteError

POLL_SECONDS = 0.05


class InboxShipper:
    def __init__(
        self, address: SiteAddress, codec: str, setup: dict[str, Any], setup_payload: bytes, timeout: float
    ):
        assert address.path is not None
        self.inbox = address.path
        self.job_id = uuid.uuid4().hex
        self.directory = self.inbox / self.job_id
        self.codec = codec
        self.setup = setup
        self.setup_payload = setup_payload
        self.timeout = timeout
        self.stats = ShipStats()
        self.unacked: dict[int, tuple[dict[str, Any], bytes]] = {}
        self.next_index = 0

    def start(self) -> None:
        if not self.inbox.is_dir():
            raise SiteError(f"inbox {self.inbox}: not a directory")
        try:
            self.directory.mkdir()
            write_durably(self.directory / "setup.bin", self.setup_payload)
            opening = {"job": self.job_id, "codec": self.codec, "setup": self.setup}
            write_durably(self.directory / "open.json", json.dumps(opening).encode())
        except OSError as exc:
            raise SiteError(f"inbox {self.inbox}: cannot write: {exc.strerror}") from exc
        self.stats.setup_bytes = len(self.setup_payload)

    def send(self, header: dict[str, Any], payload: bytes) -> None:
        index = self.next_index
        self.next_index += 1
        self.unacked[index] = (header, payload)
        self.stats.chunks += 1
        self.stats.payload_bytes += len(payload)
        self._write_chunk(index)
        self._collect_acks()

    def _write_chunk(self, index: int) -> None:
        header, payload = self.unacked[index]
        full = {**header, "index": index, "sha256": hashlib.sha256(payload).hexdigest()}
        if self.stats.first_send is None:
            self.stats.first_send = time.perf_counter()
        write_durably(self.directory / f"chunk-{index}.bin", payload)
        write_durably(self.directory / f"chunk-{index}.json", json.dumps(full).encode())
        self.stats.wire_bytes += len(payload)

    def _collect_acks(self) -> None:
        self._check_error()
        for index in list(self.unacked):
            if (self.directory / f"ack-{index}").exists():
                del self.unacked[index]
                self.stats.last_ack = time.perf_counter()
            elif (self.directory / f"nack-{index}").exists():
                (self.directory / f"nack-{index}").unlink()
                self.stats.resent += 1
                self._write_chunk(index)

    def _check_error(self) -> None:
        error = self.directory / "error.json"
        if error.exists():
            message = json.loads(error.read_text()).get("message", "failed")
            raise SiteError(f"storage site: {message}")

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while self.unacked:
            self._collect_acks()
            self._wait(deadline, "acknowledgements")
        write_durably(
            self.directory / "finish.json", json.dumps({"chunks": self.next_index, **final}).encode()
        )
        done = self.directory / "done.json"
        while not done.exists():
            self._check_error()
            self._wait(deadline, "the final file")
        return json.loads(done.read_text())

    def _wait(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise SiteError(f"inbox {self.inbox}: no {what} from the storage site in {self.timeout:.0f} s")
        time.sleep(POLL_SECONDS)

    def cancel(self) -> None:
        """The compute job failed: ask the site to drop the job (best effort)."""
        try:
            write_durably(self.directory / "cancel.json", b"{}")
        except OSError:
            pass

    def close(self) -> None:
        pass
