"""A restricted search's subset (-seqidlist, -taxids, -taxidlist), resolved once per job by BLAST+ itself.

Fragment searches cannot pass the user's list on: BLAST+ would compute each fragment's statistics from its
own part of the subset. Instead the subset is resolved once, here, and every fragment search and every
regeneration gets it as per-volume OIDLIST masks with the subset's statistics in its alias (docs/DESIGN.md,
"Statistics under a restriction"): STATS_NSEQ and STATS_TOTLEN of the subset (nucleotide lengths as BLAST+'s
scan approximates them: (bytes - 1) * 4 + (local id mod 4)), MIN_SEQ_LENGTH and MAX_SEQ_LENGTH of the
subset, NSEQ and LENGTH of the whole database for the report's size lines.

The members come from BLAST+'s own database reader, so that ids match as a search matches them: a
`-seqidlist` through an alias's SEQIDLIST (`blastdbcmd -entry all` lists exactly its members), taxids
through `blastdbcmd -taxids`/`-taxidlist`. Lengths come from the volumes' offset tables.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paramedic.blast.alias import write_alias
from paramedic.blast.options import BlastOptions
from paramedic.blast.programs import alias_suffix
from paramedic.blast.run import POSITIVE, Database, Subset
from paramedic.blast.tools import run_tool
from paramedic.db.blastdb import read_header
from paramedic.errors import BlastError, DatabaseError, UsageError

if TYPE_CHECKING:  # numpy is imported by the functions that count (0.1 s of every search's start else)
    import numpy as np

# Restrictions the fragments strategy applies exactly (a member is any sequence one of whose ids or taxids
# is listed); the negative lists keep a sequence unless all of its ids are listed, which BLAST+ alone
# knows: they are passed to BLAST+ whole, with --strategy queries.
FILE_VALUED = ("seqidlist", "taxidlist", "negative_seqidlist", "negative_taxidlist")


def restriction(options: BlastOptions) -> str | None:
    """The one positive restriction option given (None: none); BLAST+ takes one at a time."""
    given = [name for name in POSITIVE if options.has(name)]
    return given[0] if given else None


def with_absolute_lists(options: BlastOptions, cwd: Path) -> BlastOptions:
    """List files named relative to the user's directory, made absolute: BLAST+ runs elsewhere."""
    changes: dict[str, str | None] = {}
    for name in FILE_VALUED:
        value = options.get(name)
        if value and not Path(value).is_absolute():
            changes[name] = str(cwd / value)
    return options.with_(**changes) if changes else options


def resolve_subset(db: Database, options: BlastOptions, cwd: Path) -> Subset:
    """The members of the database that the job's positive restriction selects, with their statistics."""
    name = restriction(options)
    if name is None:
        raise UsageError("internal: no restriction to resolve")
    value = options.get(name) or ""
    import numpy as np

    oids = _members(db, name, value, cwd)  # a member listed twice sets its bit twice
    bits: list[bytes] = []
    starts = np.asarray([span[1] for span in db.spans], dtype=np.int64)
    where = np.searchsorted(starts, oids, side="right") - 1
    for index, (_, first, nseq, _) in enumerate(db.spans):
        local = oids[where == index] - first
        if local.size and (local.min() < 0 or local.max() >= nseq):
            raise DatabaseError(f"{db.arg}: BLAST+ listed an ordinal id outside its volumes")
        mask = np.zeros(nseq, dtype=bool)
        mask[local] = True
        bits.append(np.packbits(mask).tobytes())
    return subset_of_masks(db, bits)


def subset_of_masks(db: Database, bits: Sequence[bytes]) -> Subset:
    """The subset whose members are the set bits of `bits` (per volume of `db`, one bit per local id,
    most significant first), with its statistics counted from `db`'s own volumes: a storage site counts
    them from its replica rather than believe a sender's numbers. ValueError when the masks do not fit
    `db`'s volumes (another count of volumes, another size, a bit set past a volume's last id)."""
    import numpy as np

    if len(bits) != len(db.spans):
        raise ValueError(f"masks for {len(bits)} volumes, the database has {len(db.spans)}")
    count = total = 0
    shortest, longest = 2**62, 0
    for index, (path, _, nseq, _) in enumerate(db.spans):
        mask = bits[index]
        if len(mask) != (nseq + 7) // 8:
            raise ValueError(f"volume {index}'s mask is {len(mask)} bytes, not {(nseq + 7) // 8}")
        flags = np.unpackbits(np.frombuffer(mask, dtype=np.uint8))
        if flags[nseq:].any():
            raise ValueError(f"volume {index}'s mask selects an id past its {nseq} sequences")
        local = np.flatnonzero(flags[:nseq])
        if local.size:
            lengths = _lengths(Path(path), db.dbtype, local)
            count += int(local.size)
            total += int(lengths.sum())
            shortest = min(shortest, int(lengths.min()))
            longest = max(longest, int(lengths.max()))
    return Subset(tuple(bits), count, total, shortest if count else 0, longest)


def _members(db: Database, name: str, value: str, cwd: Path) -> np.ndarray:
    """Global ordinal ids of the members, as BLAST+ reads the list."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="paramedic-subset-") as tmp:
        if name == "seqidlist":
            listed = Path(value) if Path(value).is_absolute() else cwd / value
            if not listed.is_file():
                raise UsageError(f"-seqidlist {value}: no such file")
            alias = Path(tmp) / ("subset" + alias_suffix(db.dbtype))
            write_alias(alias, db.span_paths(), title=db.title, nseq=db.nseq, length=db.length, sync=False)
            text = alias.read_text() + f"SEQIDLIST {_quoted(str(listed))}\n"
            alias.write_text(text)
            argv = ["blastdbcmd", "-db", str(alias.with_suffix("")), "-entry", "all"]
        else:
            flag = "-taxids" if name == "taxids" else "-taxidlist"
            if name == "taxidlist":
                value = str(Path(value) if Path(value).is_absolute() else cwd / value)
            argv = ["blastdbcmd", "-db", _db_list(db), flag, value]
        argv += ["-dbtype", db.dbtype, "-outfmt", "%o"]
        try:
            out = run_tool(argv, cwd=tmp).stdout
        except BlastError as exc:
            raise UsageError(f"-{name} {value}: {_reason(exc)}") from exc
    try:
        return np.array(out.split(), dtype=np.int64)  # 0.2 s for a million ids (int() each: 0.6 s)
    except ValueError as exc:
        raise DatabaseError(
            f"{db.arg}: blastdbcmd listed the subset in a way paramedic does not know"
        ) from exc


def _db_list(db: Database) -> str:
    return " ".join(_quoted(path) for path in db.span_paths())


def _quoted(path: str) -> str:
    return f'"{path}"' if " " in path else path


def _reason(exc: BlastError) -> str:
    text = str(exc)
    return text.split("Error:")[-1].strip() or text


def _lengths(volume: Path, dbtype: str, local: np.ndarray) -> np.ndarray:
    """Each member's length as BLAST+'s scan of a restricted database counts it: proteins exactly (the
    sequence bytes less the separator), nucleotides approximately from the packed bytes."""
    import numpy as np

    suffix = ".pin" if dbtype == "prot" else ".nin"
    index = volume.with_name(volume.name + suffix)
    header = read_header(index)
    n = header.nseq
    table = np.memmap(index, dtype=">u4", mode="r", offset=header.offsets_at)
    seq = np.asarray(table[n + 1 : 2 * (n + 1)], dtype=np.int64)
    if dbtype == "prot":
        return seq[local + 1] - seq[local] - 1
    amb = np.asarray(table[2 * (n + 1) : 3 * (n + 1)], dtype=np.int64)
    return (amb[local] - seq[local] - 1) * 4 + (local & 3)
