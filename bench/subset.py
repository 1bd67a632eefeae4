"""What resolving a restriction's subset costs, next to the BLAST+ search it precedes (issue 43).

A restricted search (-seqidlist, -taxids) is resolved once per job (paramedic.db.subset.resolve_subset):
BLAST+'s own reader lists the members (blastdbcmd), their lengths are read from the volumes' offset
tables, and per volume a mask is made. This times that against databases of growing size, made here by
makeblastdb -parse_seqids -taxid_map from random proteins (kept under --work DIR when given; by default in a temporary directory removed at the end), with lists
of growing length, and the plain BLAST+ search with the same restriction (one thread, --queries random
queries). It also gives the subset's size on the wire (paramedic.ship.subset_wire: compressed masks) and
its encoding time, which --ship metadata adds.

    .venv/bin/python bench/subset.py [--sizes 10000,100000,1000000] [--rounds 3] [--queries 4]

Appends a section to bench/RESULTS.md (unless --no-results).
"""

from __future__ import annotations

import argparse
import atexit
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paramedic.blast.options import BlastOptions
from paramedic.blast.tools import blast_version
from paramedic.db.locate import resolve_database
from paramedic.db.subset import resolve_subset
from paramedic.ship.subset_wire import encode_subset

HERE = Path(__file__).resolve().parent
AMINO = "ACDEFGHIKLMNPQRSTVWY"
TAXA = 1000  # each sequence has a taxid 1000..1999 at random: a taxid selects ~N / 1000 of them, spread out


def make_db(work: Path, n: int, rng: random.Random) -> Path:
    """A protein database of `n` random sequences (60-300 residues) with ids and taxids, made once."""
    base = work / f"db-{n}"
    db = base / "db"
    if (base / "done").exists():
        return db
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "in.fasta", "w") as fasta, open(base / "taxids.txt", "w") as taxids:
        for i in range(n):
            length = rng.randint(60, 300)
            fasta.write(f">S{i:08d} random protein {i}\n{''.join(rng.choices(AMINO, k=length))}\n")
            taxids.write(f"S{i:08d} {1000 + rng.randrange(TAXA)}\n")
    subprocess.run(
        ["makeblastdb", "-in", "in.fasta", "-dbtype", "prot", "-out", "db", "-parse_seqids",
         "-taxid_map", "taxids.txt", "-blastdb_version", "5"],
        cwd=base, check=True, capture_output=True,
    )  # fmt: skip
    (base / "in.fasta").unlink()
    (base / "done").write_text("")
    return db


def timed(fn, rounds: int) -> tuple[float, object]:
    """The median wall seconds of `rounds` calls, and the last result."""
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--seqids", default="10,1000,100000", help="-seqidlist lengths (at most the size)")
    parser.add_argument(
        "--taxids", default="1,10,100,1000", help="numbers of taxids in -taxids (1000: every sequence)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=4, help="random queries of the BLAST+ search")
    parser.add_argument(
        "--work",
        type=Path,
        help="where the databases are made and kept (default: a temporary directory, removed)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    rng = random.Random(43)
    if args.work is None:  # nothing left behind: the databases go with the run
        args.work = Path(tempfile.mkdtemp(prefix="paramedic-bench-subset-"))
        atexit.register(shutil.rmtree, args.work, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    queries = args.work / "queries.fasta"
    queries.write_text("".join(f">q{i}\n{''.join(rng.choices(AMINO, k=250))}\n" for i in range(args.queries)))
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        start = time.perf_counter()
        db_path = make_db(args.work, n, rng)
        made = time.perf_counter() - start
        print(f"database of {n:,} sequences ready ({made:.1f} s)", file=sys.stderr, flush=True)
        db, _ = resolve_database(str(db_path), args.work, dbtype="prot")
        cases: list[tuple[str, list[str]]] = []
        for length in (int(s) for s in args.seqids.split(",")):
            if length > n:
                continue
            listed = args.work / f"seqids-{n}-{length}.txt"
            chosen = sorted(rng.sample(range(n), length))
            listed.write_text("".join(f"S{i:08d}\n" for i in chosen))
            cases.append((f"-seqidlist of {length:,} ids", ["-seqidlist", str(listed)]))
        for count in (int(s) for s in args.taxids.split(",")):
            cases.append(
                (f"-taxids, {count} taxa", ["-taxids", ",".join(str(1000 + t) for t in range(count))])
            )
        for name, restriction in cases:
            options = BlastOptions.parse("blastp", restriction)
            resolve, subset = timed(lambda o=options, d=db: resolve_subset(d, o, args.work), args.rounds)
            encode, encoded = timed(lambda s=subset: encode_subset(s), args.rounds)
            search, _ = timed(
                lambda r=restriction, p=db_path: subprocess.run(
                    ["blastp", "-query", str(queries), "-db", str(p), *r, "-outfmt", "6",
                     "-out", "/dev/null", "-num_threads", "1"],
                    check=True, capture_output=True,
                ),
                args.rounds,
            )  # fmt: skip
            row = (n, name, subset.nseq, resolve, search, encode, encoded[0]["bytes"])
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    lines = [
        f"## Resolving a restriction's subset, next to the search it precedes (issue 43, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `.venv/bin/python bench/subset.py --sizes {args.sizes} --seqids {args.seqids} --taxids "
        f"{args.taxids} --rounds {args.rounds} --queries {args.queries}` (BLAST+ {blast_version()}, 2 cores "
        "shared with other sessions; medians of the rounds). Databases: random proteins of 60-300 residues, "
        "makeblastdb -parse_seqids -taxid_map (v5), each sequence a taxid of 1000..1999 at random (-taxids with 1000 taxa: every sequence). Resolving: "
        "`paramedic.db.subset.resolve_subset` (blastdbcmd lists the members, lengths from the .pin offsets, "
        f"masks per volume), once per job. Search: `blastp` of {args.queries} random 250-residue queries with "
        "the same restriction, one thread. Wire: the subset's compressed masks shipped with --ship metadata "
        "(paramedic.ship.subset_wire) and the time to make them.",
        "",
        "| sequences | restriction | members | resolve s | BLAST+ search s | resolve / search | wire bytes | encode s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, name, members, resolve, search, encode, size in rows:
        lines.append(
            f"| {n:,} | {name} | {members:,} | {resolve:.3f} | {search:.2f} | {resolve / search:.1%} | "
            f"{size:,} | {encode:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_results:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
