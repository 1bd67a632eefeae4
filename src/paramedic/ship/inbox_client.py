"""`--site file:///shared/inbox`: ship through a shared directory ("through global filesystems").

The compute site writes a job's files into `<inbox>/<job>/`, each under a temporary name and then renamed,
so the storage site (`paramedic serve --inbox`) never reads a half-written file:

    open.json            codec and setup        setup.bin          the setup payload
    chunk-N.bin          a chunk's payload      chunk-N.json       its header with the SHA-256 (last)
    finish.json          chunk count, size and digest of the output (ranges codecs)
    cancel.json          the compute job failed: drop the job

The storage site answers with files too: `ack-N` (stored durably), `nack-N` (digest mismatch: the chunk
is written again), `progress.json` (while the final file is being made), `done.json` (the final file's
digest) or `error.json`. The compute site removes the job's directory once it has the answer; it bumps the
directory's time every KEEPALIVE_SECONDS while the job is open (the site removes idle directories).

With `--keys` (a compute site's keys from `paramedic keys`) every JSON file is signed (`ship.signing`), and
only replies signed by the storage site's certificate from the same CA count: a forged `done.json` or
`ack-N` is ignored. Without keys, access control is the shared filesystem's alone (see `site.inbox`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from paramedic.db.replicas import LocalReplica
from paramedic.durable import write_durably
from paramedic.errors import UsageError
from paramedic.ship.inbox_dirs import remove_job_directory
from paramedic.ship.transport import (
    Link,
    Opening,
    ShipStats,
    SiteAddress,
    SiteError,
    register_scheme,
)
from paramedic.ship.wire import MAX_HEADER_BYTES, ProtocolError, loads_json

POLL_SECONDS = 0.05
KEEPALIVE_SECONDS = 30.0


class InboxShipper:
    def __init__(
        self,
        address: SiteAddress,
        codec: str,
        setup: dict[str, Any],
        setup_payload: bytes,
        timeout: float,
        keys: Path | None = None,
        job_id: str | None = None,
    ):
        import uuid

        assert address.path is not None
        self.inbox = address.path
        self.job_id = job_id or uuid.uuid4().hex
        self.directory = self.inbox / self.job_id
        self.codec = codec
        self.setup = setup
        self.setup_payload = setup_payload
        self.timeout = timeout
        self.stats = ShipStats()
        self.unacked: dict[int, tuple[dict[str, Any], bytes]] = {}
        self.next_index = 0
        self.signer = None
        if keys is not None:
            from paramedic.ship.signing import Signer

            self.signer = Signer(keys)
        self.unverified: str | None = None  # an error.json that is not the site's (signed mode)
        self.stopping = threading.Event()
        self.keepalive = threading.Thread(target=self._keepalive, daemon=True, name="inbox-keepalive")

    # -- files ----------------------------------------------------------------------------------------
    def _signed(self, kind: str, body: dict[str, Any]) -> bytes:
        if self.signer is None:
            return json.dumps(body).encode()
        return self.signer.envelope({**body, "kind": kind, "job": self.job_id})

    def _reply(self, name: str, kind: str) -> dict[str, Any] | None:
        """A reply file's content when it is there and (with keys) signed by the storage site for this job
        and this name; None otherwise. Unsigned replies are whatever JSON object they hold (empty: {})."""
        data = _read_regular(self.directory / name, MAX_HEADER_BYTES + 1)
        if data is None:
            return None
        try:
            if self.signer is None:
                if not data.strip():
                    return {}
                body = loads_json(data, name)
                if isinstance(body, dict) and isinstance(body.get("body"), str):  # a signed reply
                    body = loads_json(body["body"], name)
                if not isinstance(body, dict):
                    raise ProtocolError(f"{name}: not a JSON object")
                return body
            from paramedic.ship.signing import SERVER

            body, _ = self.signer.open_envelope(data, SERVER, name)
        except ProtocolError as exc:
            if self.signer is None:
                raise SiteError(f"inbox {self.inbox}: the storage site's {exc}") from None
            if kind == "error":
                self.unverified = str(exc)
            return None
        if body.get("kind") != kind or body.get("job") != self.job_id:
            if kind == "error":
                self.unverified = f"{name}: signed for another file or job"
            return None
        return body

    # -- the job --------------------------------------------------------------------------------------
    def start(self) -> None:
        if not self.inbox.is_dir():
            raise SiteError(f"inbox {self.inbox}: not a directory")
        try:
            self._make_directory()
            write_durably(self.directory / "setup.bin", self.setup_payload)
            opening = {"job": self.job_id, "codec": self.codec, "setup": self.setup}
            opening["setup_sha256"] = hashlib.sha256(self.setup_payload).hexdigest()
            write_durably(self.directory / "open.json", self._signed("open", opening))
        except OSError as exc:
            raise SiteError(f"inbox {self.inbox}: cannot write: {exc.strerror}") from exc
        self.stats.setup_bytes = len(self.setup_payload)
        self.keepalive.start()

    def _make_directory(self) -> None:
        """The job's directory. A resumable job id (`paramedic ship`'s) names the same directory each time
        the command runs: a run stopped before it read the site's answer left it, and this run goes on with
        that job (chunks the site acknowledged count, a done.json the site wrote is the answer) instead of
        failing on it. A stale error.json starts the directory afresh."""
        try:
            self.directory.mkdir()
            return
        except FileExistsError:
            if self.directory.is_symlink() or not self.directory.is_dir():
                raise
        if self._reply("error.json", "error") is not None or self.unverified is not None:
            self.unverified = None
            remove_job_directory(self.directory)
            self.directory.mkdir()

    def _keepalive(self) -> None:
        while not self.stopping.wait(KEEPALIVE_SECONDS):
            try:
                os.utime(self.directory)
            except OSError:
                return

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
        write_durably(self.directory / f"chunk-{index}.json", self._signed("chunk", full))
        self.stats.wire_bytes += len(payload)

    def _collect_acks(self) -> None:
        self._check_error()
        for index in list(self.unacked):
            if self._reply(f"ack-{index}", "ack") is not None:
                del self.unacked[index]
                self.stats.last_ack = time.perf_counter()
            elif self._reply(f"nack-{index}", "nack") is not None:
                (self.directory / f"nack-{index}").unlink()
                self.stats.resent += 1
                self._write_chunk(index)

    def _check_error(self) -> None:
        error = self._reply("error.json", "error")
        if error is not None:
            self._remove()
            raise SiteError(f"storage site: {str(error.get('message', 'failed'))[:500]}")
        if self.unverified is not None:  # never a success, so not worth waiting out --ship-timeout for
            self._remove()
            raise SiteError(
                f"inbox {self.inbox}: an error.json this search cannot verify ({self.unverified[:200]}): the "
                "storage site refused the job (are its keys and --keys from the same `paramedic keys`?), or "
                "someone else wrote it"
            )

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while self.unacked:
            self._collect_acks()
            self._wait(deadline, "acknowledgements")
        write_durably(
            self.directory / "finish.json", self._signed("finish", {"chunks": self.next_index, **final})
        )
        # --ship-timeout bounds the whole wait, whatever progress.json says (it is never signed)
        deadline = time.monotonic() + self.timeout
        while (done := self._reply("done.json", "done")) is None:
            self._check_error()
            self._wait(deadline, "final file")
        self._remove()
        return done

    def _wait(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            note = f" (ignored an error.json not from the site: {self.unverified})" if self.unverified else ""
            raise SiteError(
                f"inbox {self.inbox}: no {what} from the storage site in {self.timeout:.0f} s{note}"
            )
        time.sleep(POLL_SECONDS)

    def _remove(self) -> None:
        """The answer is in: the job's directory (with the queries) goes, renamed out of the job-name
        pattern first (`ship.inbox_dirs`): the same command run again at once makes one of the same name."""
        self.stopping.set()
        remove_job_directory(self.directory)

    def cancel(self) -> None:
        """The compute job failed: ask the site to drop the job (best effort)."""
        try:
            if self.directory.is_dir():
                write_durably(self.directory / "cancel.json", self._signed("cancel", {}))
        except OSError:
            pass

    def close(self) -> None:
        self.stopping.set()


def _read_regular(path: Path, limit: int) -> bytes | None:
    """At most `limit` bytes of a regular file, None for anything else. Opened without following a link
    and without blocking, then checked: a FIFO swapped in after a look (`is_file`) blocked `open` for
    ever, a wait --ship-timeout never bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts, size = [], 0
        while size < limit and (block := os.read(fd, limit - size)):
            parts.append(block)
            size += len(block)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def finished_inbox_job(address: SiteAddress, keys: Path | None, job_id: str) -> dict[str, Any] | None:
    """The site's done.json (final size and digest) in the job directory an earlier run of the same
    command left in the inbox (stopped after the site answered, before it read the answer), or None. With
    keys only a reply the storage site signed for this job counts. The directory is removed once read."""
    assert address.path is not None
    shipper = InboxShipper(address, "", {}, b"", 0.0, keys, job_id=job_id)
    if shipper.directory.is_symlink() or not shipper.directory.is_dir():
        return None
    try:
        done = shipper._reply("done.json", "done")
    except SiteError:
        return None
    if done is not None:
        shipper._remove()
    return done


class InboxScheme:
    """`file:///shared/inbox`: a storage site's inbox for shipping; a database directory for `--mirror`."""

    name = "file"
    aliases: tuple[str, ...] = ()

    def address(self, url: str) -> SiteAddress:
        parsed = urlparse(url)
        if not parsed.path:
            raise UsageError(f"--site {url}: expected file:///path/to/inbox")
        return SiteAddress("file", path=Path(parsed.path))

    def check(self, address: SiteAddress, keys: Path | None) -> None:
        pass  # without --keys, access control is the shared filesystem's alone

    def shipper(self, opening: Opening) -> InboxShipper:
        return InboxShipper(
            opening.address,
            opening.codec,
            opening.setup,
            opening.payload,
            opening.timeout,
            opening.keys,
            job_id=opening.job_id,
        )

    def replica(self, url: str, keys: Path | None) -> LocalReplica:
        parsed = urlparse(url)
        if not parsed.path:
            raise UsageError(f"--mirror {url}: expected file:///path/to/db")
        return LocalReplica(Path(parsed.path).resolve())

    def measure_link(
        self, address: SiteAddress, keys: Path | None, budget_bytes: int | None
    ) -> tuple[Link | None, str | None]:
        return None, None  # no link to measure; an inbox does not say which replica it has

    def finished_job(
        self, address: SiteAddress, keys: Path | None, job_id: str, out: str
    ) -> dict[str, Any] | None:
        return finished_inbox_job(address, keys, job_id)


INBOX = register_scheme(InboxScheme())
