"""The BLAST+ search programs and what they expect: the only table of program facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MolType = Literal["nucl", "prot"]


@dataclass(frozen=True)
class Program:
    name: str
    query_type: MolType
    db_type: MolType


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program("blastn", "nucl", "nucl"),
        Program("blastp", "prot", "prot"),
        Program("blastx", "nucl", "prot"),
        Program("tblastn", "prot", "nucl"),
        Program("tblastx", "nucl", "nucl"),
    )
}


def alias_suffix(db_type: str) -> str:
    """Alias files are .pal for protein and .nal for nucleotide databases."""
    return ".pal" if db_type == "prot" else ".nal"
