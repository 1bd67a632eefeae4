"""Reading FASTA (plain or gzip) and validating it before any BLAST+ program sees it.

The reader is our own, not Biopython's: Biopython strips trailing blanks from header lines, and
makeblastdb keeps them (UniProt headers end in a blank), which would change every report's deflines.
It also gives the checks a user needs a clear message for: text before the first record, empty ids or
sequences, letters that do not fit the molecule type.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from paramedic.blast.programs import MolType
from paramedic.errors import InputError

NUCLEOTIDE_LETTERS = frozenset("ACGTUNRYKMSWBDHVacgtunrykmswbdhv-")
PROTEIN_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz*-")
STRICT_NUCLEOTIDE = frozenset("ACGTUNacgtun")


@dataclass(frozen=True, slots=True)
class Record:
    header: str  # the full header line without '>'
    sequence: str  # letters only, no whitespace

    @property
    def seq_id(self) -> str:
        return self.header.split(None, 1)[0] if self.header.strip() else ""


def open_text(path: Path) -> io.TextIOBase:
    """Open plain or gzip FASTA (detected by magic bytes, not by name)."""
    try:
        with open(path, "rb") as probe:
            magic = probe.read(2)
        if magic == b"\x1f\x8b":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="ascii", errors="strict")
        return open(path, encoding="ascii", errors="strict")
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise InputError(f"{path}: is a directory, expected a FASTA file") from exc
    except PermissionError as exc:
        raise InputError(f"{path}: permission denied") from exc


def read_fasta(
    path: Path, moltype: MolType, warn: Callable[[str], None] | None = None, accepter: str = "makeblastdb"
) -> Iterator[Record]:
    """Yield validated records; raise InputError on the first problem, naming the record.

    `warn`: a guess (a protein made of nucleotide letters) is said once through it instead of refusing:
    `format` must accept what makeblastdb accepts for the same -dbtype, a search what BLAST+ accepts as
    a query (`accepter` names it in the warning), and A, C, G and T are amino acids too."""
    count = 0
    warned = warn is None
    try:
        with open_text(path) as handle:
            for header, sequence in _parse(handle, path):
                count += 1
                record = Record(header, sequence)
                guess = _check(record, count, path, moltype)
                if guess is not None:
                    if warn is None:
                        raise InputError(guess)
                    if not warned:
                        warned = True
                        warn(f"{guess} (accepted, as {accepter} accepts it; later ones are not listed)")
                yield record
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text FASTA file (non-ASCII byte at offset {exc.start})") from exc
    except (OSError, EOFError) as exc:  # truncated or corrupt gzip
        raise InputError(f"{path}: cannot read: {exc}") from exc
    if count == 0:
        raise InputError(f"{path}: empty FASTA file (no sequences)")


def _parse(handle: io.TextIOBase, path: Path) -> Iterator[tuple[str, str]]:
    """(header exactly as written, sequence letters) per record."""
    header: str | None = None
    parts: list[str] = []
    for line in handle:
        line = line.rstrip("\r\n")
        if line.startswith(">"):
            if header is not None:
                yield header, "".join(parts)
            header, parts = line[1:], []
        elif header is None:
            if line.strip():
                raise InputError(f"{path}: not FASTA: text before the first '>' header line")
        else:
            parts.append("".join(line.split()))
    if header is not None:
        yield header, "".join(parts)


def _check(record: Record, number: int, path: Path, moltype: MolType) -> str | None:
    """InputError for what BLAST+ refuses too; the text of a guess (not refused here) or None."""
    where = f"{path}: record {number}"
    if not record.seq_id:
        raise InputError(f"{where}: empty sequence id after '>'")
    where = f"{path}: sequence {record.seq_id!r}"
    if not record.sequence:
        raise InputError(f"{where}: empty sequence")
    letters = set(record.sequence)
    allowed = NUCLEOTIDE_LETTERS if moltype == "nucl" else PROTEIN_LETTERS
    bad = letters - allowed
    if bad:
        kind = "nucleotide" if moltype == "nucl" else "protein"
        hint = " (looks like protein)" if moltype == "nucl" and bad <= PROTEIN_LETTERS else ""
        raise InputError(f"{where}: letters {''.join(sorted(bad))!r} are not {kind}{hint}")
    if moltype == "prot" and len(record.sequence) >= 20:
        strict = sum(1 for c in record.sequence if c in STRICT_NUCLEOTIDE)
        if strict >= 0.9 * len(record.sequence):
            return f"{where}: looks like nucleotide, expected protein"
    return None
