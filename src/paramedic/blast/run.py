"""Running one BLAST+ search: a query batch against a fragment, or a regeneration against a mask.

Both kinds of run live here so that nothing outside `paramedic.blast` knows how BLAST+ is invoked.
"""

from __future__ import annotations

import bisect
import hashlib
import html
import json
import re
import secrets
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from paramedic.blast.alias import oid_mask, write_alias
from paramedic.blast.archive import parse_fragment_archive
from paramedic.blast.hits import FragmentSearch
from paramedic.blast.messages import pass_on
from paramedic.blast.options import FORMATTING_ONLY, BlastOptions
from paramedic.blast.prelim import (
    DUMP_NAME,
    INJECT_NAME,
    INJECT_NOTE,
    LISTS_NAME,
    batch_residues,
    environment,
    expected_limit,
    inject_environment,
    injected,
    read_dump,
    whole_lists,
)
from paramedic.blast.programs import alias_suffix
from paramedic.blast.seqid import subjects_by_id
from paramedic.blast.tools import run_tool
from paramedic.errors import BlastError

# Options that restrict the database to a subset. A positive one is resolved once per job into a
# `Subset` (paramedic.db.subset) and applied by masks, never passed to a fragment search; the negative ones
# (a sequence is dropped only when all of its ids are listed) go to BLAST+ whole, with --strategy queries.
POSITIVE = ("seqidlist", "taxids", "taxidlist")
NEGATIVE = ("negative_seqidlist", "negative_taxids", "negative_taxidlist")


@dataclass(frozen=True)
class Subset:
    """A restriction resolved: per volume of a database in place one bit per local id (most significant
    bit first, as OIDLIST masks hold them), and the subset's statistics, which BLAST+ computes a
    restricted search's e-values from (docs/DESIGN.md, "Statistics under a restriction")."""

    bits: tuple[bytes, ...]
    nseq: int
    length: int
    shortest: int
    longest: int

    def keys(self) -> dict[str, int]:
        return {
            "STATS_NSEQ": self.nseq,
            "STATS_TOTLEN": self.length,
            "MIN_SEQ_LENGTH": self.shortest,
            "MAX_SEQ_LENGTH": self.longest,
        }

    def mask(self, volume: int, count: int, low: int = 0, high: int | None = None) -> bytes:
        """The OIDLIST file of `volume`'s members among its local ids `low`..`high` (inclusive)."""
        high = count - 1 if high is None else high
        bits = bytearray(self.bits[volume])
        if low > 0 or high < count - 1:
            first, last = low >> 3, high >> 3
            bits[:first] = bytes(first)
            bits[last + 1 :] = bytes(len(bits) - last - 1)
            bits[first] &= 0xFF >> (low & 7)
            bits[last] &= (0xFF << (7 - (high & 7))) & 0xFF
        return struct.pack(">I", count) + bytes(bits)


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
    members_blake3: str = ""  # the manifest's digest of members.bin ("": read sequences.tsv)
    volumes: tuple[str, ...] = ()  # the fragments' BLAST+ volumes inside `directory`, for groups
    # A database searched in place (paramedic.db.blastdb): its volumes in BLAST+'s order, each as its
    # path (no extension), first global ordinal id, count and letters; empty for `paramedic format`'s
    spans: tuple[tuple[str, int, int, int], ...] = ()
    # In place: each fragment's volume (index into `spans`) and first and last global ordinal ids
    ranges: tuple[tuple[int, int, int], ...] = ()
    seqids: bool = False  # in place, made with -parse_seqids: subjects are named by their own ids
    subset: Subset | None = None  # in place: the job's positive restriction, resolved
    misnumbered: bool = False  # in place: ids looked up go wrong in BLAST+ itself (paramedic.db.blastdb)
    # in place: the manifest's volume digests (key, BLAKE3), sent to the workers with the job, so that a
    # rank that stages copies checks them against rank 0's digests without digesting the database again
    digests: tuple[tuple[str, str], ...] = ()

    @property
    def in_place(self) -> bool:
        return bool(self.spans)

    def searched_volumes(self, fragments: Sequence[int]) -> tuple[int, int]:
        """In place: the first and last index into `spans` of the volumes a search of `fragments` lists."""
        return self.ranges[fragments[0]][0], self.ranges[fragments[-1]][0]

    def searched_ids(self, fragments: Sequence[int]) -> Sequence[int]:
        """In place: global ordinal id of each ordinal id of a search of `fragments` (its alias lists
        their volumes: the first volume's first id plus the local one)."""
        low, high = self.searched_volumes(fragments)
        start = self.spans[low][1]
        return range(start, self.spans[high][1] + self.spans[high][2])

    def checked(self) -> str:
        """A -db that BLAST+ opens from any directory, for checking option values against."""
        target = self.spans[0][0] if self.in_place else str(self.directory)
        return f'"{target}"' if " " in target else target

    def span_paths(self, low: int = 0, high: int | None = None) -> list[str]:
        return [span[0] for span in self.spans[low : None if high is None else high + 1]]


@dataclass(frozen=True)
class RunStats:
    seconds: float
    output_bytes: int
    injected: int = 0  # batches whose given lists were aligned without a preliminary scan


def write_queries(path: Path, queries: Sequence[tuple[str, str]]) -> None:
    with open(path, "w") as fh:
        for header, sequence in queries:
            fh.write(f">{header}\n{sequence}\n")


def search_fragment(
    program: str,
    options: BlastOptions,
    db: Database,
    fragments: Sequence[int],
    queries: Sequence[tuple[str, str]],
    workdir: Path,
    keep_alignments: bool = False,
    gids: Callable[[], Sequence[int]] = tuple,
    prelim_only: bool = False,
    lists: bool = False,
) -> tuple[FragmentSearch, RunStats]:
    """Search a query batch against fragments (one, or a group of consecutive ones searched in one run:
    an alias over their volumes), with whole-database statistics; merge keys per query.

    The search writes an archive (outfmt 11): the keys at full precision, and with `keep_alignments`
    each hit's alignments, from which `paramedic.blast.render` writes the report without searching again.
    A preloaded shim writes BLAST+'s preliminary lists; `gids()` maps the searched ordinal ids to global
    (asked for once BLAST+ has run: reading the map may take a while, and BLAST+ need not wait for it).
    With `prelim_only` the search stops after BLAST+'s preliminary stage (the shim empties the lists the
    traceback would read): only the lists come back, and every query is aligned once, later, against the
    whole database's list (docs/DESIGN.md, "Traceback once"); with `lists` too, the kept lists come back
    whole, so that the piece aligns them without finding them again (`regenerate`'s `lists`).
    """
    query_file = workdir / "search-queries.fasta"
    archive_file = workdir / "search.asn"
    dump_file = workdir / DUMP_NAME
    lists_file = workdir / LISTS_NAME
    dump_file.unlink(missing_ok=True)
    lists_file.unlink(missing_ok=True)
    write_queries(query_file, queries)
    searched = _searched(db, fragments, workdir)
    argv = [
        program,
        *options.without(*FORMATTING_ONLY, "query", "db", "max_target_seqs", *_applied(db)).argv(),
        "-query",
        str(query_file),
        "-db",
        searched,
        "-max_target_seqs",
        str(options.hitlist_size()),
        "-outfmt",
        "11",
        "-out",
        str(archive_file),
    ]
    start = time.perf_counter()
    pass_on(program, run_tool(argv, cwd=workdir, extra_env=environment(prelim_only, lists, program)).stderr)
    data = archive_file.read_bytes()
    archive_file.unlink()
    try:
        dump = dump_file.read_bytes()
        dump_file.unlink()
    except FileNotFoundError:
        dump = b""
    try:
        offset = db.searched_ids(fragments)[0] if db.in_place else None
        subject = None
        if db.in_place and db.seqids and not prelim_only:  # subjects named by their own ids
            span = (db.ranges[fragments[0]][1], db.ranges[fragments[-1]][2])
            subject = subjects_by_id(data, searched, offset or 0, span, workdir, db.dbtype)
        hits = parse_fragment_archive(data, len(queries), keep_alignments, offset, subject)
    except ValueError as exc:
        raise BlastError(f"{program} on {_named(fragments)}: unreadable archive: {exc}") from exc
    if prelim_only and any(hits):
        raise BlastError(
            f"{program} on {_named(fragments)} aligned subjects after its preliminary stage: the shim "
            "that stops it there did not work with this BLAST+; use --strategy queries"
        )
    ids = gids()
    prelim = read_dump(dump, [len(s) for _, s in queries], batch_residues(program, options), ids)
    limit = expected_limit(options, program)
    if any(p is not None and p.limit != limit for p in prelim):
        raise BlastError(
            f"BLAST+ kept a preliminary list of another size than {limit}: this BLAST+ is not the 2.12 "
            "the fragments strategy is built for; use --strategy queries"
        )
    whole = None
    if lists:
        try:
            whole = whole_lists(lists_file.read_bytes(), len(queries), ids, program)
            lists_file.unlink()
        except FileNotFoundError:
            # no file: no batch kept a list (the shim writes a batch's record even when it is empty),
            # or the shim could not write it, and then the check below finds the lists missing
            whole = b"" if not any(prelim) else None
    return FragmentSearch(hits, prelim, whole), RunStats(time.perf_counter() - start, len(data))


def _searched(db: Database, fragments: Sequence[int], workdir: Path) -> str:
    """The -db of a fragment search: the fragment's own alias, or for a group one written in `workdir`
    over the group's volumes in order (so its ordinal ids are theirs, one after the other) with the
    whole database's statistics, as every fragment alias has them (docs/DESIGN.md, "Statistics and
    merge")."""
    if db.in_place:
        return _searched_in_place(db, fragments, workdir)
    if len(fragments) == 1:
        return str(db.directory / db.fragments[fragments[0]])
    alias = workdir / f"group-{fragments[0]}-{fragments[-1]}{alias_suffix(db.dbtype)}"
    if not alias.exists():  # written once per worker: a group is searched once per batch
        write_alias(
            alias,
            [str(db.directory / db.volumes[f]) for f in fragments],
            title=db.title,
            nseq=db.nseq,
            length=db.length,
            sync=False,
        )
    return str(alias.with_suffix(""))


def _applied(db: Database) -> tuple[str, ...]:
    """The restriction options a search leaves out because its alias applies them."""
    return POSITIVE if db.subset is not None else ()


def _searched_in_place(db: Database, fragments: Sequence[int], workdir: Path) -> str:
    """A database in place: an alias in `workdir` over the fragments' volumes with FIRST_OID and LAST_OID
    (1-based, inclusive, in the alias's own numbering) and the whole database's statistics. Nothing is
    written beside the user's volumes, and a search opens only the volumes it searches."""
    low, high = db.searched_volumes(fragments)
    # named by where the volumes are too: a fragment staged (--stage) is searched at its copy, or where it
    # lies when the copy no longer fits: an alias kept from one search must not send another elsewhere
    where = hashlib.blake2s("\0".join(db.span_paths(low, high)).encode(), digest_size=4).hexdigest()
    alias = workdir / f"range-{fragments[0]}-{fragments[-1]}-{where}{alias_suffix(db.dbtype)}"
    if db.subset is not None:
        if not alias.exists():
            _restricted_range(db, db.subset, fragments, alias)
        return str(alias.with_suffix(""))
    if not alias.exists():
        start = db.spans[low][1]
        write_alias(
            alias,
            db.span_paths(low, high),
            title=db.title,
            nseq=db.nseq,
            length=db.length,
            sync=False,
            keys={
                "FIRST_OID": db.ranges[fragments[0]][1] - start + 1,
                "LAST_OID": db.ranges[fragments[-1]][2] - start + 1,
            },
        )
    return str(alias.with_suffix(""))


def _restricted_range(db: Database, subset: Subset, fragments: Sequence[int], alias: Path) -> None:
    """A fragment search under a restriction: per volume an alias with the mask of its members in the
    fragments' range, over them one with the whole database's NSEQ, LENGTH and TITLE and the subset's
    statistics (FIRST_OID and LAST_OID are not needed: the masks hold the range)."""
    low, high = db.searched_volumes(fragments)
    first, last = db.ranges[fragments[0]][1], db.ranges[fragments[-1]][2]
    parts = []
    for index in range(low, high + 1):
        path, start, count, letters = db.spans[index]
        mask = alias.with_name(f"{alias.stem}-v{index}.msk")
        mask.write_bytes(subset.mask(index, count, max(0, first - start), min(count - 1, last - start)))
        part = alias.with_name(f"{alias.stem}-v{index}{alias.suffix}")
        write_alias(part, [path], title=db.title, nseq=count, length=letters, oidlist=str(mask), sync=False)
        parts.append(str(part.with_suffix("")))
    write_alias(alias, parts, title=db.title, nseq=db.nseq, length=db.length, sync=False, keys=subset.keys())


def _named(fragments: Sequence[int]) -> str:
    return f"fragment {fragments[0]}" if len(fragments) == 1 else f"fragments {fragments[0]}-{fragments[-1]}"


def regenerate(
    program: str,
    options: BlastOptions,
    db: Database,
    queries: Sequence[tuple[str, str]],
    subjects: Sequence[Sequence[int]] | None,
    workdir: Path,
    lists: bytes | None = None,
) -> tuple[bytes, RunStats]:
    """The user's report for a query group, written by BLAST+ itself against the merged subjects only.

    The database is restricted with an OIDLIST alias over the whole database that carries the whole
    database's NSEQ, LENGTH and TITLE, placed so that the user's own -db string names it: titles, size
    lines, statistics and the printed -db argument all read as for the whole database.

    With `lists` (prelim.injection: each query's preliminary list, HSPs included), BLAST+ aligns those
    lists without scanning the subjects for them (docs/DESIGN.md, "Traceback once"); a batch the shim
    cannot match is scanned as without them, against the same restriction.
    """
    run_dir = workdir / f"regen-{secrets.token_hex(4)}"
    run_dir.mkdir()
    db_name = user_db_name(db)
    place_database(
        run_dir, db, db_name, None if subjects is None else {gid for group in subjects for gid in group}
    )
    query_file = run_dir / "queries.fasta"
    out_file = run_dir / "report.out"
    write_queries(query_file, queries)
    argv = [
        program,
        *options.without("query", "db", "out", *_applied(db)).argv(),
        "-query",
        str(query_file),
        "-db",
        db_name,
        "-out",
        str(out_file),
    ]
    env = None
    if lists is not None:
        (run_dir / INJECT_NAME).write_bytes(lists)
        env = inject_environment(program, options)
    start = time.perf_counter()
    pass_on(program, run_tool(argv, cwd=run_dir, extra_env=env).stderr)
    data = as_user_db(out_file.read_bytes(), db, db_name, options.outfmt_number())
    if options.outfmt_number() == 17:
        data = sam_command_line(data, program, options)
    note = run_dir / INJECT_NOTE
    done = injected(note.read_text()) if lists is not None and note.is_file() else 0
    stats = RunStats(time.perf_counter() - start, len(data), done)
    shutil.rmtree(run_dir)
    return data, stats


def user_db_name(db: Database) -> str:
    """The -db string a regeneration run uses: the user's own (placed inside the run's directory), or a
    stand-in when the user's would reach outside it (an absolute path, a `..` component)."""
    path = Path(db.arg)
    if path.is_absolute() or ".." in path.parts or not path.parts or any(c in db.arg for c in " \"'"):
        return f"paramedic-db-{secrets.token_hex(6)}"
    return db.arg


def place_database(run_dir: Path, db: Database, db_name: str, subjects: set[int] | None) -> None:
    """An alias named `db_name` inside `run_dir` over the whole database, restricted to `subjects`.

    It carries the whole database's NSEQ, LENGTH and TITLE, so titles, size lines and statistics read
    as for the whole database; `subjects=None` means no restriction.
    """
    alias = run_dir / (db_name + alias_suffix(db.dbtype))
    alias.parent.mkdir(parents=True, exist_ok=True)
    if db.in_place:
        _place_in_place(run_dir, alias, db, subjects)
        return
    mask = None
    if subjects is not None:
        mask = run_dir / "subjects.msk"
        mask.write_bytes(oid_mask(subjects, db.nseq))
    write_alias(
        alias,
        [str(db.directory / db.whole)],
        title=db.title,
        nseq=db.nseq,
        length=db.length,
        oidlist=str(mask) if mask else None,
        sync=False,
    )


def _place_in_place(run_dir: Path, alias: Path, db: Database, subjects: set[int] | None) -> None:
    """The restricted alias over a database in place. An OIDLIST mask applies to each volume from its
    own first id, so each volume gets an alias of its own with its local mask. Every volume is listed, so
    that the search numbers subjects by their global ids (the lists a piece aligns name them so)."""
    suffix = alias_suffix(db.dbtype)
    keys = db.subset.keys() if db.subset is not None else None
    if subjects is None and db.subset is not None:
        entries = []
        for index, (path, _, count, letters) in enumerate(db.spans):
            mask = run_dir / f"v{index:06d}.msk"
            mask.write_bytes(db.subset.mask(index, count))
            part = run_dir / f"v{index:06d}{suffix}"
            write_alias(
                part, [path], title=db.title, nseq=count, length=letters, oidlist=str(mask), sync=False
            )
            entries.append(str(part.with_suffix("")))
    elif subjects is None:
        entries = db.span_paths()
    else:
        by_volume: dict[int, list[int]] = {}
        starts = [span[1] for span in db.spans]
        for gid in subjects:
            index = bisect.bisect_right(starts, gid) - 1
            if not 0 <= index < len(db.spans) or gid >= starts[index] + db.spans[index][2]:
                raise ValueError(f"ordinal id {gid} outside the database (0..{db.nseq - 1})")
            by_volume.setdefault(index, []).append(gid - starts[index])
        entries = []
        for index in range(len(db.spans)):
            path, _, count, letters = db.spans[index]
            mask = run_dir / f"v{index:06d}.msk"
            mask.write_bytes(oid_mask(by_volume.get(index, ()), count))
            part = run_dir / f"v{index:06d}{suffix}"
            write_alias(
                part, [path], title=db.title, nseq=count, length=letters, oidlist=str(mask), sync=False
            )
            entries.append(str(part.with_suffix("")))
    write_alias(alias, entries, title=db.title, nseq=db.nseq, length=db.length, sync=False, keys=keys)


def sam_command_line(report: bytes, program: str, options: BlastOptions) -> bytes:
    """SAM's @PG line holds BLAST+'s own command line (`CL:`): show the user's, as one BLAST+ run prints it
    (arguments joined by spaces, a trailing space), not the regeneration run's."""
    line = f"{program} {' '.join(options.argv())} ".encode()
    return re.sub(rb"^(@PG\t.*?\tCL:)[^\t\n]*", lambda m: m.group(1) + line, report, count=1, flags=re.M)


def as_user_db(report: bytes, db: Database, db_name: str, outfmt: int = 0) -> bytes:
    """BLAST+ prints the -db argument as given (outfmt 5, 7, JSON, the archive): show the user's, escaped
    as BLAST+ escapes it in that format (a quoted `-db '"dbs/uniprot"'`: `&quot;` in XML, `\\"` in JSON)."""
    if db_name == db.arg:
        return report
    return report.replace(db_name.encode(), _escaped(db.arg, outfmt).encode())


def _escaped(text: str, outfmt: int) -> str:
    if outfmt in (5, 14, 16):  # XML
        return html.escape(text, quote=True).replace("&#x27;", "&apos;")
    if outfmt in (12, 13, 15):  # JSON
        return json.dumps(text)[1:-1]
    if outfmt in (8, 9, 10, 11):  # ASN.1: a quote is doubled
        return text.replace('"', '""')
    return text


def search_whole(
    program: str,
    options: BlastOptions,
    queries: Path,
    threads: int,
    mt_mode: int,
    out_fd: int,
    cwd: Path,
) -> float:
    """One BLAST+ run over the user's own -db with the user's options, its report written to `out_fd`
    (the job's partial output file, or a stream it writes through): the "blast" plan
    (paramedic.engine.job.whole). `-num_threads threads`, and `-mt_mode 1` when asked (mode 0 is BLAST+'s
    default and not passed). Run in `cwd`, the user's directory, so that -db resolves and prints as
    BLAST+ run there would. Returns BLAST+'s wall seconds; a failure is one line (BlastError), a reader
    of standard output that went away is BrokenPipeError. BLAST+'s warnings are passed on."""
    import signal
    import subprocess

    from paramedic.blast.tools import first_error_line, require_tool

    argv = [
        require_tool(program),
        *options.without("query", "out", "num_threads", "mt_mode").argv(),
        "-query",
        str(queries),
        "-num_threads",
        str(max(1, threads)),
        *(["-mt_mode", str(mt_mode)] if mt_mode else []),
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise BlastError(f"cannot run {program}: {exc}") from exc
    try:
        _, stderr = proc.communicate()
    except BaseException:  # an interrupt: the run goes with the job
        proc.kill()
        proc.wait()
        raise
    if proc.returncode == -signal.SIGPIPE:
        raise BrokenPipeError(f"{program}: its output's reader went away")
    if proc.returncode != 0:
        raise BlastError(f"{program} failed (exit {proc.returncode}): {first_error_line(stderr)}")
    pass_on(program, stderr)
    return time.perf_counter() - start
