"""bench/simulate: the predictor (`paramedic simulate`) against real runs, then at scale.

1. Validation: a pilot run (every 5th mmseqs2 query, 2 workers) records every task's cost; other runs
   (`--queries` of the other queries: different queries, more of them) are run for real with
   each `--np` (and each `--partition-size`, when `paramedic search` has it), and each is predicted from
   the pilot's record alone. Measured wall: the run record's `wall_seconds` (rank 0, from the plan to
   the committed output). Printed as a Markdown table with the error.
2. Scale: 250,000 queries on 4,096 .. 32,768 workers, predicted from the same pilot, the database scaled
   (`--database-scale`, `--fragments`), partitions of `--scale-partition` ranks, each output strategy:
   efficiency (BLAST+ work / (ranks x wall)), the paper's relative efficiency (speedup from 4,096 workers
   divided by the ratio of workers), rank 0's and the workers' idle shares, the simulator's own time.

    .venv/bin/python bench/simulate.py [--queries 300] [--pilot 100] [--np 1 2 3] [--partitioned 3:2]
        [--strategy fragments] [--skip-validation] [--skip-scale]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARAMEDIC = str(HERE.parent / ".venv" / "bin" / "paramedic")
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr}")
    return done.stdout


def queries(records: list[str], path: Path) -> Path:
    path.write_text("".join(">" + r for r in records))
    return path


def search(work: Path, name: str, query: Path, np: int, strategy: str, extra: list[str]) -> dict:
    out = work / f"{name}.txt"
    argv = [PARAMEDIC, "search", "blastp", "-query", str(query), "-db", str(work / "db" / "uniprot")]
    argv += ["-out", str(out), "-outfmt", "0", "-evalue", "1e-5", "--np", str(np), "--quiet"]
    argv += ["--strategy", strategy, "--no-journal", *extra]
    start = time.perf_counter()
    run(argv)
    elapsed = time.perf_counter() - start
    record = json.loads(Path(f"{out}.run.json").read_text())
    record["_command_seconds"] = elapsed
    out.unlink()
    return record


def predict(record: Path, n: int, workers: int, extra: list[str]) -> dict:
    argv = [PARAMEDIC, "simulate", "--record", str(record), "--queries", str(n), "--workers", str(workers)]
    return json.loads(run([*argv, *extra, "--json"]))


def validation(args: argparse.Namespace, work: Path) -> None:
    db = work / "db" / "uniprot"
    if not (db / "manifest.json").exists():
        run([PARAMEDIC, "format", "--in", str(DATA / "mmseqs2/DB.fasta"), "--dbtype", "prot"]
            + ["--fragments", "4", "--out", str(db), "--quiet"])  # fmt: skip
    records = (DATA / "mmseqs2/QUERY.fasta").read_text().split(">")[1:]
    # the pilot samples the query set (every 5th query), the runs predicted are other queries of it: a
    # query's cost per residue varies 3-fold along the mmseqs2 file (its last 100 cost 2.8 times the
    # first 300 per residue pair), so a pilot must be a sample of the job it predicts
    pilot_q = queries(records[::5][: args.pilot], work / "pilot.fasta")
    others = [r for i, r in enumerate(records) if i % 5]
    target_q = queries(others[: args.queries], work / "target.fasta")
    pilot = search(work, "pilot", pilot_q, 2, args.strategy, [])
    pilot_record = work / "pilot.txt.run.json"
    print(
        f"pilot: {args.pilot} queries, 2 workers, {args.strategy}: wall {pilot['wall_seconds']:.1f} s, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    partitions = "--partition-size" in run([PARAMEDIC, "search", "--help"])
    cases: list[tuple[int, int | None]] = [(np, None) for np in args.np]
    if partitions:
        cases += [(int(np), int(size)) for np, size in (c.split(":") for c in args.partitioned)]
    print(
        "\n| run | --np | partition size | measured wall s | predicted, --query-file (error) | predicted, "
        "lengths sampled (error) | predicted efficiency | load avg |\n|---|---|---|---|---|---|---|---|"
    )
    for np, size in cases:
        extra = ["--partition-size", str(size)] if size else []
        measured = search(work, f"target{np}-{size}", target_q, np, args.strategy, extra)
        cores = ["--cores", str(os.cpu_count())]
        sampled = predict(pilot_record, args.queries, np, [*extra, *cores])
        # the same with the job's own query lengths (--query-file) instead of lengths sampled from the pilot
        argv = [PARAMEDIC, "simulate", "--record", str(pilot_record), "--query-file", str(target_q)]
        own = json.loads(run([*argv, "--workers", str(np), *extra, *cores, "--json"]))
        wall = measured["wall_seconds"]
        print(
            f"| {args.queries} queries | {np} | {size or '-'} | {wall:.1f} | {own['wall_seconds']:.1f} "
            f"({100 * (own['wall_seconds'] / wall - 1):+.1f}%) | {sampled['wall_seconds']:.1f} "
            f"({100 * (sampled['wall_seconds'] / wall - 1):+.1f}%) | {100 * own['efficiency']:.1f}% "
            f"| {os.getloadavg()[0]:.1f} |",
            flush=True,
        )
    if not partitions:
        print("\n(`paramedic search` has no --partition-size here: partitioned runs not measured)")


def scale(args: argparse.Namespace, work: Path) -> None:
    record = args.record or work / "pilot.txt.run.json"
    extra = ["--partition-size", str(args.scale_partition), "--database-scale", str(args.database_scale)]
    extra += ["--fragments", str(args.fragments)]
    print(
        f"\nscale: {args.scale_queries:,} queries, pilot {record}, database x{args.database_scale} in "
        f"{args.fragments} fragments, partitions of {args.scale_partition} ranks\n"
    )
    print(
        "| output | workers | wall s | efficiency | relative efficiency from 4,096 | rank 0 busy | "
        "partition masters busy | workers idle | simulated in s |\n|---|---|---|---|---|---|---|---|---|"
    )
    for strategy in args.output:
        base = None
        for workers in args.workers:
            p = predict(record, args.scale_queries, workers, [*extra, "--output-strategy", strategy])
            roles = p["roles"]
            if base is None:
                base = (workers, p["wall_seconds"])
            relative = base[1] / p["wall_seconds"] / ((workers + 1) / (base[0] + 1))
            print(
                f"| {strategy} | {workers:,} | {p['wall_seconds']:,.1f} | {100 * p['efficiency']:.1f}% | "
                f"{100 * relative:.1f}% | {100 * roles['supermaster']['utilisation']:.1f}% | "
                f"{100 * roles['partition masters']['utilisation']:.1f}% | "
                f"{100 * (1 - roles['workers']['utilisation']):.1f}% | {p['simulate_seconds']:.0f} |",
                flush=True,
            )


CALIBRATE = """
import pickle, sys, time
from mpi4py import MPI
from paramedic.blast.hits import Candidate, FragmentSearch, Hit, PrelimList
from paramedic.engine.core.master import SearchResult
from paramedic.engine.core.scheduler import SearchTask
comm, n = MPI.COMM_WORLD, int(sys.argv[1])
hits = [[Hit(1e-20 * i, 50 + i, 1000 * q + i) for i in range(48)] for q in range(20)]
prelim = [PrelimList(1050, tuple(Candidate(h.evalue, h.score, h.gid) for h in q)) for q in hits]
result = SearchResult(SearchTask(0, 0), FragmentSearch(hits, prelim), stored=True)
if comm.Get_rank() == 0:
    status = MPI.Status()
    spent = 0.0
    for i in range(n):
        while not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            time.sleep(0.0001)
        start = time.perf_counter()  # the handling, not the wait
        comm.recv(source=status.Get_source(), tag=status.Get_tag())
        comm.send(SearchTask(i, 1), dest=1, tag=3)
        spent += time.perf_counter() - start
    print(spent / n, len(pickle.dumps(result)))
else:
    for i in range(n):
        comm.send(result, dest=0, tag=1)
        comm.recv(source=0)
"""


def calibrate(work: Path) -> None:
    """Rank 0's seconds handling a message pair (a search result of 20 queries x 48 hits' keys in, a task out):
    the predictor's MESSAGE_SECONDS (a result and a task are two messages)."""
    script = work / "calibrate.py"
    script.write_text(CALIBRATE)
    mpiexec = str(HERE.parent / ".venv" / "bin" / "mpiexec")
    python = str(HERE.parent / ".venv" / "bin" / "python")
    seconds, size = run([mpiexec, "-n", "2", python, str(script), "2000"]).split()
    print(f"calibration: rank 0 per result in + task out: {1e6 * float(seconds):.0f} us ({size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/paramedic-bench-simulate"))
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--pilot", type=int, default=100)
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--partitioned",
        nargs="+",
        default=["3:2", "4:2", "5:3"],
        help="NP:SIZE runs with --np NP --partition-size SIZE (3:2 is one partition of 2 workers, 4:2 two of "
        "1, 5:3 two of 2 and 1)",
    )
    parser.add_argument("--strategy", default="fragments", choices=["fragments", "queries"])
    parser.add_argument("--calibrate", action="store_true", help="only measure the message cost")
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--record", type=Path, help="pilot record for the scale table (default: this run's)")
    parser.add_argument("--scale-queries", type=int, default=250_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--scale-partition", type=int, default=128)
    parser.add_argument("--database-scale", type=float, default=200.0)
    parser.add_argument("--fragments", type=int, default=64)
    parser.add_argument("--output", nargs="+", default=["master", "worker-individual"])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.calibrate:
        calibrate(args.work)
        return
    if not args.skip_validation:
        validation(args, args.work)
    if not args.skip_scale:
        scale(args, args.work)


if __name__ == "__main__":
    main()
