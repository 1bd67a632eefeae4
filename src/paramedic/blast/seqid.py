"""Subjects named by their own ids, back to ordinal ids: fragment searches of a database made with
-parse_seqids (every NCBI database) searched in place.

Their archives name a subject by its Seq-id (`swissprot { name "A7TBS3_NEMVE", accession "A7TBS3" }`), not
by its ordinal id, which the merge orders ties by and the metadata is made of. Each Seq-id is written as
the identifier BLAST+ looks up (`A7TBS3`, `XP_012345.1`, `gi|123`, `lcl|seq1`, `gnl|db|tag`, `pdb|1ABC|A`),
and `blastdbcmd -entry_batch` over the very alias the fragment was searched with returns their ordinal ids
in that search's numbering, in input order (measured), from the database's own index. One process per
fragment search that found hits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from paramedic.blast.archive import seq_aligns
from paramedic.blast.tools import run_tool
from paramedic.errors import BlastError

_IDS = re.compile(rb'ids \{\s+local str "Query_\d+",\s+')
# Text Seq-id choices that hold a Textseq-id { name, accession, release, version }
_TEXTSEQ = (
    b"genbank", b"embl", b"ddbj", b"pir", b"swissprot", b"other", b"prf", b"tpg", b"tpe", b"tpd", b"gpipe",
    b"named-annot-track",
)  # fmt: skip
_FIELD = re.compile(rb'(name|accession|release) "((?:[^"]|"")*)"|version (\d+)')


def subject_text(block: bytes) -> bytes:
    """The ASN.1 text of a Seq-align's subject Seq-id (the second of its `ids`)."""
    match = _IDS.search(block)
    if match is None:
        raise ValueError("BLAST archive: an alignment without a subject id")
    start = at = match.end()
    depth = 0
    while at < len(block):
        char = block[at : at + 1]
        if char == b'"':
            at = block.index(b'"', at + 1) + 1
            while block[at : at + 1] == b'"':  # a doubled quote inside a string
                at = block.index(b'"', at + 1) + 1
            continue
        if char == b"{":
            depth += 1
        elif char == b"}":
            if depth == 0:
                return block[start:at].strip()
            depth -= 1
        elif char == b"," and depth == 0:
            return block[start:at].strip()
        at += 1
    raise ValueError("BLAST archive: an unterminated subject id")


def lookup_name(seqid: bytes) -> str:
    """The identifier `blastdbcmd -entry` finds a Seq-id by (ValueError for a kind it does not know)."""
    kind, _, rest = seqid.partition(b" ")
    rest = rest.strip()
    if kind == b"gi":
        return f"gi|{int(rest)}"
    if kind == b"local":
        if rest.startswith(b"str "):
            return "lcl|" + _unquoted(rest[4:].strip()[1:-1])
        return f"lcl|{int(rest.removeprefix(b'id '))}"
    if kind == b"general":
        db = re.search(rb'db "((?:[^"]|"")*)"', rest)
        tag = re.search(rb'tag (?:str "((?:[^"]|"")*)"|id (\d+))', rest)
        if db is None or tag is None:
            raise ValueError(f"an unreadable general id: {seqid[:80]!r}")
        value = _unquoted(tag.group(1)) if tag.group(1) is not None else tag.group(2).decode()
        return f"gnl|{_unquoted(db.group(1))}|{value}"
    if kind == b"pdb":
        mol = re.search(rb'mol "([^"]*)"', rest)
        chain = re.search(rb'chain-id "([^"]*)"', rest) or re.search(rb"chain (\d+)", rest)
        if mol is None:
            raise ValueError(f"an unreadable pdb id: {seqid[:80]!r}")
        if chain is None:
            return f"pdb|{mol.group(1).decode()}"
        value = chain.group(1).decode()
        return f"pdb|{mol.group(1).decode()}|{chr(int(value)) if value.isdigit() else value}"
    if kind in _TEXTSEQ:
        fields: dict[str, str] = {}
        version = ""
        for name, text, number in _FIELD.findall(rest):
            if number:
                version = "." + number.decode()
            else:
                fields[name.decode()] = _unquoted(text)
        if "accession" in fields:
            return fields["accession"] + version
        if "name" in fields:
            return fields["name"]
        raise ValueError(f"a text id without accession or name: {seqid[:80]!r}")
    raise ValueError(f"a kind of Seq-id paramedic cannot look up: {kind.decode(errors='replace')}")


def _unquoted(text: bytes) -> str:
    """An ASN.1 string's inside (its quotes doubled) as text."""
    return text.replace(b'""', b'"').decode(errors="replace")


def ordinal_ids(alias: str, names: Sequence[str], workdir: Path, dbtype: str) -> list[int]:
    """The ordinal id, in the numbering of a search of `alias`, of each identifier in `names`."""
    listed = workdir / "subjects.ids"
    listed.write_text("".join(f"{name}\n" for name in names))
    try:
        out = run_tool(
            ["blastdbcmd", "-db", alias, "-dbtype", dbtype, "-entry_batch", str(listed), "-outfmt", "%o"],
            cwd=workdir,
        ).stdout.split()
    except BlastError as exc:
        raise BlastError(f"cannot find a fragment search's subjects by their ids: {exc}") from exc
    finally:
        listed.unlink(missing_ok=True)
    if len(out) != len(names):
        raise BlastError(
            f"blastdbcmd found {len(out)} ordinal ids for {len(names)} subject ids (an id the database holds "
            "twice, or none): use --strategy queries"
        )
    return [int(x) for x in out]


def subjects_by_id(
    data: bytes, alias: str, start: int, span: tuple[int, int], workdir: Path, dbtype: str
) -> Callable[[bytes], int]:
    """For a fragment search's archive: the global id of each Seq-align's subject. `alias` is the -db the
    search ran on, whose ordinal ids start at global id `start`; every subject must lie in `span` (the
    fragments searched, global ids, inclusive), else the id is not the one BLAST+ aligned (an id held
    twice)."""
    first, last = span
    texts = sorted({subject_text(block) for block in seq_aligns(data)})
    try:
        names = [lookup_name(text) for text in texts]
    except ValueError as exc:
        raise BlastError(f"{exc}: use --strategy queries") from exc
    found = ordinal_ids(alias, names, workdir, dbtype) if names else []
    table: dict[bytes, int] = {}
    for text, name, oid in zip(texts, names, found, strict=True):
        gid = oid + start
        if not first <= gid <= last:
            raise BlastError(
                f"subject {name} is held more than once in the database (found outside the fragment searched): "
                "use --strategy queries"
            )
        table[text] = gid
    return lambda block: table[subject_text(block)]
