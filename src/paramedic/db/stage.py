"""The node-local cache of fragment volumes (`paramedic search --stage DIR`), as mpiBLAST's Local storage.

A worker searches a fragment from a copy on its node's own disk instead of shared storage: the first
worker on a node that needs a fragment copies it (through `ReplicaSet.fetch_volume`, which verifies the
bytes against the manifest's SHA-256), later searches and later runs of the same database use the copy.

Layout, one entry per database identity (the manifest checksum), one directory per fragment volume:

    DIR/.lock                          the cache's lock: held while space is counted, reserved, evicted
    DIR/<checksum[:32]>/f003/          a published copy: f003.* (the volume) + frag003.pal (its alias,
                                       written from the manifest) + .seal (sizes, mtimes, ctimes, inodes)
    DIR/<checksum[:32]>/f003.lock      the volume's lock (never removed): shared while a search reads the
                                       copy, exclusive while it is copied, discarded or evicted
    DIR/<checksum[:32]>/.fill-f003-<bytes>-<token>/   a copy under way (its size is reserved)

A database searched in place (paramedic.db.units) is copied by user volume, `v00003/` (its own files,
under their own names), and a version-5 database's shared files once, `s000/` (.pdb, .pos, ...), which
each volume's directory links (`db.pdb -> ../s000/db.pdb`); a search holds both units' locks, so the
shared files are never evicted under it, and a volume whose shared files were evicted is kept and linked
again when they are copied back. Links are sealed as links (their targets included).

Why it is safe:
- Published atomically: files are filled in a `.fill-*` directory inside the entry, fsynced, and the
  directory is renamed into place; a copy killed half-way leaves only a `.fill-*` directory, which the
  next run removes (nobody holds its volume's lock any more: the dead copier's lock went with it).
- Shared: several workers on one node take the volume's lock; one copies (exclusive) while the others
  wait for it and then search the same copy (shared).
- Bounded: with a limit, the bytes of the published copies plus the copies under way stay within it.
  Eviction removes whole volumes, least recently used first (a copy's directory time is its last use),
  and only those it can lock exclusively: never a copy a search on this node is reading. A volume that
  does not fit even then is searched where it lies (`use` gives None), never a failure; so is every
  volume when the cache's disk has no room left for a copy, its lock or its directory (bytes or inodes).
- Checked: bytes are verified against the manifest when copied; before and after every use the files'
  sizes, times (ctime too, which no user sets back) and inodes are compared with the seal written at
  publication, and the first time a process uses a copy its bytes are digested again (sizes and times are
  not a digest); a copy that changed before a use is discarded and copied again, never used; one that
  changed during a use fails the job (DatabaseError): that search read bytes nobody verified.
- Private, as ssh treats ~/.ssh: the directory is created 0700 and refused when another user owns it or
  others can write it (another user could plant a copy, or links at the lock names); locks are opened
  without following links; anything that is not what the layout says (a file where a copy's directory
  belongs, a link) is removed, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from paramedic.blast.alias import alias_bytes, write_alias
from paramedic.blast.programs import alias_suffix
from paramedic.db.manifest import FRAGMENT_DIGESTS, Manifest, volume_sha256
from paramedic.db.units import Unit, check_names, unit_digest
from paramedic.durable import fsync_dir, write_durably
from paramedic.errors import DatabaseError, OutputError, UsageError

SEAL_NAME = ".seal"
_MAX_SEAL = 64 << 10  # a volume's few files, three numbers each: a few hundred bytes
LOCK_NAME = ".lock"
FILL_PREFIX = ".fill-"
EVICT_PREFIX = ".evict-"
_FILL = re.compile(r"^\.fill-(?P<volume>[^-/]+)-(?P<bytes>\d+)-[0-9a-f]+$")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the cache's disk: out of bytes or inodes, or over quota
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.I)


def parse_size(text: str) -> int:
    """'200G', '500M', '1.5T', '4096' (bytes; K, M, G, T, P are powers of 1024) -> bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"--stage-limit {text!r}: give a size such as 500M, 200G or 1.5T")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def check_stageable(manifest: Manifest, where: str) -> None:
    """Staging verifies each copied volume against its digest: databases formatted before the digests
    covered the stored files cannot be staged; a database in place is staged by volume under its own
    file names (paramedic.db.units), so two of its volumes may not share a name."""
    if manifest.in_place:
        check_names(sorted({f.volume for f in manifest.fragments}), where)
        return
    if manifest.tools.get("digests") != FRAGMENT_DIGESTS:
        raise DatabaseError(
            f"{where}: formatted by an older paramedic, whose fragment checksums cannot verify a staged "
            "copy: format it again to use --stage"
        )


@dataclass(frozen=True)
class _Unit:
    """What the cache copies as one directory: a fragment volume, or a database in place's volume or
    shared files (paramedic.db.units); `name` names its directory and lock in the cache entry."""

    name: str
    label: str  # for messages and the run record: the volume's name
    size: Callable[[], int]  # bytes the copy takes (its files, as the source holds them)
    fetch: Callable[[Path], None]  # fill a directory with the unit's verified files
    check: Callable[[Path], bool]  # a published copy's bytes (and links) are the manifest's


class Fetcher(Protocol):
    """What the cache copies through (`paramedic.db.stripes.ReplicaSet`)."""

    def fetch_volume(self, volume: str, sha256: str, dest: Path, max_bytes: int | None = None) -> Any: ...


@dataclass
class StageStats:
    """What this process's cache did (the run record's per-rank `stage`)."""

    hits: int = 0  # searches of a copy already published (by an earlier run, or another worker)
    copies: int = 0  # volumes this process copied
    copied_bytes: int = 0
    copy_seconds: float = 0.0  # fetching, verifying, publishing
    wait_seconds: float = 0.0  # waiting for a lock: another worker's copy, or the cache's lock
    evictions: int = 0  # volumes this process evicted to make room
    evicted_bytes: int = 0
    discarded: int = 0  # published copies that no longer matched their seal: removed, copied again
    cleaned: int = 0  # leftovers of dead copies removed
    in_place: list[str] = field(default_factory=list)  # volumes searched where they lie: did not fit
    write_failures: list[str] = field(default_factory=list)  # copies the cache's disk could not hold

    def as_record(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "copies": self.copies,
            "copied_bytes": self.copied_bytes,
            "copy_seconds": round(self.copy_seconds, 3),
            "wait_seconds": round(self.wait_seconds, 3),
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
            "discarded": self.discarded,
            "cleaned": self.cleaned,
            "in_place": list(self.in_place),
            "write_failures": list(self.write_failures),
        }


class StageCache:
    """A node-local cache directory shared by every process on the node that uses it."""

    def __init__(self, root: Path, limit: int | None = None):
        if limit is not None and limit < 1:
            raise UsageError("--stage-limit must be at least 1 byte")
        self.root = root
        self.limit = limit
        self.stats = StageStats()
        self.verified: set[Path] = set()  # copies this process digested (once per job per worker)
        self.full: str | None = None  # the cache's disk could not even hold its lock: every volume in place
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                root.mkdir(mode=0o700)
            _check_private(root)
            os.close(_open_lock(root / LOCK_NAME))
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise OutputError(f"--stage {root}: cannot use it ({exc.strerror})") from exc
            self.full = exc.strerror or str(exc)
        if self.full is None and not os.access(root, os.W_OK | os.X_OK):
            raise OutputError(f"--stage {root}: not writable")

    def entry(self, manifest: Manifest) -> Path:
        return self.root / manifest.checksum()[:32]

    def staged(self, manifest: Manifest) -> list[int]:
        """The fragments of this database published here (what a worker tells its master at start)."""
        entry = self.entry(manifest)
        return [i for i, f in enumerate(manifest.fragments) if (entry / f.volume).is_dir()]

    @contextlib.contextmanager
    def use(
        self, manifest: Manifest, fragment: int, source: Path, replicas: Callable[[], Fetcher]
    ) -> Iterator[Path | None]:
        """The directory of a verified local copy of fragment `fragment` (its alias is the fragment's
        `name` in it), held shared for the `with` block; None: it does not fit, search it in `source`.

        `source`: the database directory (sizes the copy); `replicas()`: where to copy from, opened on
        the first copy only. DatabaseError when no replica serves the volume verified."""
        info = manifest.fragments[fragment]

        def fetch(fill: Path) -> None:
            replicas().fetch_volume(info.volume, info.sha256, fill, self.limit)
            write_alias(
                fill / (info.name + alias_suffix(manifest.dbtype)),
                [info.volume],
                title=manifest.title,
                nseq=manifest.nseq,
                length=manifest.length,
            )

        def check(place: Path) -> bool:
            alias = place / (info.name + alias_suffix(manifest.dbtype))
            expected = alias_bytes(
                [info.volume], title=manifest.title, nseq=manifest.nseq, length=manifest.length
            )
            return alias.read_bytes() == expected and volume_sha256(place, info.volume) == info.sha256

        unit = _Unit(info.volume, info.volume, lambda: _copy_bytes(source, info.volume), fetch, check)
        with self._held(self.entry(manifest), unit) as place:
            yield place

    @contextlib.contextmanager
    def use_in_place(
        self,
        manifest: Manifest,
        volume: Unit,
        shared: Unit | None,
        sizes: Callable[[str], int],
        replicas: Callable[[], Fetcher],
    ) -> Iterator[Path | None]:
        """A database in place: the directory of a verified local copy of one user volume (`volume`),
        held shared for the `with` block, with its database's shared files (`shared`, version 5) staged
        once per entry, held too, and linked beside it; None: it does not fit, search it where it lies.

        Links, not copies nor hard links: a hard link moves its file's ctime, which the seals of every
        copy linking it record (a file rewritten with its mtime put back is found by its ctime alone)."""
        entry = self.entry(manifest)
        with contextlib.ExitStack() as held:
            links: list[str] = []
            if shared is not None:
                got = held.enter_context(self._held(entry, self._in_place_unit(shared, sizes, replicas)))
                if got is None:
                    yield None
                    return
                links = sorted(p.name for p in got.iterdir() if not p.name.startswith("."))
            unit = self._in_place_unit(volume, sizes, replicas, shared, links)
            yield held.enter_context(self._held(entry, unit))

    def _in_place_unit(
        self,
        unit: Unit,
        sizes: Callable[[str], int],
        replicas: Callable[[], Fetcher],
        shared: Unit | None = None,
        links: Sequence[str] = (),
    ) -> _Unit:
        """How a unit of a database in place is copied and checked (paramedic.db.units)."""
        targets = {name: f"../{shared.name}/{name}" for name in links} if shared is not None else {}

        def fetch(fill: Path) -> None:
            replicas().fetch_volume(unit.base, unit.digest, fill, self.limit)
            for name, target in targets.items():
                os.symlink(target, fill / name)

        def check(place: Path) -> bool:
            found = {p.name: os.readlink(p) for p in place.iterdir() if p.is_symlink()}
            return found == targets and unit_digest(place, unit.base) == unit.digest

        return _Unit(unit.name, unit.base, lambda: sizes(unit.base), fetch, check)

    @contextlib.contextmanager
    def _held(self, entry: Path, unit: _Unit) -> Iterator[Path | None]:
        """A unit's verified copy held shared for the `with` block (copied first if needed), or None."""
        try:
            if self.full is not None:
                raise OSError(errno.ENOSPC, self.full)
            self._make_entry(entry)
            fd = _open_lock(entry / f"{unit.name}.lock")
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise OutputError(f"--stage {self.root}: cannot use it ({exc.strerror})") from exc
            fd = None  # a full disk (bytes or inodes): searched where it lies, never the search's end
            self.stats.write_failures.append(f"{unit.label}: {exc.strerror or exc}")
        if fd is None:
            self.stats.in_place.append(unit.label)
            yield None
            return
        try:
            place = self._acquire(fd, entry, unit)
            if place is None:
                self.stats.in_place.append(unit.label)
            yield place
            if place is not None and not _sealed(place):  # changed while searched: that search is void
                self.verified.discard(place)
                raise DatabaseError(
                    f"--stage {self.root}: the copy of {unit.label} changed while it was searched (its "
                    "files are not those sealed): run the same command again (the copy is made afresh)"
                )
        finally:
            os.close(fd)  # releases the lock

    # -- the steps ----------------------------------------------------------------------------------
    def _acquire(self, fd: int, entry: Path, unit: _Unit) -> Path | None:
        place = entry / unit.name
        copied = False
        while True:
            self._lock(fd, fcntl.LOCK_SH)  # waits while another process copies it
            if place.is_dir() and self._trusted(place, unit):
                os.utime(place)  # last use, for LRU
                if not copied:
                    self.stats.hits += 1
                return place
            self._lock(fd, fcntl.LOCK_EX)  # not atomic: re-checked below
            if place.is_symlink() or (place.exists() and not place.is_dir()):
                place.unlink()  # not a copy (damage, or a link): never followed
                self.stats.discarded += 1
            if place.is_dir():
                if self._trusted(place, unit):
                    continue  # another process published it meanwhile: use it shared
                self._remove(place)  # changed since it was published: never used
                self.stats.discarded += 1
            for leftover in entry.glob(f"{FILL_PREFIX}{unit.name}-*"):
                self._remove(leftover)  # a dead copy of this volume (we hold its lock)
                self.stats.cleaned += 1
            size = unit.size()
            try:
                fill = self._reserve(entry, unit.name, size)
            except OSError as exc:  # no room even for the copy's directory (inodes): as a full disk
                if exc.errno not in DISK_FULL:
                    raise
                self.stats.write_failures.append(f"{unit.label}: {exc.strerror or exc}")
                fill = None
            if fill is None:
                fcntl.flock(fd, fcntl.LOCK_SH)  # searched in place, like any reader
                return None
            started = time.monotonic()
            try:
                # never more than the limit, whatever replicas say the volume holds (colluding mirrors)
                unit.fetch(fill)
                write_durably(fill / SEAL_NAME, json.dumps(_seal_of(fill)).encode())
                fsync_dir(fill)
                os.rename(fill, place)
                fsync_dir(entry)
                self.verified.add(place)  # fetch_volume digested its bytes
            except OSError as exc:  # the cache's own disk (full, over quota, failing): never the search's end
                shutil.rmtree(fill, ignore_errors=True)
                self.stats.write_failures.append(f"{unit.label}: {exc.strerror or exc}")
                fcntl.flock(fd, fcntl.LOCK_SH)  # searched in place, like any reader
                return None
            except BaseException:
                shutil.rmtree(fill, ignore_errors=True)
                raise
            self.stats.copies += 1
            self.stats.copied_bytes += _dir_bytes(place)
            self.stats.copy_seconds += time.monotonic() - started
            copied = True

    def _trusted(self, place: Path, unit: _Unit) -> bool:
        """The copy is sealed and, the first time this process uses it, its bytes are the manifest's (a
        seal records sizes, times and inodes, which a file rewritten in place keeps): digested once per
        job per worker, as `verify_volumes` digests the database once per job."""
        if not _sealed(place):
            return False
        if place in self.verified:
            return True
        try:
            good = unit.check(place)
        except (OSError, DatabaseError):
            good = False
        if good:
            self.verified.add(place)
        return good

    def trim(self) -> None:
        """Bring the cache within the limit now (a run with a smaller limit than the one that filled it),
        evicting least recently used volumes that no search holds; and clean what dead copies left."""
        if self.full is not None:
            return
        with self._cache_lock():
            self._make_room(0)

    def _reserve(self, entry: Path, volume: str, size: int) -> Path | None:
        """Under the cache's lock: clean what dead copies left, evict least recently used volumes until
        `size` more bytes fit, and reserve them with a `.fill-` directory (None: it cannot fit)."""
        if self.limit is not None and size > self.limit:
            return None
        with self._cache_lock():
            if not self._make_room(size):
                return None
            fill = entry / f"{FILL_PREFIX}{volume}-{size}-{secrets.token_hex(4)}"
            fill.mkdir()
            return fill

    def _make_entry(self, entry: Path) -> None:
        """The database's directory in the cache; a file or a link in its place is removed (under the
        cache's lock: nobody uses what is not a directory)."""
        if entry.is_dir() and not entry.is_symlink():
            return
        with self._cache_lock():
            if entry.is_symlink() or (entry.exists() and not entry.is_dir()):
                entry.unlink()
                self.stats.discarded += 1
            with contextlib.suppress(FileExistsError):
                entry.mkdir(mode=0o700)

    @contextlib.contextmanager
    def _cache_lock(self) -> Iterator[None]:
        lock = _open_lock(self.root / LOCK_NAME)
        try:
            self._lock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)

    def _make_room(self, size: int) -> bool:
        """With the cache's lock held: evict until `size` more bytes fit; False when they cannot."""
        published, filling = self._survey()
        used = sum(b for _, b, _ in published) + filling
        if self.limit is None or used + size <= self.limit:
            return True
        for path, nbytes, _ in sorted(published, key=lambda p: p[2]):
            if self._evict(path):
                self.stats.evictions += 1
                self.stats.evicted_bytes += nbytes
                used -= nbytes
                if used + size <= self.limit:
                    return True
        return False

    def _survey(self) -> tuple[list[tuple[Path, int, float]], int]:
        """Published copies (path, bytes, last use) of every database here, and the bytes reserved by
        copies under way; leftovers of dead copies and evictions are removed on the way."""
        published: list[tuple[Path, int, float]] = []
        filling = 0
        for entry in self.root.iterdir():
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            for path in entry.iterdir():
                if path.name.startswith(EVICT_PREFIX):
                    self._remove(path)
                    self.stats.cleaned += 1
                elif path.name.startswith(FILL_PREFIX) and (
                    _FILL.match(path.name) is None or not path.is_dir() or path.is_symlink()
                ):
                    self._remove(path)  # not a copy under way: nothing of ours is named so
                    self.stats.cleaned += 1
                elif (fill := _FILL.match(path.name)) is not None:
                    if self._try_lock(
                        entry / f"{fill['volume']}.lock", functools.partial(self._remove, path)
                    ):
                        self.stats.cleaned += 1  # its copier is gone: nobody holds its volume's lock
                    else:
                        filling += int(fill["bytes"])
                elif path.is_dir() and not path.name.startswith("."):
                    with contextlib.suppress(OSError):
                        published.append((path, _dir_bytes(path), path.stat().st_mtime))
        return published, filling

    def _evict(self, path: Path) -> bool:
        """Remove a published copy if no search holds it (its lock taken exclusively without waiting)."""
        return self._try_lock(path.with_name(path.name + ".lock"), lambda: self._remove(path))

    def _try_lock(self, lock_path: Path, then: Callable[[], None]) -> bool:
        try:
            fd = _open_lock(lock_path)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            then()
        finally:
            os.close(fd)
        return True

    def _remove(self, path: Path) -> None:
        """Out of sight first (renamed), then removed: a kill half-way leaves an `.evict-` directory, never
        a half copy under a volume's name."""
        if not path.exists():
            return
        if not path.name.startswith(EVICT_PREFIX):
            hidden = path.with_name(f"{EVICT_PREFIX}{path.name}-{secrets.token_hex(4)}")
            os.rename(path, hidden)
            path = hidden
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:  # a file or a link planted under a copy's name (rmtree leaves those: issue 41, item 10)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _lock(self, fd: int, how: int) -> None:
        """flock, counting the time spent waiting for it."""
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        started = time.monotonic()
        fcntl.flock(fd, how)
        self.stats.wait_seconds += time.monotonic() - started


def _open_lock(path: Path) -> int:
    """A lock file opened without following a link; a link in its place is removed and the file made."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    path.unlink()
    return os.open(path, flags | os.O_EXCL, 0o600)


def _check_private(root: Path) -> None:
    """Refuse a cache directory that another user owns or that others can write (as ssh refuses such a
    ~/.ssh): anyone who can write it can plant copies, or links at the lock names."""
    st = os.stat(root)  # (a link to a directory of one's own is fine, as ssh allows)
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"--stage {root}: not a directory")
    if st.st_uid != os.geteuid():
        raise OutputError(
            f"--stage {root}: owned by another user (uid {st.st_uid}); use a directory of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OutputError(
            f"--stage {root}: others can write it (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod go-w {root}` or use a directory of your own"
        )


def _volume_files(directory: Path, volume: str) -> list[Path]:
    return sorted(
        p for p in directory.iterdir() if p.name.startswith(volume + ".") and p.suffix not in (".pal", ".nal")
    )


def _copy_bytes(source: Path, volume: str) -> int:
    """The bytes a copy of the volume takes (its files, as the database directory holds them)."""
    try:
        files = _volume_files(source, volume)
        if not files:
            raise DatabaseError(f"{source}: volume {volume} is missing")
        return sum(p.stat().st_size for p in files)
    except OSError as exc:
        raise DatabaseError(f"{source}: volume {volume} unreadable ({exc.strerror})") from exc


def _dir_bytes(path: Path) -> int:
    """A copy's own bytes: a link to a database's shared files counts as nothing (they are counted once,
    in their own directory)."""
    return sum(st.st_size for p in path.iterdir() if stat.S_ISREG((st := p.lstat()).st_mode))


def _seal_of(path: Path) -> dict[str, list[int | str]]:
    out: dict[str, list[int | str]] = {}
    for p in sorted(path.iterdir()):
        if p.name != SEAL_NAME and not p.name.startswith("."):
            st = p.lstat()  # a link (to a database's shared files) is sealed as a link, with its target
            # ctime too: a file rewritten in place with its mtime put back keeps size, mtime and inode,
            # and no user sets a ctime back
            out[p.name] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            if stat.S_ISLNK(st.st_mode):
                out[p.name].append(os.readlink(p))
    return out


def _sealed(path: Path) -> bool:
    """The copy's files are those published (sizes, times, inodes): not truncated, replaced or touched.
    A seal is read as untrusted bytes: one larger than ours could be, or nested past the parser's depth
    (`make fuzz`'s stage target: a RecursionError was exit 1), is no seal."""
    try:
        with open(path / SEAL_NAME, "rb") as fh:
            text = fh.read(_MAX_SEAL + 1)
        return len(text) <= _MAX_SEAL and bool(json.loads(text) == _seal_of(path))
    except (OSError, ValueError, RecursionError):
        return False
