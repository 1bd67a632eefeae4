"""Running one BLAST+ search: a query batch against a fragment, or a regeneration against a mask.

Both kinds of run live here so that nothing outside `paramedic.blast` knows how BLAST+ is invoked.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paramedic.blast.alias import oid_mask, write_alias
from paramedic.blast.hits import Hit, parse_fragment_xml
from paramedic.blast.options import FORMATTING_ONLY, BlastOptions
from paramedic.blast.programs import alias_suffix
from paramedic.blast.tools import run_tool


@dataclass(frozen=True)
class Database:
    """What a rank needs to know about the formatted database."""

    arg: str  # the -db string exactly as the user gave it (outfmt 5 and 7 print it)
    directory: Path  # absolute path of the database directory
    dbtype: str
    title: str
    nseq: int
    length: int
    whole: str
    fragments: tuple[str, ...]  # fragment alias names inside `directory`


@dataclass(frozen=True)
class RunStats:
    seconds: float
    output_bytes: int


def write_queries(path: Path, queries: Sequence[tuple[str, str]]) -> None:
    with open(path, "w") as fh:
        for header, sequence in queries:
            fh.write(f">{header}\n{sequence}\n")


def search_fragment(
    program: str,
    options: BlastOptions,
    db: Database,
    fragment: int,
    queries: Sequence[tuple[str, str]],
    workdir: Path,
) -> tuple[list[list[Hit]], RunStats]:
    """Search a query batch against one fragment (whole-database statistics); merge keys per query."""
    query_file = workdir / "search-queries.fasta"
    xml_file = workdir / "search.xml"
    write_queries(query_file, queries)
    argv = [
        program,
        *options.without(*FORMATTING_ONLY, "query", "db", "max_target_seqs").argv(),
        "-query",
        str(query_file),
        "-db",
        str(db.directory / db.fragments[fragment]),
        "-max_target_seqs",
        str(options.hitlist_size()),
        "-outfmt",
        "5",
        "-out",
        str(xml_file),
    ]
    start = time.perf_counter()
    run_tool(argv, cwd=workdir)
    with open(xml_file, "rb") as fh:
        hits = parse_fragment_xml(fh, len(queries))
    stats = RunStats(time.perf_counter() - start, xml_file.stat().st_size)
    xml_file.unlink()
    return hits, stats


def regenerate(
    program: str,
    options: BlastOptions,
    db: Database,
    queries: Sequence[tuple[str, str]],
    subjects: Sequence[Sequence[int]] | None,
    workdir: Path,
) -> tuple[bytes, RunStats]:
    """The user's report for a query group, written by BLAST+ itself against the merged subjects only.

    The database is restricted with an OIDLIST alias over the whole database that carries the whole
    database's NSEQ, LENGTH and TITLE, placed so that the user's own -db string names it: titles, size
    lines, statistics and the printed -db argument all read as for the whole database.
    """
    run_dir = workdir / f"regen-{secrets.token_hex(4)}"
    run_dir.mkdir()
    absolute = Path(db.arg).is_absolute()
    db_name = f"paramedic-db-{secrets.token_hex(6)}" if absolute else db.arg
    alias = run_dir / (db_name + alias_suffix(db.dbtype))
    alias.parent.mkdir(parents=True, exist_ok=True)
    mask = None
    if subjects is not None:
        mask = run_dir / "subjects.msk"
        mask.write_bytes(oid_mask({gid for group in subjects for gid in group}, db.nseq))
    write_alias(
        alias,
        [str(db.directory / db.whole)],
        title=db.title,
        nseq=db.nseq,
        length=db.length,
        oidlist=str(mask) if mask else None,
    )
    query_file = run_dir / "queries.fasta"
    out_file = run_dir / "report.out"
    write_queries(query_file, queries)
    argv = [
        program,
        *options.without("query", "db", "out").argv(),
        "-query",
        str(query_file),
        "-db",
        db_name,
        "-out",
        str(out_file),
    ]
    start = time.perf_counter()
    run_tool(argv, cwd=run_dir)
    data = out_file.read_bytes()
    if absolute:
        # BLAST+ prints the -db argument as given (outfmt 5, 7, JSON): show the user's path.
        data = data.replace(db_name.encode(), db.arg.encode())
    stats = RunStats(time.perf_counter() - start, len(data))
    shutil.rmtree(run_dir)
    return data, stats
