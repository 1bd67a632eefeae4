"""What a fragment group's search costs read through a mask of the whole volume instead of its own volumes.

Every job digests the bytes it reads (issue 23): the whole volume and, for the fragments strategy, the
fragments' copies, nearly as many bytes again. A group of fragments searched through an OID mask over the
whole volume (as a piece already is) would need only the whole volume's digest. This measures whether the
searches stay as cheap: a bigdb database's fragments in `--groups` groups, each group searched by plain
BLAST+ (one thread, two at a time as two workers do) through
  - vol: an alias over the group's own fragment volumes (what the engine searches today);
  - mask: the whole volume with an OIDLIST of the group's members (the fragments' sequences, spread
    over the whole volume by the residue-balancing rule);
  - range: the whole volume with an OIDLIST of a consecutive range of as many sequences (the same bytes
    read in order, but not the same sequences: a range's hits need not balance).
Alternating the order every round; medians of wall and CPU seconds (every BLAST+ run waited for).

    .venv/bin/python bench/group_masks.py blastp blastp-q1.fasta prot-f8 --groups 4 --rounds 5

Run after `bench/bigdb.py` has built its databases in --work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from paramedic.blast.alias import oid_mask, write_alias
from paramedic.db.manifest import fragment_members

VARIANTS = ("vol", "mask", "range")


def aliases(db_dir: Path, groups: int, work: Path) -> dict[str, list[str]]:
    """Per variant, the -db of each group's search."""
    manifest = json.loads((db_dir / "manifest.json").read_text())
    nseq, suffix = manifest["nseq"], ".pal" if manifest["dbtype"] == "prot" else ".nal"
    fragments = manifest["fragments"]
    members = fragment_members(db_dir, len(fragments), manifest.get("members_blake3", ""))
    per = len(fragments) // groups
    found: dict[str, list[str]] = {v: [] for v in VARIANTS}

    def alias(name: str, dblist: list[str], oids: Iterable[int] | None = None) -> None:
        oidlist = None
        if oids is not None:
            mask = work / f"{name}-{len(found[name])}.bin"
            mask.write_bytes(oid_mask(oids, nseq))
            oidlist = str(mask)
        path = work / f"{name}-{len(found[name])}{suffix}"
        stats = {"title": manifest["title"], "nseq": nseq, "length": manifest["length"]}
        write_alias(path, dblist, oidlist=oidlist, **stats)
        found[name].append(str(path.with_suffix("")))

    whole = [str(db_dir / manifest["whole"])]
    for g in range(groups):
        group = range(g * per, (g + 1) * per)
        alias("vol", [str(db_dir / fragments[f]["volume"]) for f in group])
        ids = sorted(i for f in group for i in members[f])
        alias("mask", whole, ids)
        alias("range", whole, range(nseq * g // groups, nseq * (g + 1) // groups))
    return found


def run(program: str, query: Path, dbs: list[str], workers: int = 2) -> tuple[float, float]:
    """Wall and CPU seconds of searching every db, `workers` at a time."""
    todo, running, cpu = list(dbs), 0, 0.0
    start = time.perf_counter()
    while todo or running:
        while todo and running < workers:
            argv = [program, "-query", str(query), "-db", todo.pop(0), "-outfmt", "6", "-out", os.devnull]
            subprocess.Popen(argv)  # waited for below, by os.wait4
            running += 1
        _, _, usage = os.wait4(-1, 0)
        running -= 1
        cpu += usage.ru_utime + usage.ru_stime
    return time.perf_counter() - start, cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("program")
    parser.add_argument("query", help="a query file in --work")
    parser.add_argument("db", help="a bigdb database in --work (e.g. prot-f8)")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/paramedic/bench-bigdb")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="group-masks-") as tmp:
        dbs = aliases(args.work / args.db, args.groups, Path(tmp))
        seen: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds + 1):  # round 0 warms the page cache
            for v in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
                measured = run(args.program, args.work / args.query, dbs[v])
                if r:
                    seen[v].append(measured)
    print(f"| {args.program}, {args.query}, {args.groups} groups | wall s | CPU s |\n|---|---|---|")
    for v, runs in seen.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"| {v} | {wall:.3f} | {cpu:.3f} |")


if __name__ == "__main__":
    main()
