"""`paramedic format`: a FASTA file -> a segmented BLAST+ database with a manifest.

Layout of `--out dbs/uniprot` (protein shown; nucleotide uses .nal):

    dbs/uniprot.pal              alias over the whole database: `-db dbs/uniprot` works for BLAST+ too
    dbs/uniprot/manifest.json    totals, fragments, checksums, tool versions
    dbs/uniprot/sequences.tsv    global ordinal id -> fragment, length, sequence id
    dbs/uniprot/seqids.*         global ordinal id -> the whole database's Seq-id (reports from archives)
    dbs/uniprot/whole.*          the input as one BLAST+ database, original order and ids (lookups and
                                 regeneration: its ordinal ids are the global ids)
    dbs/uniprot/f003.*           fragment 3: makeblastdb -parse_seqids, ids `lcl|g<global id>`
    dbs/uniprot/frag003.pal      fragment 3 with the whole database's NSEQ and LENGTH

Everything is built in a temporary directory beside the target and renamed into place, so an interrupted
format leaves no half-made database under the target name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import blake3

from paramedic import __version__
from paramedic.blast.alias import write_alias
from paramedic.blast.hits import FRAGMENT_ID_PREFIX
from paramedic.blast.programs import MolType, alias_suffix
from paramedic.blast.tools import blast_version, run_tool
from paramedic.db.fasta import read_fasta
from paramedic.db.manifest import (
    FORMAT_VERSION,
    FRAGMENT_DIGESTS,
    MANIFEST_NAME,
    MEMBERS_NAME,
    SEQUENCES_NAME,
    WHOLE_NAME,
    Fragment,
    Manifest,
    members_bytes,
    volume_blake3,
    volume_sha256,
)
from paramedic.db.segment import assign_fragments
from paramedic.db.seqids import write_seqid_table
from paramedic.errors import BlastError, InputError, OutputError, UsageError


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


def format_database(settings: FormatSettings, progress: Callable[[str], None] = lambda _: None) -> Manifest:
    out = settings.out
    alias_path = out.parent / (out.name + alias_suffix(settings.dbtype))
    if settings.fragments < 1:
        raise UsageError("--fragments must be at least 1")
    if (out.exists() or alias_path.exists()) and not settings.force:
        raise OutputError(f"{out} already exists (use --force to replace it)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    except OSError as exc:
        raise OutputError(f"cannot create {out.parent}: {exc.strerror}") from exc
    try:
        manifest = _build(settings, build, progress)
        _install(build, out, alias_path, manifest)
        return manifest
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _build(settings: FormatSettings, build: Path, progress: Callable[[str], None]) -> Manifest:
    title = settings.title or _default_title(settings.input)
    progress(f"reading {settings.input}")
    lengths: list[int] = []
    ids: list[str] = []
    seen: dict[str, int] = {}
    digest = hashlib.sha256()
    whole_fasta = build / "whole.fasta"
    with open(whole_fasta, "w") as whole:
        for record in read_fasta(settings.input, settings.dbtype, warn=_warn):
            if record.seq_id in seen:
                raise InputError(
                    f"{settings.input}: duplicate sequence id {record.seq_id!r} "
                    f"(records {seen[record.seq_id] + 1} and {len(ids) + 1})"
                )
            seen[record.seq_id] = len(ids)
            text = f">{record.header}\n{record.sequence}\n"
            whole.write(text)
            digest.update(text.encode())
            ids.append(record.seq_id)
            lengths.append(len(record.sequence))
    if settings.fragments > len(lengths):
        raise UsageError(f"--fragments {settings.fragments} is more than the {len(lengths)} sequences")

    members = assign_fragments(lengths, settings.fragments)
    fragment_of = [0] * len(lengths)
    for frag, gids in enumerate(members):
        for gid in gids:
            fragment_of[gid] = frag
    volumes = [f"f{i:03d}" for i in range(settings.fragments)]
    _write_fragment_fastas(whole_fasta, fragment_of, [build / f"{v}.fasta" for v in volumes])

    progress(f"makeblastdb: whole database and {settings.fragments} fragments")
    taxids = _taxid_map(settings.taxid_map)
    jobs = [(whole_fasta, WHOLE_NAME, title, taxids)] + [
        (build / f"{v}.fasta", v, f"{title} fragment {i + 1}/{settings.fragments}", [])
        for i, v in enumerate(volumes)
    ]
    with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        list(pool.map(lambda job: _makeblastdb(build, settings.dbtype, *job), jobs))

    nseq, length = _whole_size(build, len(lengths))
    write_seqid_table(build, WHOLE_NAME, nseq)
    members_file = members_bytes(fragment_of, settings.fragments)
    (build / MEMBERS_NAME).write_bytes(members_file)
    fragments = []
    for i, gids in enumerate(members):
        name = f"frag{i:03d}"
        write_alias(
            build / (name + alias_suffix(settings.dbtype)),
            [volumes[i]],
            title=title,
            nseq=nseq,
            length=length,
        )
        (build / f"{volumes[i]}.fasta").unlink()  # before the digest: it covers what stays on disk
        fragments.append(
            Fragment(
                name=name,
                volume=volumes[i],
                nseq=len(gids),
                length=sum(lengths[g] for g in gids),
                sha256=volume_sha256(build, volumes[i]),
            )
        )
    whole_fasta.unlink()
    with open(build / SEQUENCES_NAME, "w") as fh:
        fh.write("gid\tfragment\tlength\tid\n")
        for gid, seq_id in enumerate(ids):
            fh.write(f"{gid}\t{fragment_of[gid]}\t{lengths[gid]}\t{seq_id}\n")
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        dbtype=settings.dbtype,
        title=title,
        nseq=nseq,
        length=length,
        whole=WHOLE_NAME,
        whole_sha256=volume_sha256(build, WHOLE_NAME),
        fragments=fragments,
        input_path=str(settings.input),
        content_sha256=digest.hexdigest(),
        # "digests": the fragments' digests cover their files as stored (databases formatted before
        # this also counted a FASTA file removed afterwards, so their fragments cannot be verified)
        tools={
            "blast": blast_version(),
            "paramedic": __version__,
            "digests": FRAGMENT_DIGESTS,
            **({"taxid_map_sha256": _sha256(settings.taxid_map)} if settings.taxid_map else {}),
        },
        volume_blake3={v: volume_blake3(build, v) for v in [WHOLE_NAME, *volumes]},
        members_blake3=blake3.blake3(members_file).hexdigest(),
    )
    (build / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def _warn(text: str) -> None:
    print(f"paramedic: warning: {text}", file=sys.stderr, flush=True)


def _default_title(path: Path) -> str:
    text = str(path)
    return text[: -len(".gz")] if text.endswith(".gz") else text


def _write_fragment_fastas(whole_fasta: Path, fragment_of: list[int], paths: list[Path]) -> None:
    """One pass over the normalised whole FASTA (two lines per record), each record to its fragment."""
    outs = [open(p, "w") for p in paths]
    try:
        with open(whole_fasta) as whole:
            for gid, _header in enumerate(whole):
                sequence = whole.readline()
                outs[fragment_of[gid]].write(f">lcl|{FRAGMENT_ID_PREFIX}{gid}\n{sequence}")
    finally:
        for fh in outs:
            fh.close()


def _taxid_map(path: Path | None) -> list[str]:
    """makeblastdb's arguments for a taxid map (the whole database's volume only: its regenerations and
    reports print the taxids; fragments name their sequences by ordinal ids)."""
    if path is None:
        return []
    if not path.is_file():
        raise InputError(f"--taxid-map {path}: no such file")
    return ["-taxid_map", str(path.resolve())]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _makeblastdb(
    build: Path, dbtype: MolType, fasta: Path, volume: str, title: str, extra: list[str]
) -> None:
    """One volume. The FASTA goes on standard input (`-in -`): makeblastdb guesses a named file's format
    from its first bytes, and refused a fragment file beginning with a short or unusual protein
    (`MKUOLLXBZJ*`, gaps) although it took the whole file; on standard input it reads FASTA as told."""
    try:
        _run_makeblastdb(build, dbtype, fasta, volume, title, extra)
    except BlastError as exc:
        raise InputError(_refusal(str(exc))) from exc


def _refusal(message: str) -> str:
    """makeblastdb's refusal in one line of its own words, without the C++ exception's wrapping; for ids
    that -parse_seqids cannot read, the way that works (makeblastdb's default keeps them as titles)."""
    text = " ".join(message.split())
    reason = re.sub(r"^.*(?:creation error:|\(\) - |makeblastdb failed \(exit \d+\):)\s*", "", text)
    if "seq-id" in text.lower() or "ID type" in text or "too long" in text:
        return (
            f"makeblastdb -parse_seqids cannot read an id of this FASTA ({reason}); `paramedic format` keeps ids, "
            "so make the database with makeblastdb itself (its default keeps such ids as titles) and search it "
            "in place: paramedic search ... -db THAT_DATABASE"
        )
    return f"makeblastdb refused the input: {reason}"


def _run_makeblastdb(
    build: Path, dbtype: MolType, fasta: Path, volume: str, title: str, extra: list[str]
) -> None:
    run_tool(
        [
            "makeblastdb",
            "-in",
            "-",
            "-dbtype",
            dbtype,
            "-parse_seqids",
            "-out",
            volume,
            "-title",
            title,
            *extra,
        ],
        cwd=build,
        stdin_path=build / fasta.name,
    )


def _whole_size(build: Path, expected_nseq: int) -> tuple[int, int]:
    """Sequence and letter counts as BLAST+ itself counts them (authoritative for statistics)."""
    info = run_tool(["blastdbcmd", "-db", WHOLE_NAME, "-info"], cwd=build).stdout.decode()
    for line in info.splitlines():
        if "sequences;" in line and "total" in line:
            parts = line.replace(",", "").split()
            nseq, length = int(parts[0]), int(parts[2])
            if nseq != expected_nseq:
                raise InputError(f"makeblastdb kept {nseq} of {expected_nseq} sequences")
            return nseq, length
    raise InputError("blastdbcmd -info printed no size line")


def _install(build: Path, out: Path, alias_path: Path, manifest: Manifest) -> None:
    """Rename the finished build into place, then write the top-level alias (atomic per file)."""
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
    write_alias(
        alias_path,
        [f"{out.name}/{manifest.whole}"],
        title=manifest.title,
        nseq=manifest.nseq,
        length=manifest.length,
    )
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
