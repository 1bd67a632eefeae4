"""A BLAST+ database searched where it lies: the volumes BLAST+ opens for a -db, and fragments over them.

Users hold makeblastdb's output and NCBI's preformatted databases (version 4 or 5, one or many volumes,
alias files over several databases). Nothing is written beside them: BLAST+ itself (`blastdbcmd -info`)
resolves the -db exactly as a search would (current directory, then BLASTDB, alias files, several names in
one quoted -db) and lists the volumes in the order that numbers their sequences (base names sorted as
strings: `db.10` before `db.100` before `db.11`). Each volume's own header (`.pin`/`.nin`) gives its count,
its letters and its build date, so a sequence's global ordinal id is arithmetic: the volume's first id
plus its local id. No per-sequence table is read.

Fragments are contiguous ranges of ordinal ids, never across a volume boundary, balanced by letters (a
volume is cut where its sequence-offset table reaches the share: a binary search of a few 4-byte reads).
A fragment is searched through an alias written in the worker's own directory (`paramedic.blast.run`):
`DBLIST` of its volume, `FIRST_OID`/`LAST_OID`, and the whole database's NSEQ, LENGTH and TITLE.
"""

from __future__ import annotations

import re
import shlex
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paramedic.blast.tools import require_tool, run_tool
from paramedic.errors import BlastError, DatabaseError, UsageError

DEFAULT_FRAGMENTS = 4  # at least this many fragments (a database of more volumes has one per volume)
_KINDS = {"prot": ".p", "nucl": ".n"}
_WORDS = {"prot": "protein", "nucl": "nucleotide"}
# Keys of a user's alias file that restrict or re-count its volumes: a search of it is not a search of its
# volumes, which is what the fragments and regenerations are made of.
_RESTRICTING = re.compile(
    rb"^\s*(OIDLIST|GILIST|TILIST|SEQIDLIST|TAXIDLIST|FIRST_OID|LAST_OID|MEMB_BIT|STATS_NSEQ|STATS_TOTLEN)\b",
    re.M,
)


@dataclass(frozen=True)
class Volume:
    """One volume as BLAST+ numbers it: `first` is the global ordinal id of its first sequence."""

    path: str  # absolute, without extension
    first: int
    nseq: int
    length: int
    date: str
    version: int  # 4 or 5


@dataclass(frozen=True)
class BlastDb:
    arg: str  # the -db string as the user gave it
    dbtype: str  # "prot" or "nucl"
    title: str
    volumes: tuple[Volume, ...]
    seqids: bool  # made with -parse_seqids: BLAST+ names subjects by their own ids, not BL_ORD_ID
    # Volumes numbered past 99 (`db.99`, `db.100`): makeblastdb's id index follows its write order, BLAST+
    # reads them sorted as strings, so every lookup by id (-seqidlist, -taxids, an id to its ordinal id)
    # goes wrong in BLAST+ itself (measured: 2 of 4 ids of db.05, db.99, db.100, db.110 found, one wrong)
    misnumbered: bool = False

    @property
    def nseq(self) -> int:
        return sum(v.nseq for v in self.volumes)

    @property
    def length(self) -> int:
        return sum(v.length for v in self.volumes)


def names(arg: str) -> list[str]:
    """The database names in a -db value as BLAST+ splits them: on spaces, double quotes keeping a name
    with spaces whole; a value quoted as a whole (Galaxy renders `-db '"path"'`) is one name."""
    text = arg.strip()
    try:
        parts = shlex.split(text, posix=True)
    except ValueError as exc:
        raise DatabaseError(f"-db {arg!r}: unbalanced quotes") from exc
    if not parts:
        raise DatabaseError("-db is empty")
    return parts


def open_blastdb(arg: str, cwd: Path, dbtype: str | None = None) -> BlastDb:
    """The database BLAST+ would search for `-db arg` run in `cwd`, or DatabaseError in one line."""
    kinds = [dbtype] if dbtype else ["prot", "nucl"]
    info = None
    for kind in kinds:
        info = _info(arg, cwd, kind)
        if info is not None:
            dbtype = kind
            break
    if info is None and dbtype is not None:
        other = "nucl" if dbtype == "prot" else "prot"
        if _info(arg, cwd, other) is not None:
            raise UsageError(
                f"-db {arg}: a {_WORDS[other]} database, and the program searches a {_WORDS[dbtype]} database"
            )
    if info is None or dbtype is None:
        raise DatabaseError(f"database {arg!r} not found (BLAST+ looks in {cwd} and in BLASTDB)")
    _check_aliases(arg, cwd, dbtype)
    title, listed = _parse_info(arg, info)
    described = _totals(info)
    volumes = _flatten(arg, listed, dbtype, cwd, depth=0)
    seqids = _has_seqids(volumes, dbtype)
    db = BlastDb(
        arg,
        dbtype,
        title,
        tuple(read_volumes(arg, volumes, dbtype)),
        seqids,
        seqids and _misnumbered(volumes),
    )
    if described is not None and described != (db.nseq, db.length):
        raise DatabaseError(
            f"{arg}: its alias files restrict or re-count its volumes ({described[0]:,} sequences where the "
            f"volumes hold {db.nseq:,}): not supported; name the volumes' database itself"
        )
    _check_builds(db)
    return db


# `blastdbcmd -info` runs started ahead by `prefetch_info`, by (-db, directory, molecule type)
_PREFETCHED: dict[tuple[str, str, str], subprocess.Popen[bytes]] = {}


def prefetch_info(arg: str, cwd: Path, dbtype: str) -> bool:
    """Start `blastdbcmd -info` of a -db now, in the background, for the `_info` call that will ask it
    the same: a search's start imports its modules meanwhile, and BLAST+'s own start (60-90 ms of wall
    on 2 busy cores) runs on the other core. Whether it runs: not when it cannot start (the later call
    says why)."""
    key = (arg, str(cwd), dbtype)
    if key not in _PREFETCHED:
        try:
            argv = [require_tool("blastdbcmd"), "-db", arg, "-dbtype", dbtype, "-info"]
            _PREFETCHED[key] = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except (BlastError, OSError):
            return False
    return True


def drop_prefetched() -> None:
    """Stop and reap the `prefetch_info` runs nobody read (a job refused before it resolved its -db)."""
    while _PREFETCHED:
        _, started = _PREFETCHED.popitem()
        started.kill()
        started.communicate()


def _info(arg: str, cwd: Path, dbtype: str) -> str | None:
    """`blastdbcmd -info` of a -db (None: BLAST+ does not find it as this molecule type)."""
    started = _PREFETCHED.pop((arg, str(cwd), dbtype), None)
    if started is not None:
        stdout, _ = started.communicate()
        return stdout.decode(errors="replace") if started.returncode == 0 else None
    try:
        result = run_tool(["blastdbcmd", "-db", arg, "-dbtype", dbtype, "-info"], cwd=cwd)
    except BlastError:
        return None
    return result.stdout.decode(errors="replace")


MAX_ALIAS_DEPTH = 16


def _flatten(arg: str, listed: list[str], dbtype: str, cwd: Path, depth: int) -> list[str]:
    """The volumes under `listed` (-info names an alias inside an alias by its file, `x.pal`), in the order
    BLAST+ numbers them: all volumes sorted by base name as strings, whatever alias lists them (measured:
    an alias over `zz` and `db` numbers `db.00` first)."""
    if depth > MAX_ALIAS_DEPTH:
        raise DatabaseError(f"{arg}: alias files nested more than {MAX_ALIAS_DEPTH} deep")
    volumes: list[str] = []
    alias_suffix = _KINDS[dbtype] + "al"
    for entry in listed:
        if not entry.endswith(alias_suffix):
            volumes.append(entry)
            continue
        inner = entry[: -len(alias_suffix)]
        _check_alias_file(arg, Path(entry))
        info = _info(f'"{inner}"' if " " in inner else inner, cwd, dbtype)
        if info is None:
            raise DatabaseError(f"{arg}: BLAST+ cannot open {entry}, which an alias file names")
        volumes += _flatten(arg, _parse_info(arg, info)[1], dbtype, cwd, depth + 1)
    if depth == 0:
        volumes.sort(key=lambda path: Path(path).name)  # stable: the listed order among equal names
    return volumes


def _parse_info(arg: str, info: str) -> tuple[str, list[str]]:
    match = re.search(r"^Database: (.*)$", info, re.M)
    _, _, listed = info.partition("\nVolumes:\n")
    volumes = [line.strip() for line in listed.splitlines() if line.strip()]
    if match is None or not volumes:
        raise DatabaseError(f"{arg}: BLAST+ described it in a way paramedic does not know (blastdbcmd -info)")
    return match.group(1), volumes


def _totals(info: str) -> tuple[int, int] | None:
    match = re.search(r"^\s*([\d,]+) sequences; ([\d,]+) total", info, re.M)
    if match is None:
        return None
    return int(match.group(1).replace(",", "")), int(match.group(2).replace(",", ""))


@dataclass(frozen=True)
class Header:
    version: int
    protein: bool
    title: str
    date: str
    nseq: int
    length: int
    offsets_at: int  # where the header-offset table starts in the index file


def read_header(index: Path) -> Header:
    """The fixed part of a volume's index file (.pin/.nin), versions 4 and 5 (big-endian 32-bit fields,
    the total length a little-endian 64-bit one, as BLAST+'s seqdbfile writes them)."""
    try:
        with open(index, "rb") as fh:
            data = fh.read(1 << 16)
    except OSError as exc:
        raise DatabaseError(f"{index}: unreadable ({exc.strerror})") from exc
    at = 0

    def i32() -> int:
        nonlocal at
        if at + 4 > len(data):
            raise DatabaseError(f"{index}: truncated volume header")
        (value,) = struct.unpack_from(">i", data, at)
        at += 4
        return int(value)

    def text() -> str:
        nonlocal at
        n = i32()
        if n < 0 or at + n > len(data):
            raise DatabaseError(f"{index}: damaged volume header")
        value = data[at : at + n]
        at += n
        return value.decode("latin-1")

    version = i32()
    if version not in (4, 5):
        raise DatabaseError(f"{index}: BLAST database version {version}, not 4 or 5")
    protein = i32() == 1
    if version == 5:
        i32()  # the volume's number
    title = text()
    if version == 5:
        text()  # the LMDB file's name
    date = text().rstrip("\0")
    nseq = i32()
    if at + 12 > len(data):
        raise DatabaseError(f"{index}: truncated volume header")
    (length,) = struct.unpack_from("<q", data, at)
    at += 12  # the total length, then the longest sequence
    if nseq < 0 or length < 0:
        raise DatabaseError(f"{index}: damaged volume header")
    return Header(version, protein, title, date, nseq, int(length), at)


def read_volumes(arg: str, paths: list[str], dbtype: str) -> list[Volume]:
    volumes = []
    first = 0
    for path in paths:
        header = read_header(Path(path + _KINDS[dbtype] + "in"))
        if header.protein != (dbtype == "prot"):
            raise DatabaseError(f"{arg}: volume {path} is of another molecule type")
        volumes.append(Volume(path, first, header.nseq, header.length, header.date, header.version))
        first += header.nseq
    if first >= 2**31:
        raise DatabaseError(f"{arg}: {first:,} sequences, more than BLAST+ numbers")
    return volumes


def _has_seqids(paths: Sequence[str], dbtype: str) -> bool:
    """Whether makeblastdb kept the sequences' ids (-parse_seqids): an id index beside a volume."""
    k = _KINDS[dbtype]
    suffixes = (k + "og", k + "si", k + "ni")
    return any(Path(path + suffix).exists() for path in paths for suffix in suffixes)


def _misnumbered(paths: Sequence[str]) -> bool:
    """Whether the volumes of a database, in BLAST+'s order (names sorted as strings), are out of their
    numeric order: `db.10`, `db.100`, `db.11`."""
    numbers: dict[str, list[int]] = {}
    for path in paths:
        match = re.fullmatch(r"(.*)\.(\d+)", path)
        if match:
            numbers.setdefault(match.group(1), []).append(int(match.group(2)))
    return any(found != sorted(found) for found in numbers.values())


def _check_aliases(arg: str, cwd: Path, dbtype: str) -> None:
    """A user's alias that restricts its volumes (a subset list, an id range) is refused: its volumes are
    not what it searches."""
    for name in names(arg):
        base = Path(name) if Path(name).is_absolute() else cwd / name
        _check_alias_file(arg, base.with_name(base.name + _KINDS[dbtype] + "al"))


def _check_alias_file(arg: str, alias: Path) -> None:
    try:
        data = alias.read_bytes()[: 1 << 20]
    except OSError:
        return
    if (match := _RESTRICTING.search(data)) is not None:
        raise DatabaseError(
            f"{arg}: its alias file {alias.name} restricts its volumes ({match.group(1).decode()}): "
            "not supported yet; search the database it restricts, with -seqidlist or -taxids"
        )


def _check_builds(db: BlastDb) -> None:
    """The volumes of one database (same name but for the volume number) come from one makeblastdb run,
    which writes one date into all of them: other dates mean an update half done (a torn database)."""
    dates: dict[str, set[str]] = {}
    for volume in db.volumes:
        dates.setdefault(re.sub(r"\.\d+$", "", volume.path), set()).add(volume.date)
    for base, seen in dates.items():
        if len(seen) > 1:
            raise DatabaseError(
                f"{db.arg}: the volumes of {base} come from {len(seen)} builds ({', '.join(sorted(seen))}): an "
                "update is under way or was interrupted; search again once it is whole"
            )


# -- fragments ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """Fragment: ordinal ids `first`..`last` (global, inclusive) of volume `volume`."""

    volume: int
    first: int
    last: int
    length: int  # letters, measured or (nucleotides) estimated from the packed bytes


def fragment_ranges(db: BlastDb, wanted: int = DEFAULT_FRAGMENTS) -> list[Range]:
    """Contiguous ranges over the volumes, at least one per volume, about `wanted` in all, balanced by
    letters: a volume gets a share of the pieces proportional to its letters."""
    total = max(1, db.length)
    ranges: list[Range] = []
    for index, volume in enumerate(db.volumes):
        if volume.nseq == 0:
            continue
        pieces = max(1, min(volume.nseq, round(wanted * volume.length / total)))
        cuts = _cuts(db, volume, pieces)
        for start, end in zip(cuts, cuts[1:], strict=False):
            ranges.append(
                Range(index, volume.first + start, volume.first + end - 1, _letters(db, volume, start, end))
            )
    return ranges


def _cuts(db: BlastDb, volume: Volume, pieces: int) -> list[int]:
    """Local ids where the volume is cut into `pieces` of about equal letters (0 and nseq included)."""
    if pieces <= 1:
        return [0, volume.nseq]
    table = _OffsetTable(db, volume)
    cuts = [0]
    end_offset = table.offset(volume.nseq)
    start_offset = table.offset(0)
    for k in range(1, pieces):
        target = start_offset + (end_offset - start_offset) * k // pieces
        lo, hi = cuts[-1] + 1, volume.nseq - (pieces - k)
        while lo < hi:  # the first id whose offset reaches the target
            mid = (lo + hi) // 2
            if table.offset(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        cuts.append(max(cuts[-1] + 1, min(lo, volume.nseq - (pieces - k))))
    cuts.append(volume.nseq)
    return cuts


def _letters(db: BlastDb, volume: Volume, start: int, end: int) -> int:
    if start == 0 and end == volume.nseq:
        return volume.length
    table = _OffsetTable(db, volume)
    span = table.offset(end) - table.offset(start)
    if db.dbtype == "prot":
        return max(0, span - (end - start))  # a NUL between sequences
    whole = max(1, table.offset(volume.nseq) - table.offset(0))
    return volume.length * span // whole  # packed bases and ambiguities: an estimate by bytes


class _OffsetTable:
    """Reads single entries of a volume's sequence-offset table (big-endian uint32, nseq + 1 of them)."""

    def __init__(self, db: BlastDb, volume: Volume):
        index = Path(volume.path + _KINDS[db.dbtype] + "in")
        header = read_header(index)
        self.path = index
        self.at = header.offsets_at + 4 * (volume.nseq + 1)  # past the header-offset table

    def offset(self, local: int) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.at + 4 * local)
                raw = fh.read(4)
        except OSError as exc:
            raise DatabaseError(f"{self.path}: unreadable ({exc.strerror})") from exc
        if len(raw) != 4:
            raise DatabaseError(f"{self.path}: truncated offset table")
        return int(struct.unpack(">I", raw)[0])
