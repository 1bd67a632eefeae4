"""`paramedic format` and `paramedic verify`: a BLAST+ database made from a FASTA file, and a database's
files digested again."""

from __future__ import annotations

import sys
from pathlib import Path

from paramedic.cli.parsing import command_parser


def format_command(argv: list[str]) -> int:
    from paramedic.db.blastdb import DEFAULT_FRAGMENTS
    from paramedic.db.format import LAYOUTS, FormatSettings, format_database

    parser = command_parser(
        "format",
        "Make a BLAST+ database of a FASTA file (makeblastdb, one copy of the sequences), to be searched in "
        "--fragments pieces.",
    )
    parser.add_argument("--in", dest="input", required=True, type=Path, help="FASTA file, plain or gzip")
    parser.add_argument("--dbtype", required=True, choices=["prot", "nucl"])
    parser.add_argument(
        "--fragments", type=int, default=DEFAULT_FRAGMENTS,
        help=f"how many pieces a search cuts it into (default {DEFAULT_FRAGMENTS}; at least one per volume)",
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, help="database name, e.g. dbs/uniprot")
    parser.add_argument("--title", help="database title (default: the --in path, as makeblastdb does)")
    parser.add_argument("--force", action="store_true", help="replace an existing database")
    parser.add_argument(
        "--taxid-map", type=Path, help="lines 'id taxid', as makeblastdb -taxid_map (for -taxids and staxids)"
    )
    parser.add_argument(
        "--no-parse-seqids", dest="parse_seqids", action="store_false",
        help="keep the ids as titles, as makeblastdb does without -parse_seqids (default: -parse_seqids)",
    )  # fmt: skip
    parser.add_argument(
        "--layout", choices=LAYOUTS, default="blastdb",
        help="blastdb (default): one plain BLAST+ database; fragments: the layout of earlier versions (a "
        "whole copy and a copy in fragments, about twice the disk)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress lines, no summary (errors still)")
    args = parser.parse_args(argv)
    say = (lambda _: None) if args.quiet else (lambda msg: print(f"paramedic: {msg}", file=sys.stderr))
    settings = FormatSettings(
        args.input, args.dbtype, args.fragments, args.out, args.title, args.force,
        taxid_map=args.taxid_map, parse_seqids=args.parse_seqids, layout=args.layout,
    )  # fmt: skip
    made = format_database(settings, say)
    if not args.quiet:
        print(
            f"paramedic: formatted {made.nseq:,} sequences ({made.length:,} letters), searched in "
            f"{made.fragments} fragments: {args.out}",
            file=sys.stderr,
        )
    return 0


def verify_command(argv: list[str]) -> int:
    """Digest a database's files afresh (a cron job after update_blastdb.pl), so that the next search
    trusts remembered digests that were just made, and say whether any was wrong."""
    from paramedic.db.locate import resolve_database
    from paramedic.db.manifest import in_place_files, verify_volumes
    from paramedic.db.trust import verify
    from paramedic.errors import DatabaseError

    parser = command_parser(
        "verify", "Digest every file of a BLAST+ database again and remember the digests."
    )
    parser.add_argument("-db", required=True, help="the database, as BLAST+'s -db names it")
    parser.add_argument("-dbtype", choices=["prot", "nucl"], help="its molecule type (default: found)")
    args = parser.parse_args(argv)
    database, manifest = resolve_database(args.db, Path.cwd(), digest=False, dbtype=args.dbtype)
    if not manifest.in_place:  # made by `paramedic format`: its manifest holds the digests
        verify_volumes(database.directory, manifest)
        print(f"paramedic: {args.db}: every volume matches its manifest", file=sys.stderr)
        return 0
    total, wrong = verify(in_place_files(manifest))
    if wrong:
        names = ", ".join(p.name for p in wrong[:5]) + (" ..." if len(wrong) > 5 else "")
        raise DatabaseError(
            f"{args.db}: {len(wrong)} file(s) changed although their size and times did not ({names}): "
            "the new digests are remembered; check the disk, or who writes the database"
        )
    print(
        f"paramedic: {args.db}: {len(database.spans)} volume(s), {manifest.nseq:,} sequences, {total:,} bytes "
        f"digested; database digest {manifest.checksum()[:16]}",
        file=sys.stderr,
    )
    return 0
