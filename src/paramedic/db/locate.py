"""Finding a database as BLAST+ resolves -db (any BLAST+ database, searched in place, or the layout of
earlier `paramedic format` versions with its manifest), and checking it is complete.

Used by the search (the compute site's database) and by the storage site (its replica): both must find and
check a database the same way, and the storage site must not depend on the search engine to do it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import blake3

from paramedic.blast.programs import alias_suffix
from paramedic.blast.run import Database
from paramedic.db.blastdb import (
    DEFAULT_FRAGMENTS,
    BlastDb,
    Volume,
    fragment_ranges,
    open_blastdb,
    read_volumes,
)
from paramedic.db.format import described_fragments
from paramedic.db.manifest import (
    FORMAT_VERSION,
    IN_PLACE,
    Fragment,
    Listings,
    Manifest,
    load_manifest,
    verify_volumes,
    volume_files_in_place,
)
from paramedic.db.trust import DigestStore, digests, unknown
from paramedic.errors import DatabaseError, UsageError


def _resolve(cwd: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else cwd / p


def _candidates(arg: str, cwd: Path) -> list[Path]:
    """Where a database of the earlier layout (a directory with its manifest) would be, as BLAST+ looks."""
    candidates = [_resolve(cwd, arg)]
    if not Path(arg).is_absolute():
        candidates += [Path(d) / arg for d in os.environ.get("BLASTDB", "").split(":") if d]
    return candidates


def resolve_database(
    arg: str, cwd: Path, digest: bool = True, dbtype: str | None = None
) -> tuple[Database, Manifest]:
    """Find the database as BLAST+ does (current directory, then $BLASTDB) and check it is complete;
    `digest`: and its bytes against the manifest (the job that searches it does; a check before the job
    starts need not read it twice). A database `paramedic format` did not make is searched in place
    (`in_place`); `dbtype` ("prot", "nucl") is the program's, when known."""
    directory = next((c for c in _candidates(arg, cwd) if (c / "manifest.json").is_file()), None)
    if directory is None:  # any other database BLAST+ opens: searched where it lies
        return in_place(arg, cwd, dbtype)
    directory = directory.resolve()
    manifest = load_manifest(directory)
    if digest:
        verify_volumes(directory, manifest)  # every job: sizes and times are not a digest
    missing = [
        name
        for name in [manifest.whole, *(f.name for f in manifest.fragments)]
        if not list(directory.glob(name + ".*"))
    ]
    if missing:
        raise DatabaseError(f"{arg}: incomplete database, missing {', '.join(missing)}")
    top_alias = directory.with_name(directory.name + alias_suffix(manifest.dbtype))
    if not top_alias.is_file():
        raise DatabaseError(f"{arg}: incomplete database, missing {top_alias.name}")
    database = Database(
        arg=arg,
        directory=directory,
        dbtype=manifest.dbtype,
        title=manifest.title,
        nseq=manifest.nseq,
        length=manifest.length,
        whole=manifest.whole,
        fragments=tuple(f.name for f in manifest.fragments),
        members_blake3=manifest.members_blake3,
        volumes=tuple(f.volume for f in manifest.fragments),
    )
    return database, manifest


def in_place(arg: str, cwd: Path, dbtype: str | None = None) -> tuple[Database, Manifest]:
    """A BLAST+ database as it lies (paramedic.db.blastdb), its fragments ranges of ordinal ids. The
    manifest is made, never written: its fragments name the volumes by path, its checksum covers only
    what both sites of a job agree on (volume names, counts, letters, dates)."""
    key = (arg, cwd, dbtype, os.environ.get("BLASTDB", ""))
    if key not in _IN_PLACE:  # once per process: the launcher and the job's checks both ask
        _IN_PLACE.clear()
        _IN_PLACE[key] = _in_place(arg, cwd, dbtype)
    return _IN_PLACE[key]


_IN_PLACE: dict[tuple[str, Path, str | None, str], tuple[Database, Manifest]] = {}


def _opened(arg: str, cwd: Path, dbtype: str | None) -> BlastDb:
    """`open_blastdb`, once per process for the same -db (a rank that lists the files to digest first
    opens it again to make its manifest)."""
    key = (arg, cwd, dbtype, os.environ.get("BLASTDB", ""))
    if key not in _OPENED:
        _OPENED.clear()
        _OPENED[key] = open_blastdb(arg, cwd, dbtype)
    return _OPENED[key]


_OPENED: dict[tuple[str, Path, str | None, str], BlastDb] = {}


def files_to_digest(arg: str, cwd: Path, dbtype: str | None) -> list[tuple[Path, int]]:
    """A database in place's files whose digests this user has not remembered for their stamps now, with
    their sizes: what opening it (`in_place`) would digest. Nothing for a database of the earlier layout
    (its manifest names its digests) or one that cannot be opened (opening it again says why)."""
    try:
        if any((c / "manifest.json").is_file() for c in _candidates(arg, cwd)):
            return []
        blastdb = _opened(arg, cwd, dbtype)
        listings = Listings()
        files: dict[Path, None] = {}
        for v in blastdb.volumes:
            own, shared = volume_files_in_place(Path(v.path), listings)
            files.update(dict.fromkeys([*own, *shared]))
    except (DatabaseError, UsageError, OSError):
        return []
    return [(path, info.st_size) for path, info in unknown(files, DigestStore(warn=_warn_once))]


def _in_place(arg: str, cwd: Path, dbtype: str | None) -> tuple[Database, Manifest]:
    blastdb = _opened(arg, cwd, dbtype)
    places = {Path(v.path).parent for v in blastdb.volumes}
    wanted = described_fragments(places.pop()) if len(places) == 1 else None
    ranges = fragment_ranges(blastdb, wanted or DEFAULT_FRAGMENTS)
    volumes = blastdb.volumes
    fragments = [
        Fragment(f"range{i}", volumes[r.volume].path, r.last - r.first + 1, r.length, "")
        for i, r in enumerate(ranges)
    ]
    manifest = _manifest(arg, blastdb, fragments, _volume_digests(volumes))
    database = Database(
        arg=arg,
        directory=Path(volumes[0].path).parent,
        dbtype=blastdb.dbtype,
        title=blastdb.title,
        nseq=blastdb.nseq,
        length=blastdb.length,
        whole="",
        fragments=tuple(f.name for f in manifest.fragments),
        spans=tuple((v.path, v.first, v.nseq, v.length) for v in volumes),
        ranges=tuple((r.volume, r.first, r.last) for r in ranges),
        seqids=blastdb.seqids,
        misnumbered=blastdb.misnumbered,
        digests=tuple(sorted(manifest.volume_blake3.items())),
    )
    return database, manifest


def _volume_digests(volumes: Sequence[Volume]) -> dict[str, str]:
    """Each volume's digest (its files' names and BLAKE3s, remembered between jobs: paramedic.db.trust),
    keyed by what both sites of a job see alike: its first id, base name, count, letters and date; a
    version-5 database's shared files (.pdb, .pos, .pot, .ptf, .pto) under the base name's own key."""
    store = DigestStore(warn=_warn_once)
    listings = Listings()
    out: dict[str, str] = {}
    for v in volumes:
        own, shared = volume_files_in_place(Path(v.path), listings)
        out[_volume_key(v)] = _combined(own, store)
        if shared:
            out[_shared_key(shared, v)] = _combined(shared, store)
    return out


def volume_keys(volumes: Sequence[Volume]) -> set[str]:
    """The keys `_volume_digests` gives, without reading a byte past the volumes' headers: a copy of the
    database elsewhere (a --mirror) is the same release when its keys are the job's, and each of its
    bytes is then checked against the job's digests as it is copied (paramedic.db.replicas)."""
    listings = Listings()
    out = set()
    for v in volumes:
        _, shared = volume_files_in_place(Path(v.path), listings)
        out.add(_volume_key(v))
        if shared:
            out.add(_shared_key(shared, v))
    return out


def _volume_key(v: Volume) -> str:
    return f"{v.first} {Path(v.path).name} {v.nseq} {v.length} {v.date}"


def _shared_key(shared: list[Path], v: Volume) -> str:
    return f"shared {shared[0].name.rsplit('.', 1)[0]} {v.date}"


def _combined(files: list[Path], store: DigestStore) -> str:
    found = digests(files, store)
    return blake3.blake3("".join(f"{path.name}\0{found[path]}\n" for path in files).encode()).hexdigest()


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        print(f"paramedic: warning: {text}", file=sys.stderr, flush=True)


def recheck_in_place(database: Database, manifest: Manifest) -> None:
    """DatabaseError unless a database in place still has the digests its manifest was made with: a
    storage site's replica may change while `serve` runs. Files whose stamps did not change are not read
    again (their digests are remembered); a volume rewritten in place has a new ctime and is."""
    volumes = read_volumes(database.arg, [span[0] for span in database.spans], database.dbtype)
    if _volume_digests(volumes) != manifest.volume_blake3:
        raise DatabaseError(f"{database.arg}: changed since it was opened (a volume written or replaced)")


def manifest_of(database: Database) -> Manifest:
    """A database in place's manifest made again from its volumes' paths (a rank need not share the
    launcher's working directory or BLASTDB) and the digests the job was made with (`Database.digests`;
    without them, its volumes' own): its identity (checksum) is the job's; its fragments name the
    volumes, their residue counts are not known here (0)."""
    digests = dict(database.digests)
    if not digests:
        digests = _volume_digests(read_volumes(database.arg, database.span_paths(), database.dbtype))
    fragments = [
        Fragment(f"range{i}", database.spans[v][0], last - first + 1, 0, "")
        for i, (v, first, last) in enumerate(database.ranges)
    ]
    return _manifest(database.arg, database, fragments, digests)


class _Described(Protocol):
    @property
    def dbtype(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def nseq(self) -> int: ...
    @property
    def length(self) -> int: ...


def _manifest(arg: str, db: _Described, fragments: list[Fragment], digests: dict[str, str]) -> Manifest:
    """A database in place's manifest: made, never written; its identity is its volumes' digests."""
    return Manifest(
        format_version=FORMAT_VERSION,
        dbtype=db.dbtype,
        title=db.title,
        nseq=db.nseq,
        length=db.length,
        whole="",
        whole_sha256="",
        fragments=fragments,
        input_path=arg,
        content_sha256="",
        tools={"layout": IN_PLACE},
        volume_blake3=digests,
    )
