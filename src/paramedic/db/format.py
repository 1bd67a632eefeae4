"""`paramedic format`: a FASTA file -> one plain BLAST+ database, searched in place like any other.

Layout of `--out dbs/uniprot` (protein shown; nucleotide uses .nal):

    dbs/uniprot.pal                alias over the database: `-db dbs/uniprot` works for BLAST+ too
    dbs/uniprot/uniprot.*          what makeblastdb makes of the input (one or more volumes), nothing else
    dbs/uniprot/paramedic.json     a few hundred bytes: how many fragments to search it in, where it came
                                   from (the input's SHA-256, the taxid map's, the tools' versions)

The sequences are written once, by makeblastdb, streamed from the input (gzip undone): no copy of the
FASTA, no second database of fragments. A search finds it as BLAST+ does and cuts it into ordinal-id
ranges (paramedic.db.locate.in_place), `--fragments` of them. `--layout fragments` writes the layout of
earlier versions instead (paramedic.db.fragmented).

Everything is built in a temporary directory beside the target and renamed into place, so an interrupted
format leaves no half-made database under the target name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paramedic import __version__
from paramedic.blast.alias import write_alias
from paramedic.blast.programs import MolType, alias_suffix
from paramedic.blast.tools import blast_version
from paramedic.db.blastdb import fragment_ranges, open_blastdb
from paramedic.db.makeblastdb import database_size, file_sha256, make_streamed, taxid_map_args, warn
from paramedic.errors import DatabaseError, OutputError, UsageError

DESCRIPTION_NAME = "paramedic.json"
DESCRIPTION_KIND = "paramedic-format"
_MAX_DESCRIPTION = 64 << 10
LAYOUTS = ("blastdb", "fragments")


@dataclass(frozen=True)
class FormatSettings:
    input: Path
    dbtype: MolType
    fragments: int
    out: Path
    title: str | None = None  # default: the input path as given, without .gz (as makeblastdb would)
    force: bool = False
    jobs: int = os.cpu_count() or 1
    taxid_map: Path | None = None  # makeblastdb -taxid_map: "id taxid" lines, for -taxids and staxids
    parse_seqids: bool = True  # makeblastdb -parse_seqids: ids kept as ids (needed for -seqidlist)
    layout: str = "blastdb"


@dataclass(frozen=True)
class Formatted:
    """What a format made, for its summary line."""

    nseq: int
    length: int
    fragments: int
    layout: str


def format_database(settings: FormatSettings, progress: Callable[[str], None] = lambda _: None) -> Formatted:
    out = settings.out
    alias_path = out.parent / (out.name + alias_suffix(settings.dbtype))
    if settings.fragments < 1:
        raise UsageError("--fragments must be at least 1")
    if settings.layout not in LAYOUTS:
        raise UsageError(f"--layout {settings.layout}: choose {' or '.join(LAYOUTS)}")
    if settings.layout == "fragments" and not settings.parse_seqids:
        raise UsageError("--layout fragments keeps ids (-parse_seqids): drop --no-parse-seqids")
    if (out.exists() or alias_path.exists()) and not settings.force:
        raise OutputError(f"{out} already exists (use --force to replace it)")
    if not settings.input.is_file():
        raise UsageError(f"--in {settings.input}: no such file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    except OSError as exc:
        raise OutputError(f"cannot create {out.parent}: {exc.strerror}") from exc
    title = settings.title or _default_title(settings.input)
    try:
        if settings.layout == "fragments":
            from paramedic.db.fragmented import build_fragmented

            manifest = build_fragmented(
                settings.input, settings.dbtype, settings.fragments, title, settings.taxid_map,
                settings.jobs, build, progress,
            )  # fmt: skip
            made = Formatted(manifest.nseq, manifest.length, len(manifest.fragments), "fragments")
            entry = manifest.whole
        else:
            made = _build(settings, title, build, progress)
            entry = out.name
        _install(build, out, alias_path, f"{out.name}/{entry}", title, made)
        return made
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _build(settings: FormatSettings, title: str, build: Path, progress: Callable[[str], None]) -> Formatted:
    """makeblastdb on the input as it is, into `build` under the database's own name, and its description."""
    name = settings.out.name
    extra = ["-parse_seqids"] if settings.parse_seqids else []
    extra += taxid_map_args(settings.taxid_map)
    progress(f"makeblastdb: {settings.input}")
    input_sha256, warnings = make_streamed(build, settings.dbtype, settings.input, name, title, extra)
    for text in dict.fromkeys(warnings):
        warn(f"makeblastdb: {text}")
    nseq, length = database_size(build, name)
    if settings.fragments > nseq:
        raise UsageError(f"--fragments {settings.fragments} is more than the {nseq} sequences")
    description = {
        "kind": DESCRIPTION_KIND,
        "version": 1,
        "fragments": settings.fragments,
        "title": title,
        "input": str(settings.input),
        "input_sha256": input_sha256,
        "parse_seqids": settings.parse_seqids,
        "taxid_map_sha256": file_sha256(settings.taxid_map) if settings.taxid_map else None,
        "blast": blast_version(),
        "paramedic": __version__,
    }
    pieces = len(fragment_ranges(open_blastdb(name, build, settings.dbtype), settings.fragments))
    (build / DESCRIPTION_NAME).write_text(json.dumps(description, indent=2) + "\n")
    return Formatted(nseq, length, pieces, "blastdb")


def described_fragments(directory: Path) -> int | None:
    """The fragment count `paramedic format --fragments` recorded beside a database's volumes (None: the
    database was not made by `paramedic format`)."""
    path = directory / DESCRIPTION_NAME
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_DESCRIPTION + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DatabaseError(f"{path}: unreadable ({exc.strerror})") from exc
    try:
        text = json.loads(data) if len(data) <= _MAX_DESCRIPTION else None
        count = text["fragments"] if isinstance(text, dict) and text.get("kind") == DESCRIPTION_KIND else None
    except (ValueError, KeyError):
        count = None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1_000_000:
        raise DatabaseError(
            f"{path}: not a description `paramedic format` wrote (remove it, or format again)"
        )
    return count


def _default_title(path: Path) -> str:
    text = str(path)
    return text[: -len(".gz")] if text.endswith(".gz") else text


def _install(build: Path, out: Path, alias_path: Path, entry: str, title: str, made: Formatted) -> None:
    """Rename the finished build into place (one directory: atomic), then write the top-level alias."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
        os.replace(out, old)
    data_dir = build / "db"
    data_dir.mkdir()
    for path in list(build.iterdir()):
        if path != data_dir:
            os.replace(path, data_dir / path.name)
    os.replace(data_dir, out)
    write_alias(alias_path, [entry], title=title, nseq=made.nseq, length=made.length)
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(alias_path, 0o666 & ~mask)  # readable as makeblastdb's own files are (it was made private)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
