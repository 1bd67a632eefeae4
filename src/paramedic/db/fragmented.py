"""The layout `paramedic format` wrote before databases were searched in place (`--layout fragments`).

A whole copy of the input plus a second copy split into fragment volumes, with a manifest; databases of
this layout keep working (paramedic.db.locate.resolve_database), and this builder makes them for the tests
that say so. Layout of `--out dbs/uniprot` (protein shown; nucleotide uses .nal):

    dbs/uniprot.pal              alias over the whole database: `-db dbs/uniprot` works for BLAST+ too
    dbs/uniprot/manifest.json    totals, fragments, checksums, tool versions
    dbs/uniprot/sequences.tsv    global ordinal id -> fragment, length, sequence id
    dbs/uniprot/seqids.*         global ordinal id -> the whole database's Seq-id (reports from archives)
    dbs/uniprot/whole.*          the input as one BLAST+ database, original order and ids (lookups and
                                 regeneration: its ordinal ids are the global ids)
    dbs/uniprot/f003.*           fragment 3: makeblastdb -parse_seqids, ids `lcl|g<global id>`
    dbs/uniprot/frag003.pal      fragment 3 with the whole database's NSEQ and LENGTH
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

from paramedic import __version__
from paramedic.blast.alias import write_alias
from paramedic.blast.hits import FRAGMENT_ID_PREFIX
from paramedic.blast.programs import MolType, alias_suffix
from paramedic.blast.tools import blast_version
from paramedic.db.fasta import read_fasta
from paramedic.db.makeblastdb import database_size, file_sha256, make_volume, taxid_map_args, warn
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
from paramedic.errors import InputError, UsageError


def build_fragmented(
    source: Path,
    dbtype: MolType,
    count: int,
    title: str,
    taxid_map: Path | None,
    jobs: int,
    build: Path,
    progress: Callable[[str], None],
) -> Manifest:
    """The database's files in directory `build`: a whole volume, `count` fragment volumes, a manifest."""
    progress(f"reading {source}")
    lengths: list[int] = []
    ids: list[str] = []
    seen: dict[str, int] = {}
    digest = hashlib.sha256()
    whole_fasta = build / "whole.fasta"
    with open(whole_fasta, "w") as whole:
        for record in read_fasta(source, dbtype, warn=warn):
            if record.seq_id in seen:
                raise InputError(
                    f"{source}: duplicate sequence id {record.seq_id!r} "
                    f"(records {seen[record.seq_id] + 1} and {len(ids) + 1})"
                )
            seen[record.seq_id] = len(ids)
            text = f">{record.header}\n{record.sequence}\n"
            whole.write(text)
            digest.update(text.encode())
            ids.append(record.seq_id)
            lengths.append(len(record.sequence))
    if count > len(lengths):
        raise UsageError(f"--fragments {count} is more than the {len(lengths)} sequences")

    members = assign_fragments(lengths, count)
    fragment_of = [0] * len(lengths)
    for frag, gids in enumerate(members):
        for gid in gids:
            fragment_of[gid] = frag
    volumes = [f"f{i:03d}" for i in range(count)]
    _write_fragment_fastas(whole_fasta, fragment_of, [build / f"{v}.fasta" for v in volumes])

    progress(f"makeblastdb: whole database and {count} fragments")
    taxids = taxid_map_args(taxid_map)
    runs = [(whole_fasta, WHOLE_NAME, title, taxids)] + [
        (build / f"{v}.fasta", v, f"{title} fragment {i + 1}/{count}", []) for i, v in enumerate(volumes)
    ]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(
            pool.map(
                lambda job: make_volume(build, dbtype, job[0], job[1], job[2], ["-parse_seqids", *job[3]]),
                runs,
            )
        )

    nseq, length = database_size(build, WHOLE_NAME)
    if nseq != len(lengths):
        raise InputError(f"makeblastdb kept {nseq} of {len(lengths)} sequences")
    write_seqid_table(build, WHOLE_NAME, nseq)
    members_file = members_bytes(fragment_of, count)
    (build / MEMBERS_NAME).write_bytes(members_file)
    fragments = []
    for i, gids in enumerate(members):
        name = f"frag{i:03d}"
        write_alias(
            build / (name + alias_suffix(dbtype)),
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
        dbtype=dbtype,
        title=title,
        nseq=nseq,
        length=length,
        whole=WHOLE_NAME,
        whole_sha256=volume_sha256(build, WHOLE_NAME),
        fragments=fragments,
        input_path=str(source),
        content_sha256=digest.hexdigest(),
        # "digests": the fragments' digests cover their files as stored (databases formatted before
        # this also counted a FASTA file removed afterwards, so their fragments cannot be verified)
        tools={
            "blast": blast_version(),
            "paramedic": __version__,
            "digests": FRAGMENT_DIGESTS,
            **({"taxid_map_sha256": file_sha256(taxid_map)} if taxid_map else {}),
        },
        volume_blake3={v: volume_blake3(build, v) for v in [WHOLE_NAME, *volumes]},
        members_blake3=blake3.blake3(members_file).hexdigest(),
    )
    (build / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


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
