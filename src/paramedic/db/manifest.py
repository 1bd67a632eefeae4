"""The manifest of a formatted database: totals, fragments, checksums, tool versions.

It is the contract between `format`, `search` and (later) a storage site's replica: a search refuses a
database whose manifest is missing or whose files do not match it.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import re
import struct
import sys
import threading
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import blake3

from paramedic.blast.alias import alias_bytes
from paramedic.blast.programs import alias_suffix
from paramedic.errors import DatabaseError

MANIFEST_NAME = "manifest.json"
SEQUENCES_NAME = "sequences.tsv"
# Each fragment's global ordinal ids, for the workers to map BLAST+'s ids in a fragment to the whole
# database's: magic, uint32 fragments, uint32 count per fragment, then the ids (uint32, little-endian).
MEMBERS_NAME = "members.bin"
_MEMBERS_MAGIC = b"PMMEMB1\0"
WHOLE_NAME = "whole"
FORMAT_VERSION = 1
# Marks (in Manifest.tools) a database whose fragment digests cover the fragment files as stored.
FRAGMENT_DIGESTS = "stored-files"
# Marks (in Manifest.tools["layout"]) a database searched where it lies (paramedic.db.locate.in_place)
IN_PLACE = "in-place"


@dataclass(frozen=True)
class Fragment:
    name: str  # alias name inside the database directory (whole-database statistics)
    volume: str  # makeblastdb volume name inside the database directory
    nseq: int
    length: int
    sha256: str  # over the volume's files, in name order


@dataclass(frozen=True)
class Manifest:
    format_version: int
    dbtype: str  # "prot" or "nucl"
    title: str
    nseq: int
    length: int
    whole: str  # volume of the whole database in original order
    whole_sha256: str
    fragments: list[Fragment]
    input_path: str
    content_sha256: str  # of the sequences as read (normalised FASTA)
    tools: dict[str, str] = field(default_factory=dict)
    # volume -> BLAKE3 over its files, as `volume_sha256` hashes them (`volume_digest`): what every job
    # verifies, at 2.5x less CPU than SHA-256 here; databases formatted before have none (SHA-256 then)
    volume_blake3: dict[str, str] = field(default_factory=dict)
    # BLAKE3 of members.bin (each fragment's global ids, binary): "" for databases formatted before,
    # whose members are read from sequences.tsv
    members_blake3: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        data["fragments"] = [Fragment(**f) for f in data["fragments"]]
        return cls(**data)

    @property
    def in_place(self) -> bool:
        return self.tools.get("layout") == IN_PLACE

    def checksum(self) -> str:
        """Identity of the database content: equal checksums mean identical search results. A database
        in place is identified without its paths, which differ between a compute and a storage site."""
        if self.in_place:
            who = [self.dbtype, self.title, self.nseq, self.length, sorted(self.volume_blake3.items())]
            return hashlib.sha256(json.dumps(who).encode()).hexdigest()
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def load_manifest(db_dir: Path) -> Manifest:
    path = db_dir / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise DatabaseError(
            f"{db_dir}: not a paramedic database (no {MANIFEST_NAME}); run `paramedic format`"
        ) from exc
    try:
        manifest = Manifest.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise DatabaseError(f"{path}: corrupt manifest ({exc})") from exc
    if manifest.format_version != FORMAT_VERSION:
        raise DatabaseError(f"{path}: database format {manifest.format_version}, expected {FORMAT_VERSION}")
    return manifest


def volume_sha256(db_dir: Path, volume: str) -> str:
    """SHA-256 over a makeblastdb volume's files (name and bytes, in name order)."""
    return volume_digest(db_dir, volume, hashlib.sha256())


def volume_blake3(db_dir: Path, volume: str) -> str:
    """BLAKE3 over the same bytes: a cryptographic digest that costs 2.5x less CPU than SHA-256 here
    (0.155 s against 0.387 s for 357 MB, measured), for the digest every job makes of its database."""
    return volume_digest(db_dir, volume, blake3.blake3())


class _Digest(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def _volume_files(db_dir: Path, volume: str) -> list[Path]:
    return sorted(
        p for p in db_dir.iterdir() if p.name.startswith(volume + ".") and p.suffix not in (".pal", ".nal")
    )


def volume_digest(db_dir: Path, volume: str, digest: _Digest) -> str:
    """`digest` fed each of the volume's files (name, NUL, bytes) in name order."""
    files = _volume_files(db_dir, volume)
    if not files:
        raise DatabaseError(f"{db_dir}: volume {volume} is missing")
    # One buffer, read into and hashed in place: a new 4 MB bytes object per read cost page faults and
    # a copy more (the whole 311 MB protein volume: 0.08 s of CPU against 0.12 s)
    buffer = bytearray(_READ_BYTES)
    view = memoryview(buffer)
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buffer):
                digest.update(view[:n])
    return digest.hexdigest()


_READ_BYTES = 1 << 20


def verify_volumes(db_dir: Path, manifest: Manifest) -> None:
    """Digest the volumes' files and compare them with the manifest's SHA-256s, in every job.

    Sizes, times and inodes are not a digest: a file rewritten in place with its times restored keeps
    all three, so nothing is remembered between jobs. The cost is one read of the database per job (the
    page cache usually holds it for the search that follows): under 1% of a search, bench/RESULTS.md.
    The volumes are digested on every core at once (hashlib releases the GIL): rank 0 does it before the
    search while the workers wait (a local search starts it as soon as it knows its -db: `Verification`);
    1.2 GB of a 420,000-protein database took 1.1 s on one core."""
    Verification(db_dir, manifest, stamps=False)()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Verification:
    """A database's digest (`verify_volumes`) running while the caller goes on, with the volumes' stamps
    taken before it (`volume_stamps`, unless `stamps=False`). Calling the object waits for the digest
    and raises its refusal; `failed` looks without waiting.

    On `threads` threads of this process (default: every core), or in a child process of its own
    (`child`): a local search starts it as soon as it knows its -db (paramedic.engine.runtime.launch), and the
    interpreter's imports and the job's checks (0.15-0.2 s) leave a core idle. `fragments=False`: the
    whole database's volume only, for a job that stages its fragments from --mirror replicas (each copy
    is verified on its own, and a damaged local fragment is then fetched from a mirror). A thread digests little
    there: it needs the interpreter's lock between reads, which the importing thread holds for its
    switch interval (5 ms) each time (a 107 MiB digest took 3.6 s beside a busy thread, 0.12-0.18 s
    alone); a forked child holds a lock of its own. Done there, the digest no longer shares the
    cores with the first searches (blastn, 20 queries against 306 Mbp: 0.12 s of CPU)."""

    def __init__(
        self,
        db_dir: Path,
        manifest: Manifest,
        threads: int | None = None,
        stamps: bool = True,
        child: bool = False,
        fragments: bool = True,
    ):
        self.directory = db_dir
        self.checksum = manifest.checksum()
        self.stamps = volume_stamps(db_dir, manifest) if stamps else ()  # before the digest
        check_aliases(db_dir, manifest)
        volumes = [] if manifest.in_place else [(manifest.whole, manifest.whole_sha256)]
        if fragments and manifest.tools.get("digests") == FRAGMENT_DIGESTS:
            volumes += [(f.volume, f.sha256) for f in manifest.fragments]
        if manifest.volume_blake3 and not manifest.in_place:  # the cheaper digest, when the manifest has it
            volumes = [(v, manifest.volume_blake3.get(v, "")) for v, _ in volumes]
        self._digest = volume_blake3 if manifest.volume_blake3 else volume_sha256
        self._expected = volumes
        self._todo = [v for v, _ in reversed(volumes)]  # popped from the end: the whole volume first
        self._results: dict[str, str | Exception] = {}
        self._lock = threading.Lock()
        self._active = 0  # digesting threads
        self._failure: list[BaseException] = []
        self._done = threading.Event()
        if child and hasattr(os, "fork") and self._todo:  # nothing to digest (in place): no child
            self._active = 1
            names, self._todo = list(reversed(self._todo)), []
            pid, reader = self._fork(names)  # here, not on a thread: the child needs no lock held
            threading.Thread(
                target=self._from_child, args=(pid, reader, names), name="paramedic-digest", daemon=True
            ).start()
        else:
            self._start_threads(threads or _cores())

    def _start_threads(self, threads: int) -> None:
        with self._lock:
            more = max(1, min(threads, len(self._todo)))
            self._active += more
        for _ in range(more):
            threading.Thread(target=self._work, name="paramedic-digest", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._todo:
                    self._leave()
                    return
                volume = self._todo.pop()
            self._digest_here(volume)

    def _digest_here(self, volume: str) -> None:
        try:
            self._results[volume] = self._digest(self.directory, volume)
        except Exception as exc:  # handed to the waiter
            self._results[volume] = exc

    def _leave(self) -> None:
        """A digesting thread is done (under the lock): the last one out compares, every digest in."""
        self._active -= 1
        if self._active == 0:
            self._conclude()

    def _fork(self, volumes: list[str]) -> tuple[int, int]:
        """A child that digests `volumes` in order and writes a line for each: `volume TAB =digest`,
        `!strerror` (unreadable) or `?message` (a refusal); the child's pid and the pipe's read end."""
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(reader)
                for volume in volumes:
                    try:
                        line = "=" + self._digest(self.directory, volume)
                    except OSError as exc:
                        line = "!" + (exc.strerror or str(exc))
                    except DatabaseError as exc:
                        line = "?" + str(exc)
                    os.write(writer, f"{volume}\t{line}\n".encode())
            finally:
                os._exit(0)  # no exit handlers, no flushing of the parent's buffers
        os.close(writer)
        return pid, reader

    def _from_child(self, pid: int, reader: int, volumes: list[str]) -> None:
        """The child's lines into the results; a volume it did not answer (killed) is digested here."""
        try:
            with open(reader, "rb") as fh:
                for raw in fh:
                    volume, _, line = raw.decode(errors="replace").rstrip("\n").partition("\t")
                    if volume in volumes and line[:1] == "=":
                        self._results[volume] = line[1:]
                    elif volume in volumes and line[:1] == "!":
                        self._results[volume] = OSError(0, line[1:])
                    elif volume in volumes and line[:1] == "?":
                        self._results[volume] = DatabaseError(line[1:])
        finally:
            os.waitpid(pid, 0)
            for volume in volumes:
                if volume not in self._results:
                    self._digest_here(volume)
            with self._lock:
                self._leave()

    def _conclude(self) -> None:
        """The digests against the manifest's."""
        try:
            for volume, expected in self._expected:
                actual = self._results[volume]
                if isinstance(actual, OSError):
                    raise DatabaseError(
                        f"{self.directory}: volume {volume} unreadable ({actual.strerror})"
                    ) from actual
                if isinstance(actual, Exception):
                    raise actual
                if actual != expected:
                    raise DatabaseError(
                        f"{self.directory}: corrupt database: volume {volume} does not match the manifest's "
                        "checksum (changed or damaged since `paramedic format`; format it again)"
                    )
        except BaseException as exc:
            self._failure.append(exc)
        self._done.set()

    def of(self, db_dir: Path, manifest: Manifest) -> bool:
        """Whether this is the digest of `manifest`'s database at `db_dir`."""
        return db_dir == self.directory and manifest.checksum() == self.checksum

    def __call__(self) -> None:
        self._done.wait()
        if self._failure:
            raise self._failure[0]

    @property
    def failed(self) -> bool:
        """Finished with a refusal (without waiting): a runner looks while its workers search."""
        return self._done.is_set() and bool(self._failure)


def _alias_files(db_dir: Path, manifest: Manifest) -> list[tuple[Path, bytes]]:
    """Each fragment's alias file (what a fragment search names as -db) and the bytes the manifest says
    it holds (`paramedic format` writes them from the same fields)."""
    suffix = alias_suffix(manifest.dbtype)
    return [
        (
            db_dir / (f.name + suffix),
            alias_bytes([f.volume], title=manifest.title, nseq=manifest.nseq, length=manifest.length),
        )
        for f in manifest.fragments
    ]


def check_aliases(db_dir: Path, manifest: Manifest) -> None:
    """Every fragment alias is the manifest's, in every job: an alias rewritten to name another volume
    (times kept) made a fragment search read the wrong volume, whose digest passed; with `--traceback
    once` the report was another one, exit 0 (issue 23). A database in place has none of ours."""
    if manifest.in_place:
        return
    for path, expected in _alias_files(db_dir, manifest):
        try:
            with open(path, "rb") as fh:
                actual = fh.read(len(expected) + 1)
        except OSError as exc:
            raise DatabaseError(f"{db_dir}: alias {path.name} unreadable ({exc.strerror})") from exc
        if actual != expected:
            raise DatabaseError(
                f"{db_dir}: corrupt database: alias {path.name} is not the one the manifest describes "
                "(changed since `paramedic format`; format it again)"
            )


Stamp = tuple[str, int, int, int, int]  # a volume file's name, inode, size, mtime and ctime (ns)


def volume_stamps(db_dir: Path, manifest: Manifest) -> tuple[Stamp, ...]:
    """Every volume file's identity, taken before the job's digest (`verify_volumes`) and compared again
    by `check_stamps` once the searches are done, before the output is made final. A file written in
    place changes its ctime, which no user can set back (setting the times sets it to now), and a file
    replaced has another inode: so the volumes the searches read are the ones digested. A volume
    rewritten during a search, times restored, gave another report, exit 0 (issue 23, item 1). The
    fragments' alias files are stamped too (`check_aliases` reads them before)."""
    stamps = []
    if manifest.in_place:
        files = in_place_files(manifest)
    else:
        files = [path for path, _ in _alias_files(db_dir, manifest)]  # what fragment searches open first
        for volume in {manifest.whole, *(f.volume for f in manifest.fragments)}:
            files += _volume_files(db_dir, volume)
    for path in files:
        try:
            info = path.stat()
        except OSError as exc:
            raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
        name = str(path) if manifest.in_place else path.name  # in place: volumes of several directories
        stamps.append((name, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(sorted(stamps))


def in_place_files(manifest: Manifest) -> list[Path]:
    """A database in place's files (absolute): each volume's, and the database-wide ones of version 5
    (.pdb, .pos, .pot, .ptf, .pto beside `db.00`, named `db.*`), alias files left out."""
    files: set[Path] = set()
    listings = Listings()
    for volume in {f.volume for f in manifest.fragments}:
        own, shared = volume_files_in_place(Path(volume), listings)
        files.update(own)
        files.update(shared)
    return sorted(files)


class Listings:
    """Directory listings, each read once (a database of many volumes lists its directory once, not once
    a volume: 115 volumes took 0.47 s the other way)."""

    def __init__(self) -> None:
        self.names: dict[Path, list[str]] = {}

    def __call__(self, directory: Path) -> list[str]:
        if directory not in self.names:
            try:
                with os.scandir(directory) as entries:
                    self.names[directory] = sorted(
                        e.name for e in entries if not e.name.endswith((".pal", ".nal"))
                    )
            except OSError as exc:
                raise DatabaseError(f"{directory}: unreadable ({exc.strerror})") from exc
        return self.names[directory]


def volume_files_in_place(volume: Path, listings: Listings | None = None) -> tuple[list[Path], list[Path]]:
    """A volume's own files (`db.00.*`) and its database's shared ones (`db.pdb`, ...), alias files left out."""
    names = (listings or Listings())(volume.parent)
    base = re.sub(r"\.\d+$", "", volume.name)
    at = bisect.bisect_left(names, volume.name + ".")
    own = []
    while at < len(names) and names[at].startswith(volume.name + "."):
        own.append(volume.parent / names[at])
        at += 1
    shared = [] if base == volume.name else [volume.parent / name for name in listings_shared(names, base)]
    return own, shared


def listings_shared(names: list[str], base: str) -> list[str]:
    """`base.xyz` among sorted `names` (one extension: `db.pdb`, not `db.00.pin`)."""
    return list(_dotted(tuple(names), base))


@functools.lru_cache(maxsize=64)
def _dotted(names: tuple[str, ...], base: str) -> tuple[str, ...]:
    prefix = base + "."
    return tuple(n for n in names if n.startswith(prefix) and "." not in n[len(prefix) :])


class _Discardable(Protocol):
    def close(self, complete: bool) -> object: ...


def check_stamps(db_dir: Path, stamps: tuple[Stamp, ...], journal: _Discardable | None = None) -> None:
    """DatabaseError unless every volume file is the one stamped (`volume_stamps`). A `journal` (an
    engine Journal) is then discarded: its work was done on bytes that were not the digested ones."""
    for name, *stamp in stamps:
        try:
            info = (db_dir / name).stat()
            now = [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
        except OSError:
            now = []
        if now != stamp:
            if journal is not None:
                journal.close(complete=True)
            raise DatabaseError(
                f"{db_dir}: the database changed while this search ran ({name} was written or replaced): "
                "its report is not kept; search again once the database is whole"
            )


_members_lock = threading.Lock()


def fragment_members(db_dir: Path, n_fragments: int, digest: str = "") -> tuple[Sequence[int], ...]:
    """Per fragment, the global ordinal ids of its sequences in the fragment's own ordinal order
    (fragments keep input order): BLAST+ inside a fragment knows only these. From members.bin, checked
    against `digest` (the manifest's `members_blake3`), else from sequences.tsv (databases formatted
    before). Read once per process; a thread that asks while another reads waits for that reading.
    From members.bin each fragment's ids are an `array` of them, not a tuple of Python ints: building
    420,000 ints held the interpreter's lock for 10-20 ms while the worker threads started their first
    searches, and a group's ids joined in a list another 6 ms per search (`global_ids`)."""
    with _members_lock:
        if digest:
            return _members_from_binary(db_dir, n_fragments, digest)
        return _members_from_table(db_dir, n_fragments)


def members_bytes(fragment_of: Sequence[int], n_fragments: int) -> bytes:
    """members.bin for a database whose sequence `gid` is in fragment `fragment_of[gid]`."""
    members: list[list[int]] = [[] for _ in range(n_fragments)]
    for gid, fragment in enumerate(fragment_of):
        members[fragment].append(gid)
    counts = array("I", [len(m) for m in members])
    ids = array("I", [gid for m in members for gid in m])
    if sys.byteorder != "little":
        counts.byteswap()
        ids.byteswap()
    return _MEMBERS_MAGIC + struct.pack("<I", n_fragments) + counts.tobytes() + ids.tobytes()


def global_ids(members: Sequence[Sequence[int]], fragments: Sequence[int]) -> Sequence[int]:
    """The global ids of a search over `fragments` in its ordinal order (their members one after the
    other, as an alias over their volumes numbers them)."""
    if len(fragments) == 1:
        return members[fragments[0]]
    ids = array("I")
    for fragment in fragments:
        ids.extend(members[fragment])  # a copy of bytes from members.bin's arrays
    return ids


@functools.cache
def _members_from_binary(db_dir: Path, n_fragments: int, digest: str) -> tuple[Sequence[int], ...]:
    """Reading 420,000 ids this way takes milliseconds; parsing sequences.tsv took 0.38 s, which every
    worker paid before its first result."""
    path = db_dir / MEMBERS_NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
    if blake3.blake3(data).hexdigest() != digest:
        raise DatabaseError(
            f"{db_dir}: corrupt database: {MEMBERS_NAME} does not match the manifest's checksum "
            "(changed or damaged since `paramedic format`; format it again)"
        )
    head = len(_MEMBERS_MAGIC) + 4 + 4 * n_fragments
    if not data.startswith(_MEMBERS_MAGIC) or len(data) < head:
        raise DatabaseError(f"{path}: not a members file")
    if struct.unpack_from("<I", data, len(_MEMBERS_MAGIC))[0] != n_fragments:
        raise DatabaseError(f"{path}: another number of fragments than the manifest's")
    counts = array("I", data[len(_MEMBERS_MAGIC) + 4 : head])
    ids = array("I", data[head:])
    if sys.byteorder != "little":
        counts.byteswap()
        ids.byteswap()
    if sum(counts) != len(ids):
        raise DatabaseError(f"{path}: its counts do not add up to its ids")
    members: list[Sequence[int]] = []
    start = 0
    for count in counts:
        members.append(ids[start : start + count])
        start += count
    return tuple(members)


@functools.cache
def _members_from_table(db_dir: Path, n_fragments: int) -> tuple[tuple[int, ...], ...]:
    members: list[list[int]] = [[] for _ in range(n_fragments)]
    path = db_dir / SEQUENCES_NAME
    try:
        with open(path) as fh:
            next(fh, None)
            for line in fh:
                gid, fragment = line.split("\t", 2)[:2]
                members[int(fragment)].append(int(gid))
    except (OSError, ValueError, IndexError) as exc:
        raise DatabaseError(f"{path}: unreadable ({exc})") from exc
    if any(m != sorted(m) for m in members):
        raise DatabaseError(f"{path}: sequences out of order")
    return tuple(tuple(m) for m in members)
