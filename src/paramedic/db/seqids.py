"""Global ordinal id -> the whole database's own Seq-id, as text ASN.1 (for archives).

Fragment searches name subjects `lcl|g<gid>`. A report written by `blast_formatter` from their
alignments must name each subject as a search of the whole database would, so that the formatter finds
it in the whole database and prints its real ids and title. The Seq-ids come from BLAST+ itself
(`blastdbcmd -outfmt %d`, the stored definition lines), one line per sequence in ordinal order, with an
index of line offsets so that a lookup reads one line of a memory map, whatever the database's size.

    <db dir>/seqids.asn   the first Seq-id of each sequence's first definition line, one per line
    <db dir>/seqids.idx   little-endian uint64 offsets of the lines, plus the file size
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from paramedic.blast.tools import run_tool

SEQIDS_NAME = "seqids.asn"
SEQIDS_INDEX_NAME = "seqids.idx"
_DEFLINE_SET = b"Blast-def-line-set ::= {"
_SEQID_LIST = b"    seqid {"


def first_seqids(lines: Iterable[bytes]) -> Iterator[bytes]:
    """From `blastdbcmd -outfmt %d` output: each record's first Seq-id on one line."""
    state = "record"  # record -> seqid list -> in the first Seq-id -> skip to next record
    item: list[bytes] = []
    depth = 0
    for raw in lines:
        line = raw.rstrip(b"\n")
        if line.startswith(_DEFLINE_SET):
            if state != "record" and state != "done":
                raise ValueError("blastdbcmd: a definition line without a Seq-id")
            state = "seqids"
            continue
        if state == "seqids":
            if line == _SEQID_LIST:
                state = "item"
                item, depth = [], 0
            continue
        if state == "item":
            text = line.strip()
            item.append(text)
            depth += _braces(text)
            if depth <= 0:
                joined = b" ".join(item)
                yield joined[:-1] if joined.endswith(b",") else joined
                state = "done"
    if state not in ("record", "done"):
        raise ValueError("blastdbcmd: output ended inside a definition line")


def _braces(text: bytes) -> int:
    """Opening minus closing braces outside quoted strings."""
    depth = 0
    quoted = False
    for char in text:
        if char == 0x22:  # "
            quoted = not quoted
        elif not quoted and char == 0x7B:  # {
            depth += 1
        elif not quoted and char == 0x7D:  # }
            depth -= 1
    return depth


def write_seqid_table(db_dir: Path, whole: str, nseq: int) -> None:
    """Write seqids.asn and seqids.idx for the database `whole` in `db_dir`."""
    with tempfile.NamedTemporaryFile(dir=db_dir, prefix=".deflines-") as dump:
        run_tool(
            ["blastdbcmd", "-db", whole, "-entry", "all", "-outfmt", "%d"],
            cwd=db_dir,
            stdout_path=Path(dump.name),
        )
        offsets = [0]
        with open(dump.name, "rb") as deflines, open(db_dir / SEQIDS_NAME, "wb") as table:
            for seqid in first_seqids(deflines):
                table.write(seqid + b"\n")
                offsets.append(offsets[-1] + len(seqid) + 1)
    if len(offsets) != nseq + 1:
        raise ValueError(f"blastdbcmd listed {len(offsets) - 1} Seq-ids for {nseq} sequences")
    (db_dir / SEQIDS_INDEX_NAME).write_bytes(struct.pack(f"<{len(offsets)}Q", *offsets))


class SeqIdTable:
    """Read access to a database's Seq-id table (memory-mapped; opened once per process)."""

    def __init__(self, db_dir: Path):
        with open(db_dir / SEQIDS_NAME, "rb") as table, open(db_dir / SEQIDS_INDEX_NAME, "rb") as index:
            empty = os.fstat(table.fileno()).st_size == 0
            self._table = b"" if empty else mmap.mmap(table.fileno(), 0, access=mmap.ACCESS_READ)
            self._index = mmap.mmap(index.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = len(self._index) // 8 - 1

    def __call__(self, gid: int) -> bytes:
        if not 0 <= gid < self.size:
            raise ValueError(f"subject {gid} is not in the database ({self.size} sequences)")
        start, end = struct.unpack_from("<2Q", self._index, gid * 8)
        return bytes(self._table[start : end - 1])

    @staticmethod
    def exists(db_dir: Path) -> bool:
        return (db_dir / SEQIDS_NAME).is_file() and (db_dir / SEQIDS_INDEX_NAME).is_file()


@functools.cache
def seqid_table(db_dir: Path) -> SeqIdTable:
    """This process's table for a database directory (opened once)."""
    return SeqIdTable(db_dir)
