"""What a BLAST+ search costs however few its queries: one query file searched as 1, 2, 4 ... runs.

The plan (paramedic.engine.core.plan: RATE, SCAN) sizes tasks by what a search costs per query residue and
what it costs regardless of its queries. This splits a query file into k consecutive parts, runs plain
BLAST+ (one thread) on each against the whole database, and sums their CPU: the growth with k is the
per-run cost (start-up, lookup table, and for blastn the scan of every subject's words).

    .venv/bin/python bench/scan_cost.py PROGRAM QUERIES.fasta DB [--runs 1,2,4,8] [--rounds 3]

Prints a Markdown table (medians over --rounds) for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import tempfile
from pathlib import Path


def fasta_records(path: Path) -> list[str]:
    return [">" + r for r in path.read_text().split(">")[1:]]


def run_cpu(program: str, records: list[str], db: str, work: Path) -> float:
    """CPU seconds (user + system) of one BLAST+ run of `records` against `db`."""
    query = work / "part.fasta"
    query.write_text("".join(records))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [program, "-query", str(query), "-db", db, "-outfmt", "6", "-out", "/dev/null"],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program")
    parser.add_argument("queries", type=Path)
    parser.add_argument("db")
    parser.add_argument("--runs", default="1,2,4,8", help="numbers of runs to split the queries into")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    records = fasta_records(args.queries)
    counts = [int(k) for k in args.runs.split(",")]
    seconds: dict[int, list[float]] = {k: [] for k in counts}
    with tempfile.TemporaryDirectory(prefix="scan-cost-") as tmp:
        for _ in range(args.rounds):
            for k in counts:
                size = -(-len(records) // k)
                parts = [records[i : i + size] for i in range(0, len(records), size)]
                seconds[k].append(sum(run_cpu(args.program, p, args.db, Path(tmp)) for p in parts))
    one = statistics.median(seconds[counts[0]])
    print(f"| runs | CPU s (median of {args.rounds}) | more than {counts[0]} run(s), per extra run |")
    print("|---|---|---|")
    for k in counts:
        cpu = statistics.median(seconds[k])
        extra = (cpu - one) / (k - counts[0]) if k != counts[0] else 0.0
        print(f"| {k} | {cpu:.2f} | {extra:.2f} |")


if __name__ == "__main__":
    main()
