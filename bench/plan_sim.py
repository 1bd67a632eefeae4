"""bench/plan_sim: how far query segmentation's plan is from a perfect split, on measured per-query costs.

Timings of whole jobs vary by about 2% from run to run here, more than the plan can win or lose. This
bench separates the plan from that noise: it measures costs once, one BLAST+ run at a time, then replays
plans in a simulator (idle workers take the next piece, as the master hands them out).

Measured on this machine (mmseqs2-examples queries against its 20,000 proteins, outfmt 0, fork server):
  - each query searched alone;
  - the fixed cost of a run: a 22-residue query, alone;
  - the cost of one more database scan: BLAST+ searches a run's queries in internal batches of about
    SCAN_RESIDUES residues, one scan of the database each; derived from one run of the first queries
    together against the sum of their single runs.
A piece then costs: run + scans x ceil(residues / SCAN_RESIDUES) + each query's own work. The model is
checked against real runs of the default plan's last pieces (printed side by side).

The engine cuts pieces only where BLAST+ starts a query batch (paramedic.blast.prelim); the plans of whole
batches are also simulated under per-query noise (each query's own work x lognormal(0, 0.3), 200 seeded
draws), so that a share is not chosen for one measurement's luck.

    .venv/bin/python bench/plan_sim.py [--queries 500] [--workers 2] [--no-record]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

from paramedic.blast.prelim import query_batches
from paramedic.blast.tools import run_tool, startup_seconds
from paramedic.db.fasta import read_fasta
from paramedic.engine.core.plan import (
    aligned,
    decreasing_batches,
    decreasing_pieces,
    make_plan,
    smallest_piece_residues,
)

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
SCAN_RESIDUES = 10_000  # BLAST+ 2.12's query batch for blastp
TINY_QUERY = "MKTAYIAKQRQISFVKSHFSRQ"
CALIBRATION_QUERIES = 60


class Searcher:
    """One blastp run of some queries against the whole database, timed (through the fork server)."""

    def __init__(self, work: Path, db: Path):
        self.work, self.db = work, db

    def seconds(self, queries: Sequence[tuple[str, str]]) -> float:
        query_file = self.work / "q.fasta"
        query_file.write_text("".join(f">{h}\n{s}\n" for h, s in queries))
        start = time.perf_counter()
        run_tool(
            ["blastp", "-query", str(query_file), "-db", str(self.db), "-outfmt", "0", "-out", "/dev/null"]
        )
        return time.perf_counter() - start


class CostModel:
    def __init__(self, lengths: Sequence[int], singles: Sequence[float], run: float, scan: float):
        self.lengths, self.run, self.scan = lengths, run, scan
        self.own = [t - run - scan for t in singles]  # each query's own work

    def piece(self, piece: range) -> float:
        residues = sum(self.lengths[piece.start : piece.stop])
        return (
            self.run
            + self.scan * math.ceil(residues / SCAN_RESIDUES)
            + sum(self.own[piece.start : piece.stop])
        )

    def perfect(self, workers: int) -> float:
        """All queries in one run, its work split evenly: a plan of several runs does at least this work."""
        return self.piece(range(0, len(self.lengths))) / workers

    def makespan(self, pieces: Sequence[range], workers: int) -> float:
        free = [0.0] * workers
        for piece in pieces:
            idle = free.index(min(free))
            free[idle] += self.piece(piece)
        return max(free)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=HERE / "out" / "plan_sim")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()

    work = args.work
    (work / "ref").mkdir(parents=True, exist_ok=True)
    if not (work / "ref" / "uniprot.pin").exists():
        subprocess.run(
            ["makeblastdb", "-in", str(DATA / "mmseqs2" / "DB.fasta"), "-dbtype", "prot", "-out", "uniprot"],
            cwd=work / "ref", check=True, capture_output=True,
        )  # fmt: skip
    searcher = Searcher(work, work / "ref" / "uniprot")
    records = islice(read_fasta(DATA / "mmseqs2" / "QUERY.fasta", "prot"), args.queries)
    queries = [(r.header, r.sequence) for r in records]
    lengths = [len(s) for _, s in queries]
    database_residues = sum(len(r.sequence) for r in read_fasta(DATA / "mmseqs2" / "DB.fasta", "prot"))

    print(f"timing {len(queries)} queries one at a time ...", file=sys.stderr)
    singles = [searcher.seconds([q]) for q in queries]
    run = statistics.median(searcher.seconds([("tiny", TINY_QUERY)]) for _ in range(7))
    k = min(CALIBRATION_QUERIES, len(queries))
    together = searcher.seconds(queries[:k])
    scans = math.ceil(sum(lengths[:k]) / SCAN_RESIDUES)
    scan = (sum(singles[:k]) - (k - 1) * run - together) / (k - scans)
    model = CostModel(lengths, singles, run, scan)
    # the engine's own plan, as `paramedic search --strategy queries` makes it on this machine
    startup = startup_seconds("blastp")
    default = make_plan(
        "blastp", lengths, [database_residues], args.workers, 500, startup, True, query_segmentation=True
    ).pieces
    smallest = smallest_piece_residues("blastp", database_residues, startup)
    plans = {
        "default: shrinking pieces, 2/3 of the rest a round": default,
        "shrinking pieces, 1/2 of the rest a round": decreasing_pieces(lengths, args.workers, smallest, 0.5),
        **{
            f"equal pieces of {size} queries": tuple(
                range(i, min(len(queries), i + size)) for i in range(0, len(queries), size)
            )
            for size in (10, 25, 50)
        },
        "one query per piece": tuple(range(i, i + 1) for i in range(len(queries))),
    }
    blast_batches = query_batches(lengths, SCAN_RESIDUES)
    batched = {
        "the engine's plan (whole BLAST+ batches, 1/2 of the rest a round)": make_plan(
            "blastp", lengths, [database_residues], args.workers, 500, startup, True,
            query_segmentation=True, blast_batches=blast_batches,
        ).pieces,
        "whole BLAST+ batches, 2/3 a round": decreasing_batches(
            lengths, blast_batches, args.workers, smallest, 2 / 3
        ),
        "2/3 a round, cuts moved to batch starts (before)": aligned(
            decreasing_pieces(lengths, args.workers, smallest), blast_batches
        ),
    }  # fmt: skip
    plans.update(batched)
    perfect = model.perfect(args.workers)
    rng = random.Random(1)
    noisy: dict[str, list[float]] = {name: [] for name in batched}
    for _ in range(200):
        draw = CostModel(lengths, singles, run, scan)
        draw.own = [max(0.0, own * rng.lognormvariate(0, 0.3)) for own in model.own]
        for name, pieces in batched.items():
            noisy[name].append(draw.makespan(pieces, args.workers) / draw.perfect(args.workers) - 1)
    check = [(p, model.piece(p), searcher.seconds(queries[p.start : p.stop])) for p in default[-4:]]

    lines = [
        f"### plan_sim {time.strftime('%Y-%m-%d %H:%M')}: {len(queries)} queries, {args.workers} workers",
        "",
        f"Command: `.venv/bin/python bench/plan_sim.py --queries {args.queries} --workers {args.workers}`",
        "",
        f"Measured one run at a time: {len(queries)} single-query runs took {sum(singles):.1f} s; a run costs "
        f"{run * 1000:.0f} ms, one more database scan {scan * 1000:.0f} ms; the first {k} queries together "
        f"took {together:.2f} s against {sum(singles[:k]):.2f} s alone.",
        "",
        "| plan | pieces | simulated wall s | over a perfect split |",
        "|---|---|---|---|",
    ]
    for name, pieces in plans.items():
        makespan = model.makespan(pieces, args.workers)
        lines.append(
            f"| {name} | {len(pieces)} | {makespan:.2f} | +{makespan - perfect:.2f} s "
            f"({(makespan / perfect - 1) * 100:.1f}%) |"
        )
    lines += [
        "",
        f"Perfect split: {perfect:.2f} s. Model check on the default plan's last pieces (queries: model s / "
        "measured s): " + ", ".join(f"{p.start}-{p.stop - 1}: {m:.2f}/{t:.2f}" for p, m, t in check) + ".",
        "",
        f"Under per-query noise ({len(blast_batches)} BLAST+ batches; mean and 90th percentile over a "
        "perfect split, 200 draws):",
        "",
        "| plan | mean | p90 |",
        "|---|---|---|",
        *(
            f"| {name} | +{statistics.mean(v) * 100:.1f}% | +{sorted(v)[int(0.9 * len(v))] * 100:.1f}% |"
            for name, v in noisy.items()
        ),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
