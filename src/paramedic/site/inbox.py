"""`paramedic serve --inbox DIR`: take jobs from a shared directory as well as over TLS (a receiver plugin,
`site.receivers`, registered at the end of this module).

The inbox's protocol is described in `ship.inbox_client`. Everything read from the inbox is as untrusted
as network input: names are checked, files are read only when they are regular files (no symbolic link,
no FIFO, bounded size, through a descriptor of the job's directory), JSON is bounded in size and depth,
and the same JobStore checks every chunk's SHA-256 and every path. Whatever a job's files hold, the worst
outcome is that job's failure (error.json): the watcher itself never stops.

What the inbox trusts:

* with `--keys` (the site's keys from `paramedic keys`): nothing but signatures. A job must be signed by a
  compute site's certificate from the site's CA (`ship.signing`); it belongs to "inbox:<name>" and no one
  else can add to it, finish it or cancel it; every reply the site writes is signed, and the compute side
  accepts only signed replies. Someone who can write the directory can still delete or withhold files
  (the job then fails or times out: a denial of service, never a forged result) and read the queries.
* without `--keys`: the shared file system's permissions, and nothing else. Anyone who can write the
  directory can submit jobs (owned by "inbox", a name no TLS client can take), add to or cancel any inbox
  job, and forge the site's replies to the compute site.

The watcher looks into a job's directory only when it changed (its mtime), when it waits for the job's
final file, or every RESCAN_SECONDS; so thousands of idle or junk directories cost little. Finished job
directories, and directories that stayed idle for `keep_seconds`, are removed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paramedic.errors import ParamedicError
from paramedic.ship.inbox_dirs import GONE, remove_job_directory
from paramedic.ship.wire import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, ProtocolError, field_int, loads_json
from paramedic.site.jobs import JOB_ID, JobFailed, SiteJob
from paramedic.site.receivers import Receiver, SiteContext, register_receiver
from paramedic.site.store import DEFAULT_OPEN_IDLE_SECONDS, JobStore

PEER = "inbox"  # the owner of unsigned inbox jobs; TLS clients are "tls:<name>", signed inbox jobs "inbox:<name>"
POLL_SECONDS = 0.2
RESCAN_SECONDS = 5.0
YOUNG_SECONDS = 10.0  # a directory this new is looked at every YOUNG_POLL_SECONDS (its open.json comes soon)
YOUNG_POLL_SECONDS = 1.0
CHUNK_META = re.compile(r"^chunk-(\d{1,7})\.json$")


class InboxWatcher:
    def __init__(
        self,
        inbox: Path,
        store: JobStore,
        log: Callable[[str], None],
        keys: Path | None = None,
        keep_seconds: float = DEFAULT_OPEN_IDLE_SECONDS,
    ):
        self.inbox = inbox
        self.store = store
        self.log = log
        self.keep_seconds = keep_seconds
        self.signer = None
        if keys is not None:
            from paramedic.ship.signing import Signer

            self.signer = Signer(keys)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="inbox")
        self.names: set[str] = set()  # job directories in the inbox (at its last listing)
        self.listed: tuple[int, float] = (0, 0.0)  # the inbox's mtime then, and when
        self.seen: dict[str, int] = {}  # job directory -> its mtime_ns when last looked into
        self.next_look: dict[str, float] = {}  # when to stat it next
        self.looked: dict[str, float] = {}  # when last looked into
        self.waiting: set[str] = set()  # finish asked, the file not ready yet: looked into every round
        self.finished: set[str] = set()
        self.progress: dict[str, Any] = {}

    def start(self) -> None:
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        while not self.stopping.wait(POLL_SECONDS):
            try:
                self.scan()
            except Exception as exc:  # the inbox itself unreadable, or a bug: log, keep watching
                self.log(f"inbox {self.inbox}: {type(exc).__name__}: {exc}")

    def scan(self) -> None:
        """One round: list the inbox when it changed; look into job directories that changed, those that
        wait for their final file, new ones; anything else only every RESCAN_SECONDS."""
        now = time.time()
        info = os.stat(self.inbox)
        if (info.st_mtime_ns, True) != (self.listed[0], now - self.listed[1] < RESCAN_SECONDS):
            self._relist(info.st_mtime_ns, now)
        for name in list(self.names):
            if name in self.waiting or now >= self.next_look.get(name, 0.0):
                self._visit(name, now)

    def _relist(self, mtime_ns: int, now: float) -> None:
        """The inbox's job directories listed again; what was known of those gone is dropped."""
        listing = os.listdir(self.inbox)
        self.names = {n for n in listing if JOB_ID.match(n)}
        for gone in filter(GONE.match, listing):  # a remover stopped between its rename and delete
            self._remove_left(gone, now)
        self.listed = (mtime_ns, now)
        for table in (self.seen, self.progress, self.next_look, self.looked):
            for name in [n for n in table if n not in self.names]:
                del table[name]
        self.waiting &= self.names
        self.finished &= self.names
        for name in self.finished:  # the listing changed: one of them may be a new directory already
            self.next_look[name] = 0.0

    def _visit(self, name: str, now: float) -> None:
        """One job directory, due for a look: removed once idle past `keep_seconds` (answered, abandoned,
        or junk), looked into when it changed (its mtime) or every RESCAN_SECONDS."""
        try:
            info = os.stat(self.inbox / name, follow_symlinks=False)
        except OSError:
            return
        idle = now - info.st_mtime
        self.next_look[name] = now + (YOUNG_POLL_SECONDS if idle < YOUNG_SECONDS else RESCAN_SECONDS)
        if not stat.S_ISDIR(info.st_mode):
            return
        if name in self.finished:
            if self._replied(name):
                if idle > self.keep_seconds:
                    self._remove(name)
                return
            self._forget(name)  # the same job id again at once: a new directory, not the finished one
        last = self.seen.get(name)
        changed = name in self.waiting or last is None or last != info.st_mtime_ns
        if not changed:
            if idle > self.keep_seconds:
                self._remove(name)  # abandoned, or junk that never became a job
                return
            if now - self.looked.get(name, 0.0) < RESCAN_SECONDS:
                return  # unchanged: its mtime tells when something arrives
        self.seen[name] = info.st_mtime_ns
        self.looked[name] = now
        if self._look_into(name, changed):
            self.next_look[name] = now  # a job in progress: stat it every round, its files come often

    def _remove_left(self, gone: str, now: float) -> None:
        """A directory renamed out of the job-name pattern to be deleted (`ship.inbox_dirs`), once it has
        been idle for YOUNG_SECONDS: its remover was stopped between the rename and the delete."""
        try:
            idle = now - os.stat(self.inbox / gone, follow_symlinks=False).st_mtime
        except OSError:
            return
        if idle > YOUNG_SECONDS:
            remove_job_directory(self.inbox / gone)

    def _replied(self, name: str) -> bool:
        """Whether the job directory holds the site's answer (done.json or error.json). A finished job's
        directory keeps it until it is removed, and removers rename it away first (`ship.inbox_dirs`): so
        a directory under a finished job's name without one is a new directory (`paramedic ship` run again
        at once, its job id the same), never the finished one half-removed. Its inode number and times
        cannot tell that: a new directory may reuse both."""
        try:
            dfd = os.open(self.inbox / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return True  # gone, or not a directory: nothing new to look into
        try:
            return _exists(dfd, "done.json") or _exists(dfd, "error.json")
        finally:
            os.close(dfd)

    def _forget(self, name: str) -> None:
        """Drop what the watcher knew of a job directory: the next look treats it as new."""
        self.seen.pop(name, None)
        self.looked.pop(name, None)
        self.progress.pop(name, None)
        self.finished.discard(name)
        self.waiting.discard(name)

    def _remove(self, name: str) -> None:
        remove_job_directory(self.inbox / name)  # renamed away first; never follows a symbolic link
        self.names.discard(name)
        self._forget(name)

    def _look_into(self, name: str, changed: bool = True) -> bool:
        """Take what a job's directory holds; True while it is a job in progress."""
        try:
            dfd = os.open(self.inbox / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if _exists(dfd, "done.json") or _exists(dfd, "error.json"):
                self.finished.add(name)  # ended before a restart: the client has its answer
                return False
            try:
                return self._poll_job(name, dfd, changed)
            except (ProtocolError, JobFailed, ParamedicError, ValueError, OSError) as exc:
                message = str(exc) if not isinstance(exc, OSError) or not exc.strerror else exc.strerror
            except Exception as exc:  # a bug: this job fails, the watcher goes on
                message = f"internal error: {type(exc).__name__}: {exc}"
            self.log(f"inbox job {name}: {message}")
            self.finished.add(name)
            self.waiting.discard(name)
            try:
                _write(dfd, "error.json", self._reply(name, "error", {"message": message}))
            except OSError:
                pass
            return False
        finally:
            os.close(dfd)

    # -- one job --------------------------------------------------------------------------------------
    def _body(self, name: str, data: bytes, kind: str, what: str) -> tuple[dict[str, Any], str]:
        """A file's content (its signed body with keys) and the job's owner."""
        if self.signer is None:
            body = loads_json(data, what)
            if not isinstance(body, dict):
                raise ProtocolError(f"{what}: not a JSON object")
            if "sig" in body and "cert" in body:
                raise ProtocolError(f"{what}: signed, but this site has no keys for its inbox (serve --keys)")
            return body, PEER
        from paramedic.ship.signing import CLIENT

        body, signer = self.signer.open_envelope(data, CLIENT, what)
        if body.get("kind") != kind or body.get("job") != name:
            raise ProtocolError(f"{what}: signed for another file or job")
        return body, f"{PEER}:{signer}"

    def _poll_job(self, name: str, dfd: int, changed: bool = True) -> bool:
        """Take what the job's directory holds. A look without a change (a periodic rescan) does not count
        as a request: an inbox job whose compute site went silent expires like any other."""
        opening = _read(dfd, "open.json", MAX_HEADER_BYTES)
        if opening is None:
            return False
        header, owner = self._body(name, opening, "open", "open.json")
        if header.get("job") != name:
            raise ProtocolError("open.json does not name this job")
        setup = _read(dfd, "setup.bin", MAX_PAYLOAD_BYTES)
        if setup is None:
            raise ProtocolError("setup.bin is missing")
        if self.signer is not None and header.get("setup_sha256") != hashlib.sha256(setup).hexdigest():
            raise ProtocolError("setup.bin differs from the signed open.json")
        known = self.store.jobs.get(name)
        touched = known.touched if known is not None else None
        job = self.store.open(
            owner, {"job": name, "codec": header.get("codec"), "setup": header.get("setup")}, setup
        )
        assert job is not None
        if not changed and touched is not None:
            job.touched = touched
        cancel = _read(dfd, "cancel.json", MAX_HEADER_BYTES)
        if cancel is not None:
            self._body(name, cancel, "cancel", "cancel.json")
            self.store.cancel(job)
            self.log(f"inbox job {name}: cancelled by the compute site")
            self._remove(name)  # nobody waits for an answer
            return False
        for meta in sorted(os.listdir(dfd)):
            match = CHUNK_META.match(meta)
            if match:
                self._take_chunk(name, dfd, job, int(match.group(1)))
        finish = _read(dfd, "finish.json", MAX_HEADER_BYTES)
        if finish is None:
            return True
        body, _ = self._body(name, finish, "finish", "finish.json")
        done = self.store.finish(job, body)
        if done is None:
            self.waiting.add(name)
            progress = {"decoded": len(job.decoded), "running": job.running}
            if self.progress.get(name) != progress:
                self.progress[name] = progress
                _write(dfd, "progress.json", json.dumps(progress).encode())
            return True
        _write(dfd, "done.json", self._reply(name, "done", done))
        self.finished.add(name)
        self.waiting.discard(name)
        return False

    def _take_chunk(self, name: str, dfd: int, job: SiteJob, index: int) -> None:
        meta = f"chunk-{index}.json"
        data = _read(dfd, meta, MAX_HEADER_BYTES)
        if data is None:
            return
        header, _ = self._body(name, data, "chunk", meta)
        if field_int(header, "index", 0) != index:
            raise ProtocolError(f"{meta}: header does not match its name")
        payload = _read(dfd, f"chunk-{index}.bin", MAX_PAYLOAD_BYTES)
        if payload is None:
            raise ProtocolError(f"chunk-{index}.bin is missing")
        chunk = {k: v for k, v in header.items() if k not in ("kind", "job")}
        ok = self.store.put_chunk(job, {**chunk, "op": "chunk"}, payload)
        for path in (meta, f"chunk-{index}.bin"):
            os.unlink(path, dir_fd=dfd)
        kind = "ack" if ok else "nack"
        _write(dfd, f"{kind}-{index}", self._reply(name, kind, {"index": index}, empty_unsigned=True))
        if not ok:
            self.log(f"inbox job {job.job_id}: chunk {index} failed its SHA-256 check; asking again")

    def _reply(self, name: str, kind: str, fields: dict[str, Any], empty_unsigned: bool = False) -> bytes:
        if self.signer is None:
            return b"" if empty_unsigned else json.dumps(fields).encode()
        return self.signer.envelope({**fields, "kind": kind, "job": name})


def _exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _read(dfd: int, name: str, limit: int) -> bytes | None:
    """A regular file's bytes (at most `limit`), None when absent; never follows a link or waits on a FIFO."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProtocolError(f"{name}: symbolic links are not accepted") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProtocolError(f"{name}: not a regular file")
        parts = []
        size = 0
        while block := os.read(fd, min(1 << 20, limit + 1 - size)):
            parts.append(block)
            size += len(block)
            if size > limit:
                raise ProtocolError(f"{name}: larger than {limit} bytes")
        return b"".join(parts)
    finally:
        os.close(fd)


def _write(dfd: int, name: str, data: bytes) -> None:
    """A reply file, whole or not at all (temporary name, fsync, rename), inside the job's directory only."""
    tmp = f".{name}.tmp"
    try:
        os.unlink(tmp, dir_fd=dfd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _start(inbox: Path, site: SiteContext) -> InboxWatcher:
    watcher = InboxWatcher(inbox, site.store, site.log, site.keys, site.open_idle_seconds)
    watcher.start()
    return watcher


def _describe(inbox: Path, keys: Path | None) -> str:
    signed = "signed jobs only" if keys is not None else "unsigned: trusts whoever can write it"
    return f"watching inbox {inbox} ({signed})"


register_receiver(
    Receiver(
        name="inbox",
        metavar="DIR",
        help="also take jobs from this shared directory (--site file:///DIR at the compute site); with "
        "--keys only jobs signed by a compute site's certificate from the site's CA",
        parse=Path,
        describe=_describe,
        start=_start,
    )
)
