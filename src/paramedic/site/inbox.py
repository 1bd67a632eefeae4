"""`paramedic serve --inbox DIR`: take jobs from a shared directory as well as over TLS.

The inbox's protocol is described in `ship.inbox_client`. Everything read from the inbox is as untrusted
as network input: names are checked, files are bounded, and the same JobStore checks every chunk's
SHA-256 and every path. Jobs are owned by the peer name "inbox".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from paramedic.durable import write_durably
from paramedic.errors import ParamedicError
from paramedic.ship.wire import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, ProtocolError
from paramedic.site.store import JOB_ID, JobFailed, JobStore, SiteJob

PEER = "inbox"
POLL_SECONDS = 0.1


class InboxWatcher:
    def __init__(self, inbox: Path, store: JobStore, log: Callable[[str], None]):
        self.inbox = inbox
        self.store = store
        self.log = log
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="inbox")
        self.finished: set[str] = set()

    def start(self) -> None:
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        while not self.stopping.wait(POLL_SECONDS):
            for directory in sorted(self.inbox.iterdir()):
                if directory.name in self.finished or not JOB_ID.match(directory.name):
                    continue
                if not directory.is_dir() or directory.is_symlink():
                    continue
                if (directory / "done.json").exists() or (directory / "error.json").exists():
                    self.finished.add(directory.name)  # ended before a restart: the client has its answer
                    continue
                try:
                    self._poll_job(directory)
                except (ProtocolError, JobFailed, ParamedicError, ValueError, OSError) as exc:
                    self.log(f"inbox job {directory.name}: {exc}")
                    self.finished.add(directory.name)
                    try:
                        write_durably(directory / "error.json", json.dumps({"message": str(exc)}).encode())
                    except OSError:
                        pass

    def _poll_job(self, directory: Path) -> None:
        opening = directory / "open.json"
        if not opening.exists():
            return
        header = json.loads(_read(opening, MAX_HEADER_BYTES))
        if not isinstance(header, dict) or header.get("job") != directory.name:
            raise ProtocolError("open.json does not name this job")
        job = self.store.open(PEER, header, _read(directory / "setup.bin", MAX_PAYLOAD_BYTES))
        assert job is not None
        for meta in sorted(directory.glob("chunk-*.json")):
            self._take_chunk(job, directory, meta)
        finish = directory / "finish.json"
        if finish.exists():
            done = self.store.finish(job, json.loads(_read(finish, MAX_HEADER_BYTES)))
            if done is not None:
                write_durably(directory / "done.json", json.dumps(done).encode())
                self.finished.add(directory.name)

    def _take_chunk(self, job: SiteJob, directory: Path, meta: Path) -> None:
        header = json.loads(_read(meta, MAX_HEADER_BYTES))
        index = header.get("index") if isinstance(header, dict) else None
        if not isinstance(index, int) or meta.name != f"chunk-{index}.json":
            raise ProtocolError(f"{meta.name}: header does not match its name")
        data = directory / f"chunk-{index}.bin"
        ok = self.store.put_chunk(job, {**header, "op": "chunk"}, _read(data, MAX_PAYLOAD_BYTES))
        meta.unlink()
        data.unlink()
        write_durably(directory / (f"ack-{index}" if ok else f"nack-{index}"), b"")
        if not ok:
            self.log(f"inbox job {job.job_id}: chunk {index} failed its SHA-256 check; asking again")


def _read(path: Path, limit: int) -> bytes:
    if path.is_symlink():
        raise ProtocolError(f"{path.name}: symbolic links are not accepted")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ProtocolError(f"{path.name}: larger than {limit} bytes")
    return data
