"""BLAST+ alias files and ordinal-id masks: how a fragment or a subset reports whole-database statistics.

An alias with `NSEQ` and `LENGTH` of the whole database makes BLAST+ compute e-values (blastp and blastn)
and print size lines exactly as for the whole database; `OIDLIST` restricts a search to a bit mask of
ordinal ids without copying any sequence (see docs/DESIGN.md, "Statistics and merge").
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from paramedic.durable import write_durably


def write_alias(
    path: Path,
    dblist: Iterable[str],
    *,
    title: str,
    nseq: int,
    length: int,
    oidlist: str | None = None,
    sync: bool = True,
    keys: dict[str, int] | None = None,
) -> None:
    """Write an alias file (path ends in .pal or .nal); written whole, then renamed into place.
    `sync=False` for a search's scratch alias, which does not outlive the job (two fsyncs each, on the
    way to every fragment search and piece)."""
    data = alias_bytes(dblist, title=title, nseq=nseq, length=length, oidlist=oidlist, keys=keys)
    write_durably(path, data, sync=sync)


def alias_bytes(
    dblist: Iterable[str],
    *,
    title: str,
    nseq: int,
    length: int,
    oidlist: str | None = None,
    keys: dict[str, int] | None = None,
) -> bytes:
    """An alias file's bytes (what `write_alias` writes: a copy's alias can be compared with them).
    `keys`: more numeric keys (FIRST_OID and LAST_OID, 1-based and inclusive, select a range of the
    alias's own ordinal ids; STATS_NSEQ, STATS_TOTLEN, MIN_SEQ_LENGTH, ...)."""
    lines = [f"TITLE {title}", "DBLIST " + " ".join(_quote(d) for d in dblist)]
    if oidlist is not None:
        lines.append(f"OIDLIST {_quote(oidlist)}")
    lines += [f"NSEQ {nseq}", f"LENGTH {length}"]
    lines += [f"{key} {value}" for key, value in (keys or {}).items()]
    return ("\n".join(lines) + "\n").encode()


def _quote(entry: str) -> str:
    # BLAST+ splits DBLIST on spaces unless the entry is double-quoted.
    return f'"{entry}"' if " " in entry else entry


def oid_mask(oids: Iterable[int], nseq: int) -> bytes:
    """The OIDLIST mask format: 4-byte big-endian count of ids, then one bit per id, MSB first."""
    bits = bytearray((nseq + 7) // 8)
    for oid in oids:
        if not 0 <= oid < nseq:
            raise ValueError(f"ordinal id {oid} outside the database (0..{nseq - 1})")
        bits[oid >> 3] |= 0x80 >> (oid & 7)
    return struct.pack(">I", nseq) + bytes(bits)
