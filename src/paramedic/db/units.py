"""What a database searched in place is staged and served as: one unit per user volume (its own files),
and per version-5 database its shared files (.pdb, .pos, .pot, .ptf, .pto), which BLAST+ opens beside
every volume (the .pin names its .pdb; a volume cannot be opened without it).

Two sites name a unit by what both agree on once their manifests' checksums are equal (paths excluded):
its file-name prefix (`db.03`, or `db` for the shared files), which is part of the volume's digest key
(paramedic.db.locate: "first name nseq length date", "shared base date"). Bytes are checked against the
same digest the manifest holds: BLAKE3 over each file's name and BLAKE3, in name order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3

from paramedic.db.manifest import Listings, volume_files_in_place
from paramedic.errors import DatabaseError, UsageError


@dataclass(frozen=True)
class Unit:
    """One staging unit: `name` is its directory in the cache entry, `base` the prefix of its files."""

    name: str  # v00003 (a volume, by its index in BLAST+'s order) or s000 (a database's shared files)
    base: str
    digest: str  # the manifest's volume_blake3 value
    shared: str | None = None  # a volume's shared unit (`name`), linked beside it; None: none needed


def shared_base(volume_name: str) -> str:
    """The base name of a volume's database (`db.03` -> `db`); a single volume is its own base."""
    return re.sub(r"\.\d+$", "", volume_name)


def plan_units(
    spans: Sequence[tuple[str, int, int, int]], volume_blake3: dict[str, str], where: str
) -> tuple[list[Unit], list[Unit]]:
    """Per volume (in `spans`' order) its unit, and the shared units, from the manifest's digest keys.
    UsageError, in one line, when two volumes (or two databases' shared files) share a file name: a
    copy holds them under their own names, and BLAST+ orders volumes by those names."""
    names = [Path(path).name for path, *_ in spans]
    check_names([path for path, *_ in spans], where)
    volumes: list[Unit] = []
    shared: dict[str, Unit] = {}
    for index, ((_, first, nseq, length), name) in enumerate(zip(spans, names, strict=True)):
        prefix = f"{first} {name} {nseq} {length} "
        found = [key for key in volume_blake3 if key.startswith(prefix)]
        if len(found) != 1:
            raise DatabaseError(f"{where}: volume {name} has no digest in its manifest")
        date = found[0][len(prefix) :]
        key = f"shared {shared_base(name)} {date}"
        link = None
        if shared_base(name) != name and key in volume_blake3:
            if key not in shared:
                shared[key] = Unit(f"s{len(shared):03d}", shared_base(name), volume_blake3[key])
            link = shared[key].name
        volumes.append(Unit(f"v{index:05d}", name, volume_blake3[found[0]], link))
    return volumes, list(shared.values())


def check_names(volume_paths: Sequence[str], where: str) -> None:
    """UsageError, in one line, when two volumes, or two databases' shared files, have the same name in
    different directories: a copy holds them under their own names (BLAST+ orders volumes by them), and
    two sites name them by those names."""
    names = [Path(path).name for path in volume_paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(
            f"--stage/--mirror: {where} has two volumes named {twice[0]} in different directories; a staged "
            "copy keeps volume names: search it without --stage and --mirror"
        )
    bases = {(str(Path(path).parent), shared_base(Path(path).name)) for path in volume_paths}
    bases = {(d, b) for d, b in bases if (b not in names)}
    listed = [b for _, b in bases]
    clash = sorted({b for b in listed if listed.count(b) > 1})
    if clash:
        raise UsageError(
            f"--stage/--mirror: {where} has two databases named {clash[0]} in different directories; a "
            "staged copy keeps file names: search it without --stage and --mirror"
        )


def served_files(volume_paths: Iterable[str]) -> dict[str, list[Path]]:
    """What a replica serves, by unit base: each volume's own files and its database's shared ones,
    built once from the volumes' paths (a whitelist: a request names a base or a file, never a path)."""
    listings = Listings()
    out: dict[str, list[Path]] = {}
    for path in volume_paths:
        own, shared = volume_files_in_place(Path(path), listings)
        for base, files in ((Path(path).name, own), (shared_base(Path(path).name), shared)):
            if files:
                if base in out and out[base] != files:
                    raise UsageError(f"{path}: another volume or database has the file names of {base}")
                out[base] = files
    return out


def combined(named: Iterable[tuple[str, str]]) -> str:
    """A unit's digest from its files' (name, BLAKE3) in name order: as paramedic.db.locate keys it."""
    return blake3.blake3("".join(f"{name}\0{digest}\n" for name, digest in named).encode()).hexdigest()


def unit_digest(directory: Path, base: str) -> str:
    """The digest of the unit `base` whose files are in `directory` (a copy: digested afresh, never
    remembered); a unit's shared files are named `base.ext`, a volume's `base.ext` too."""
    from paramedic.db.trust import file_digest

    files = sorted(
        p
        for p in directory.iterdir()
        if p.name.startswith(base + ".") and not p.is_symlink() and p.suffix not in (".pal", ".nal")
    )
    if not files:
        raise DatabaseError(f"{directory}: no files of {base}")
    return combined((p.name, file_digest(p)) for p in files)
