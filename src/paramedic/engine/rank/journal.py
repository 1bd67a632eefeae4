"""The journal: a search's finished work, durable beside its output, so that a killed search resumes.

A search killed at any point (every rank SIGKILLed, a node lost, a batch system's time limit) and run
again with the same command continues where it stopped: rank 0 writes each finished task to the journal
before it counts (written whole under a temporary name, then renamed), and a new run replays the journal
into the scheduler and the writer, so only unfinished work is searched again. Only job.json is fsynced:
a record survives the death of every process of the job (the kernel holds it), and after a crash of the
machine itself a record that was lost or cut short is dropped when it does not verify (every record is
tagged) and its task is run again. An fsync per record cost every task a round trip to the disk, on a
cluster's shared filesystem to its server, on the way to the worker's next task. The replayed run's output is the
bytes an uninterrupted run writes: a fragment search's result is its exact merge keys (e-values at full
precision), a piece is BLAST+'s own report bytes, and the plan (query batches, pieces, fragments) is the
journal's, whatever the number of ranks this time.

Layout of `.<out>.journal/` (beside the output; with --site, beside the run record):

    job.json            the header: what the output depends on (program, options, database manifest,
                        queries digest, strategy) and the plan (with its fragment groups: a resumed run
                        keeps them, whatever its workers), the records' key, and `sha256`, the digest of
                        all the rest (canonical JSON): a header made by another search or another
                        paramedic version (its own digest holds) is refused; one that is damaged (does not
                        parse, fails its digest, or its fields do not read) is dropped with the whole
                        journal, and its work done again (see `_header`)
    lock                held (flock) by the run that owns the journal: two runs never share one
    search/B-F          fragment F's result for search batch B (a paramedic.engine.rank.store record, written
                        by the worker that searched when every rank sees the journal, else by rank 0);
                        tagged with the same key as the pieces: one changed or copied in is searched again;
                        F is the plan's group F when fragments are searched in groups
    search/B-F.lists    with traceback once, that search's preliminary lists whole (Store.lists), tagged
                        alike; not made durable: without it a piece scans for its lists
    piece/N             report piece N: a tag, then BLAST+'s bytes (not kept when pieces ship as metadata);
                        the tag is an HMAC-SHA256, keyed by job.json's random `key`, of N and the bytes:
                        a piece changed in any byte, or copied from another search's journal, is dropped
                        and written again (sizes and times are not a digest)
    site-job            with --site: the storage-site job this run opened (a resumed run cancels it
                        and opens a new one, sending what the journal holds again; --restart cancels it
                        too, and starts afresh)
    output.partial      the report being written; renamed to the output when complete

Only this user writes it: the directories are made 0700, and a journal (or its search/, piece/ or
job.json) that another user owns or others can write is dropped at open, its work done again, or refused
(exit 6) when it cannot be removed. With the output in a shared directory, another user could otherwise
plant `.<out>.journal` with a job.json of their own key and records tagged with it (issue 23).

Anything that is not what the layout says (a file or a link where a directory belongs, a directory, a
FIFO or a link where a file belongs) is dropped at open, and its work done again: never followed, never
waited on (a FIFO at `lock` blocked every run).

The journal is removed when the output is complete. A failed or interrupted search keeps it when it holds
finished work (the launcher says so); `--restart` discards it. Journal files are the user's own files,
read back only by the same user's searches: they are still validated, and a record that does not decode
is dropped and its task run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from paramedic.blast.hits import FragmentSearch
from paramedic.durable import write_durably
from paramedic.engine.core.scheduler import Plan, SearchTask
from paramedic.engine.rank.store import LISTS_SUFFIX, RecordError, Store
from paramedic.errors import OutputError, UsageError

if TYPE_CHECKING:  # the master's module when a journal is replayed, not for `journal_path` (a job's checks)
    from paramedic.engine.core.master import Replay

KIND = "paramedic-journal"
PIECE_MAGIC = b"paramedic-piece1"  # then the 32-byte tag, then the piece's bytes
# 2: search records in the store's layout (keys first, alignments per query); 3: the plan's fragment
# groups (a record B-F is then group F's search) and `search/B-F.lists`; 4: job.json carries `sha256`,
# its own digest (a later version that digests it otherwise must name that field otherwise)
VERSION = 4
CHECK_FIELD = "sha256"


# Journals this process refused as another search's (or another paramedic's): their work is not this
# command's to continue, and the refusal said what does; `tidy` does not add "the same command continues".
_REFUSED: set[Path] = set()


def journal_path(output: Path) -> Path:
    """The journal of the search whose output (or, with --site, run record stem) is `output`."""
    return output.with_name(f".{output.name}.journal")


class Journal:
    """One search's journal, owned (locked) by this run. Only rank 0 uses it."""

    def __init__(self, path: Path, lock: IO[bytes]):
        self.path = path
        self.store = Store(path / "search", durable=False)  # tagged records, not fsynced (module doc)
        self._lock = lock
        self.kept_searches = 0
        self.kept_pieces = 0
        self._closed = False
        self.key: bytes | None = None  # job.json's: binds each piece to this journal
        self.volumes: list[list[object]] = []  # the -db volume files' stamps this journal's work read
        # --restart: an earlier run's output at the site is not this run's (the search may have changed)
        self.restarted = False

    # -- opening ------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: Path,
        identity: dict[str, Any],
        plan: Plan,
        restart: bool,
        volumes: Sequence[Sequence[object]] = (),
    ) -> tuple[Journal, Plan, Replay]:
        """Take the journal at `path` (creating it), check it belongs to this search, and return it with
        the plan to follow (the journal's, when it resumes) and what to replay. `volumes`: the -db volume
        files' stamps (paramedic.db.manifest.volume_stamps); a journal written while they were otherwise
        (a volume rewritten, even put back: its ctime moved) holds work done on other bytes, and is
        started afresh."""
        _clear_tomb(path)
        superseded = None
        if restart and path.exists():
            superseded = _superseded_site_job(path)  # read before the journal naming it goes
            _remove_tree(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # a --site job's journal mirrors the remote path
            _own_directory(path)
            _private(path)
            for part in ("search", "piece"):
                _own_directory(path / part)
            lock = _open_lock(path)
        except OSError as exc:
            raise OutputError(f"cannot keep the search's journal {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            raise UsageError(
                f"another search is writing this output now (its journal {path} is in use)"
            ) from exc
        journal = cls(path, lock)
        journal.volumes = [list(v) for v in volumes]
        try:
            _scrub(path)
            plan = journal._agree(identity, plan)
            assert journal.key is not None  # its search records are bound to it, like its pieces
            journal.restarted = restart
            if superseded is not None:  # cancelled as a plain rerun cancels it (sinks.open_shipping)
                journal.note_site_job(superseded)
            journal.store = dataclasses.replace(journal.store, key=journal.key)
            replay = journal._replay(plan)
        except BaseException as exc:
            journal._unlock()
            if isinstance(exc, UsageError):
                _REFUSED.add(path.absolute())
            raise
        return journal, plan, replay

    def _agree(self, identity: dict[str, Any], plan: Plan) -> Plan:
        """The journal's plan if it was made by this same search; a new journal otherwise."""
        job_file = self.path / "job.json"
        if not job_file.exists():
            key = secrets.token_bytes(32)
            self._write(
                job_file,
                _header_bytes(
                    {
                        "kind": KIND,
                        "version": VERSION,
                        "identity": identity,
                        "plan": _plan_json(plan),
                        "key": key.hex(),
                        "volumes": self.volumes,
                    }
                ),
            )
            self.key = key
            return plan
        header = f"journal header {self.path.name}/job.json dropped"
        try:
            data = _header(job_file)
        except OSError as exc:
            raise OutputError(f"cannot read the search's journal {job_file}: {exc.strerror}") from None
        except _Foreign as exc:
            raise UsageError(
                f"the journal {self.path} {exc}: add --restart to discard it and start afresh"
            ) from None
        except _Damaged as exc:
            return self._begin_again(f"{header} (damaged: {exc})", identity, plan)
        # The header parsed, is this version's and its digest holds, so it is the one a paramedic wrote:
        # fields that still do not read (a missing plan, a key that is not one) were written so by a
        # paramedic with a bug, or by hand. No command can continue such a journal (the next run of the
        # same command would meet them again), so refusing it would only make the user add --restart for
        # the same outcome: it is dropped as a damaged header is, and its work done again.
        try:
            stored = data["identity"]
            if not isinstance(stored, dict):
                raise TypeError(f"identity is a {type(stored).__name__}")
            journaled = _plan_from_json(data["plan"])
            key = data["key"]
            if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
                raise ValueError("its key is not 32 bytes in hex")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
            # (OverflowError: a plan's range longer than a size, len() refuses it: found by bench/fuzz.py)
            why = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            return self._begin_again(f"{header} (damaged: its fields do not read: {why})", identity, plan)
        if stored != identity:
            differs = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
            raise UsageError(
                f"the journal {self.path} is from another search (different {', '.join(differs)}): run the "
                "same command as before to continue it, or add --restart to discard it and start afresh"
            )
        if journaled.n_queries != plan.n_queries or journaled.database_fragments != plan.database_fragments:
            raise UsageError(
                f"the journal {self.path} does not fit this search; add --restart to start afresh"
            )
        if data.get("volumes") != self.volumes:
            return self._begin_again(
                "the database's files changed since this journal was written (a volume rewritten or "
                "replaced)",
                identity,
                plan,
            )
        self.key = bytes.fromhex(key)
        return journaled

    def _begin_again(self, why: str, identity: dict[str, Any], plan: Plan) -> Plan:
        """Drop every record (each is bound to the header's key, or was done on other bytes) and the
        header: one line says why, and the search's work is done again in a new journal."""
        _warn(f"{why}: its finished work is done again")
        for part in ("search", "piece"):
            _remove_tree(self.path / part)
            (self.path / part).mkdir(mode=0o700)
        for name in ("output.partial", "site-job"):
            (self.path / name).unlink(missing_ok=True)
        (self.path / "job.json").unlink(missing_ok=True)
        return self._agree(identity, plan)  # a new journal

    def _replay(self, plan: Plan) -> Replay:
        from paramedic.engine.core.master import Replay

        searches = []
        for name in sorted(os.listdir(self.path / "search")):
            if name.endswith(LISTS_SUFFIX) and _search_task(name.removesuffix(LISTS_SUFFIX), plan):
                continue  # a search's whole lists (Store.lists), kept with it
            task = _search_task(name, plan)
            if task is None:
                (self.path / "search" / name).unlink(missing_ok=True)  # a temporary file or junk
            else:
                searches.append(task)
        pieces = []
        for name in sorted(os.listdir(self.path / "piece")):
            path = self.path / "piece" / name
            if name.isdigit() and int(name) < len(plan.pieces) and str(int(name)) == name:
                problem = self._piece_problem(int(name))
                if problem is None:
                    pieces.append(int(name))
                    continue
                _warn(f"journal piece {name} dropped ({problem}): writing it again")
            path.unlink(missing_ok=True)
        searches.sort(key=lambda t: (t.batch, t.fragment))
        return Replay(tuple(searches), tuple(sorted(pieces)))

    # -- reading back -------------------------------------------------------------------------------
    def load_search(self, task: SearchTask, queries: int, alignments: bool) -> FragmentSearch | None:
        """A journaled fragment search (its keys; with `alignments`, its alignments too), or None when its
        record does not decode (it is run again)."""
        try:
            result = self.store.keys(task.batch, task.fragment, queries, alignments)
        except RecordError as exc:
            path = self.store.record(task.batch, task.fragment)
            _warn(f"journal record {path.name} dropped ({exc}): searching it again")
            path.unlink(missing_ok=True)
            return None
        self.kept_searches += 1
        return result

    def load_piece(self, index: int) -> bytes | None:
        """A piece the replay found good, its tag checked again (it is read once more here)."""
        try:
            data = self._read_piece(index)
        except (OSError, ValueError) as exc:
            raise OutputError(
                f"the journal {self.path} changed while this search ran (piece {index}: {exc}); run the "
                "same command again"
            ) from None
        self.kept_pieces += 1
        return data

    def _piece_tag(self, index: int, data: bytes) -> bytes:
        assert self.key is not None
        mac = hmac.new(self.key, f"piece/{index}\0".encode(), hashlib.sha256)
        mac.update(data)
        return mac.digest()

    def _read_piece(self, index: int) -> bytes:
        """The piece's bytes, or ValueError when its tag does not match them (OSError: unreadable)."""
        raw = (self.path / "piece" / str(index)).read_bytes()
        head = len(PIECE_MAGIC) + 32
        if len(raw) < head or not raw.startswith(PIECE_MAGIC):
            raise ValueError("not a journal piece")
        data = raw[head:]
        if not hmac.compare_digest(raw[len(PIECE_MAGIC) : head], self._piece_tag(index, data)):
            raise ValueError("its bytes are not those this search wrote")
        return data

    def _piece_problem(self, index: int) -> str | None:
        try:
            self._read_piece(index)
        except OSError as exc:
            return exc.strerror or str(exc)
        except ValueError as exc:
            return str(exc)
        return None

    # -- recording ----------------------------------------------------------------------------------
    def search_done(self, task: SearchTask, result: FragmentSearch) -> None:
        """A search whose worker could not write its record here (it does not see the journal)."""
        self.store.put(task.batch, task.fragment, result)

    def piece_done(self, index: int, data: bytes) -> None:
        data = PIECE_MAGIC + self._piece_tag(index, data) + data
        self._write(self.path / "piece" / str(index), data, sync=False)

    def earlier_site_job(self) -> str | None:
        """The storage-site job an earlier run of this search opened (to be cancelled, or asked whether
        it published the output), if any: only a record this journal wrote (its tag checked), so that a
        record naming another job never makes a run say the site holds its output."""
        try:
            text = (self.path / "site-job").read_text()
        except (OSError, ValueError):
            return None
        job_id, _, tag = text.strip().partition(" ")
        if job_id and hmac.compare_digest(tag.encode(), self._site_job_tag(job_id).encode()):
            return job_id
        _warn("journal record site-job dropped (not a job this search opened)")
        (self.path / "site-job").unlink(missing_ok=True)
        return None

    def note_site_job(self, job_id: str) -> None:
        self._write(self.path / "site-job", f"{job_id} {self._site_job_tag(job_id)}".encode())

    def _site_job_tag(self, job_id: str) -> str:
        assert self.key is not None
        return _site_job_tag(self.key, job_id)

    @property
    def partial_output(self) -> Path:
        return self.path / "output.partial"

    def close(self, complete: bool) -> bool:
        """End this run's use of the journal: removed when the output is complete or nothing finished
        is in it; otherwise kept for the next run. Returns whether it was kept."""
        if self._closed:
            return False
        self._closed = True
        keep = not complete and self._holds_work()
        tomb = _remove_tree(self.path) if not keep else None
        self._unlock()
        if tomb is not None:  # sshfs (and NFS) hide the open lock file when it is deleted, drop it only now
            shutil.rmtree(tomb, ignore_errors=True)
        return keep

    def _holds_work(self) -> bool:
        return any(any(True for _ in _names(self.path / d)) for d in ("search", "piece"))

    def _write(self, path: Path, data: bytes, sync: bool = True) -> None:
        """Whole before it counts (a temporary name, renamed into place); `sync`: also fsynced, with its
        directory (job.json)."""
        try:
            write_durably(path, data, sync=sync)
        except OSError as exc:
            raise OutputError(f"cannot write the search's journal {self.path}: {exc.strerror}") from exc

    def _unlock(self) -> None:
        try:
            self._lock.close()  # releases the flock
        except OSError:
            pass


def tidy(path: Path) -> bool:
    """After a run that ended without closing its journal (a rank killed): drop its partial output, and
    the whole journal if it holds no finished work. Returns whether finished work is kept. A journal that
    another run holds now is left alone, and so is one this process refused as another search's."""
    if path.absolute() in _REFUSED:
        return False
    _clear_tomb(path)
    try:
        lock = _open_lock(path)
    except OSError:
        return False
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        with contextlib.suppress(OSError):
            _scrub(path)  # (a job.json that is not a file goes: the next run begins a new journal)
            _remove_entry(path / "output.partial")
        if not _readable(path / "job.json"):  # refused as unreadable: only --restart goes on from it
            return False
        journal = Journal(path, lock)
        journal._closed = True
        if journal._holds_work():
            return True
        _remove_tree(path)
        return False


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, found {type(value).__name__}")
    return value


def _plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "batches": [[r.start, r.stop] for r in plan.batches],
        "pieces": [[r.start, r.stop] for r in plan.pieces],
        "n_fragments": plan.n_fragments,
        "hitlist_size": plan.hitlist_size,
        "query_segmentation": plan.query_segmentation,
        "search_filled_again": plan.search_filled_again,
        "traceback_once": plan.traceback_once,
        "groups": [list(g) for g in plan.groups],
    }


def _plan_from_json(data: dict[str, Any]) -> Plan:
    return Plan(
        batches=tuple(range(_int(a), _int(b)) for a, b in data["batches"]),
        n_fragments=_int(data["n_fragments"]),
        pieces=tuple(range(_int(a), _int(b)) for a, b in data["pieces"]),
        hitlist_size=_int(data["hitlist_size"]),
        query_segmentation=bool(data["query_segmentation"]),
        search_filled_again=bool(data["search_filled_again"]),
        traceback_once=bool(data.get("traceback_once", False)),
        groups=tuple(tuple(_int(f) for f in g) for g in data.get("groups", [])),
    )


def _search_task(name: str, plan: Plan) -> SearchTask | None:
    batch, _, fragment = name.partition("-")
    if not (batch.isdigit() and fragment.isdigit()):
        return None
    task = SearchTask(int(batch), int(fragment))
    if task.batch >= len(plan.batches) or task.fragment >= plan.n_fragments or plan.query_segmentation:
        return None
    return task


def _names(directory: Path) -> Iterator[str]:
    try:
        yield from (n for n in os.listdir(directory) if not n.startswith("."))
    except OSError:
        return


def _own_directory(path: Path) -> None:
    """A directory of the journal's own: anything else at its name (a file, a link) is junk in the
    journal, dropped as a bad record is (it failed every run, exit 6, before)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        _warn(f"journal entry {path.name} dropped (not a directory): its work is done again")
        path.unlink()
    path.mkdir(mode=0o700, exist_ok=True)


def _private(path: Path) -> None:
    """The journal is read back as this user's own finished work, so only this user may have written it
    (as ssh treats ~/.ssh). With the output in a shared directory (/tmp, a group's project directory),
    another user could plant `.<out>.journal` with a job.json of their own key and records tagged with it:
    the search resumed from it and wrote their bytes, exit 0. A journal, or a part of it, that another user
    owns is refused (it cannot be removed in a sticky directory); one of this user's own that others can
    write is dropped and begun again. Directories are made 0700."""
    parts = [path, path / "search", path / "piece", path / "job.json"]
    mine = _owner_of_new_files(path.parent)
    for attempt in range(2):
        foreign = writable = None
        for part in parts:
            try:
                st = os.lstat(part)
            except FileNotFoundError:
                continue
            if st.st_uid != mine:
                foreign = foreign or (part, st.st_uid)
            elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode):
                writable = writable or part
        if foreign is None and writable is None:
            return
        if attempt == 0:
            if foreign is not None:
                reason = f"{foreign[0].relative_to(path.parent)} is owned by another user (uid {foreign[1]})"
            else:
                assert writable is not None
                reason = f"others can write {writable.relative_to(path.parent)}"
            _warn(
                f"journal {path.name} dropped ({reason}: its records cannot be trusted): its work is done again"
            )
            _remove_tree(path)
            _own_directory(path)
    assert foreign is not None or writable is not None
    what, uid = foreign if foreign is not None else (writable, None)
    raise OutputError(
        f"the journal {path} cannot be trusted and cannot be removed ({what} is "
        + (f"owned by another user, uid {uid}" if uid is not None else "writable by others")
        + "): remove it, or write the output to a directory of your own"
    )


def _owner_of_new_files(directory: Path) -> int:
    """The owner a file made here by this process gets: this user, but on a filesystem that maps users
    (NFS with root squashed, some FUSE mounts) the one it maps this user to, so that a journal this
    user made there is not taken for another user's."""
    try:
        fd, name = tempfile.mkstemp(prefix=".paramedic-owner-", dir=directory)
    except OSError:
        return os.geteuid()
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


class _Damaged(ValueError):
    """A job.json that holds nothing usable: dropped, the journal begun again."""


class _Foreign(ValueError):
    """A job.json whose own digest holds (or that has none) made by another paramedic, or not a journal
    header at all: refused, the user says (--restart) whether to discard it."""


def _digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _header_bytes(fields: dict[str, Any]) -> bytes:
    return json.dumps({**fields, CHECK_FIELD: _digest(fields)}).encode()


def _header(job_file: Path) -> dict[str, Any]:
    """job.json's fields, its digest checked; _Damaged or _Foreign (OSError: it cannot be read).

    A header that does not parse, or whose `sha256` does not match the rest, was cut short or changed
    after it was written (a bit flipped on the disk, a copy cut short by a full disk): it holds nothing
    usable by any command, and is dropped (before, it was refused on every run, "add --restart", or,
    when the flipped header still parsed, said to be "from another search", blaming the user's options).
    One whose digest holds (or that has none: an older paramedic's, versions 1-3) but that names another
    kind or version was made by another paramedic: refused, as that paramedic may continue it. A flip in
    `kind` or `version` of this version's header fails its digest, so it is not taken for another
    version's."""
    raw = job_file.read_bytes()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _Damaged(f"does not parse: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise _Damaged(f"a JSON {type(data).__name__}, not an object")
    check = data.pop(CHECK_FIELD, None)
    try:
        digest = _digest(data)
    except RecursionError:  # nested deeper than json.dumps goes: no header paramedic writes
        raise _Damaged("nested too deep") from None
    if check is not None and check != digest:
        raise _Damaged("its bytes do not match its own digest")
    kind, version = data.get("kind"), data.get("version")
    if kind != KIND:
        raise _Foreign("is not a paramedic journal (its job.json is not a journal header)")
    if version != VERSION:
        raise _Foreign(
            f"was made by another paramedic version (journal version {_one_line(version)[:20]}; this "
            f"paramedic reads version {VERSION})"
        )
    if check is None:
        raise _Damaged(f"no {CHECK_FIELD}, which every version {VERSION} header has")
    return data


def _one_line(value: object) -> str:
    return " ".join(str(value).split())[:200]


def _readable(job_file: Path) -> bool:
    """A job.json this paramedic continues from (else the run said to add --restart, or that its work
    is done again, and saying that the same command continues would contradict it); no job.json at all
    is a journal just begun. A damaged one is left for the next run, which drops it and says so."""
    if not job_file.exists():
        return True
    try:
        if not job_file.is_file() or job_file.stat().st_size > 64 << 20:
            return False
        _header(job_file)
    except (OSError, ValueError):
        return False
    return True


def _open_lock(path: Path) -> IO[bytes]:
    """The journal's lock file; anything else at its name (a directory, a FIFO, which blocked the open
    for ever, a link) is removed first: it failed every run."""
    lock = path / "lock"
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        _warn("journal entry lock replaced (not a file)")
        _remove_entry(lock)
    return open(
        os.open(lock, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600), "ab"
    )


def _scrub(path: Path) -> None:
    """Drop what is not a regular file where the journal keeps files (job.json, output.partial, site-job,
    each record in search/ and piece/): a directory or a FIFO there was exit 1 or a hang on every run. A
    record dropped is searched or written again; a job.json dropped makes the journal new (its records,
    tagged with the old key, are then dropped too)."""
    entries = [path / name for name in ("job.json", "output.partial", "site-job")]
    for part in ("search", "piece"):
        entries += [path / part / name for name in os.listdir(path / part)]
    for entry in entries:
        if entry.is_symlink() or (entry.exists() and not entry.is_file()):
            _warn(f"journal entry {entry.relative_to(path)} dropped (not a file): its work is done again")
            _remove_entry(entry)


def _remove_entry(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _site_job_tag(key: bytes, job_id: str) -> str:
    return hmac.new(key, f"site-job\0{job_id}".encode(), hashlib.sha256).hexdigest()


def _superseded_site_job(path: Path) -> str | None:
    """The storage-site job named by a journal that --restart discards, so that the new run cancels it
    as a plain rerun does (the killed run's job holds the output path at the site, which refused the new
    job for up to an hour: issue 41, item 7). Only from a journal of this user's that others cannot write,
    its record's tag checked with that journal's own key, as `Journal.earlier_site_job` checks it; None
    otherwise (the job then expires at the site)."""
    try:
        for part, kind in (
            (path, stat.S_ISDIR),
            (path / "job.json", stat.S_ISREG),
            (path / "site-job", stat.S_ISREG),
        ):
            info = part.lstat()
            if not kind(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                return None
        key = bytes.fromhex(str(_header(path / "job.json")["key"]))
        with (path / "site-job").open("rb") as fh:
            job_id, _, tag = fh.read(4096).decode().strip().partition(" ")
    except (OSError, ValueError, KeyError, _Damaged, _Foreign):
        return None
    if len(key) == 32 and job_id and hmac.compare_digest(tag.encode(), _site_job_tag(key, job_id).encode()):
        return job_id
    return None


def _remove_tree(path: Path) -> Path:
    """Gone from its name at once (renamed to its tomb beside it, atomically), then removed: a run killed
    while removing a finished journal left half of it, without its site-job record, and every run again
    began a new site job the site refused ("a file is already there"). A tomb a kill left is cleared by
    the next open, or before the next rename. Returns where the tree was removed (the tomb, or `path`
    when it cannot be renamed)."""
    _clear_tomb(path)
    tomb = _tomb(path)
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return path
    except OSError:
        tomb = path
    shutil.rmtree(tomb, ignore_errors=True)
    return tomb


def _tomb(path: Path) -> Path:
    return path.with_name(path.name + ".gone")


def _clear_tomb(path: Path) -> None:
    """Remove what a kill left of a journal removed at `path` (_remove_tree): one name, no listing."""
    tomb = _tomb(path)
    if os.path.lexists(tomb):
        with contextlib.suppress(OSError):  # one that stays is removed in place instead (_remove_tree)
            _remove_entry(tomb)


def _warn(text: str) -> None:
    print(f"paramedic: {text}", file=sys.stderr, flush=True)
