"""Finding a database made by `paramedic format` as BLAST+ resolves -db, and checking it is complete.

Used by the search (the compute site's database) and by the storage site (its replica): both must find and
check a database the same way, and the storage site must not depend on the search engine to do it.
"""

from __future__ import annotations

import os
from pathlib import Path

from paramedic.blast.programs import alias_suffix
from paramedic.blast.run import Database
from paramedic.db.manifest import Manifest, load_manifest, verify_volumes
from paramedic.errors import DatabaseError


def _resolve(cwd: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else cwd / p


def resolve_database(arg: str, cwd: Path, digest: bool = True) -> tuple[Database, Manifest]:
    """Find the database as BLAST+ does (current directory, then $BLASTDB) and check it is complete;
    `digest`: and its bytes against the manifest (the job that searches it does; a check before the job
    starts need not read it twice)."""
    candidates = [_resolve(cwd, arg)]
    if not Path(arg).is_absolute():
        candidates += [Path(d) / arg for d in os.environ.get("BLASTDB", "").split(":") if d]
    directory = next((c for c in candidates if (c / "manifest.json").is_file()), None)
    if directory is None:
        if any(c.with_name(c.name + suffix).exists() for c in candidates for suffix in (".pal", ".nal")):
            raise DatabaseError(f"{arg}: a BLAST+ database but not one made by `paramedic format`")
        raise DatabaseError(f"database {arg!r} not found (looked in {', '.join(str(c) for c in candidates)})")
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
