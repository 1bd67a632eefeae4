"""bench/balance: static vs dynamic load balancing across groups, as in the Blue Gene/P paper's Fig. 4.

The paper split the queries into one batch per group of processors, statically, in two ways, and ran an
independent mpiBLAST per group; against that, one mpiBLAST over all groups balancing dynamically:
  - LengthSplit: batches of equal total query length (Rangwala et al.);
  - WeightSplit: batches of equal "work units", sum of lengths + N x 225 (ScalaBLAST);
  - Dynamic: one search, the groups are partitions (--partition-size) fed query segments on request.
It reported the max / avg group time: 2.3 for both static splits, 1.8 dynamic, on a synthesized
irregular query set. Here: real queries (mmseqs2-examples, 20,000 proteins), their order kept as it is
or sorted by length (long queries together: the irregular case), G groups of one worker each on this
machine's cores, all groups running at once. A group's time is its worker's busy time (its BLAST+
tasks' seconds, from the run records), for the static splits and the partitions alike; wall times too.

    .venv/bin/python bench/balance.py [--queries 300] [--groups 2] [--order sorted|given]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent
WEIGHT_FACTOR = 225  # ScalaBLAST's, as the paper used


def read_fasta(path: Path) -> list[tuple[str, str]]:
    records = []
    for chunk in path.read_text().split(">")[1:]:
        header, _, seq = chunk.partition("\n")
        records.append((header, seq.replace("\n", "")))
    return records


def split(queries: list[tuple[str, str]], groups: int, weight: int) -> list[list[tuple[str, str]]]:
    """Consecutive batches of (about) equal sum of (length + weight): LengthSplit with weight 0."""
    total = sum(len(s) + weight for _, s in queries)
    batches: list[list[tuple[str, str]]] = [[]]
    done = 0
    for record in queries:
        if done >= total * len(batches) / groups and len(batches) < groups:
            batches.append([])
        batches[-1].append(record)
        done += len(record[1]) + weight
    return batches


def write(path: Path, records: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f">{h}\n{s}\n" for h, s in records))
    return path


def search(work: Path, queries: Path, out: str, *engine: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "paramedic"), "search", "blastp", "-query", str(queries), "-db", "uniprot", "-outfmt", "6",
         "-out", str(work / out), "--strategy", "queries", "--quiet", "--no-journal", *engine],
        cwd=work / "pm",
    )  # fmt: skip


def busy(record_path: Path) -> list[float]:
    """Each worker's busy time (its tasks' seconds) from a run record."""
    record = json.loads(record_path.read_text())
    return [
        sum(r["seconds"].values()) for r in record["ranks_stats"] if r["role"] in ("worker", "master+worker")
    ]


def static(work: Path, batches: list[list[tuple[str, str]]], name: str) -> tuple[list[float], float]:
    """Every batch its own search on one worker, all at once: each group's busy time, and the wall time
    of the last to finish."""
    started = time.perf_counter()
    procs = [search(work, write(work / f"{name}-{i}.fasta", b), f"{name}-{i}.out", "--np", "1")
             for i, b in enumerate(batches)]  # fmt: skip
    walls = [0.0] * len(procs)
    while any(w == 0.0 for w in walls):
        for i, proc in enumerate(procs):
            if walls[i] == 0.0 and proc.poll() is not None:
                if proc.returncode != 0:
                    raise SystemExit(f"{name} batch {i} failed")
                walls[i] = time.perf_counter() - started
        time.sleep(0.05)
    return [sum(busy(work / f"{name}-{i}.out.run.json")) for i in range(len(batches))], max(walls)


def dynamic(work: Path, queries: list[tuple[str, str]], groups: int) -> tuple[list[float], float]:
    """One search, `groups` partitions of one worker: each partition's busy time, and the wall time."""
    path = write(work / "all.fasta", queries)
    start = time.perf_counter()
    proc = search(work, path, "dynamic.out", "--np", str(2 * groups), "--partition-size", "2", "--batch", "5")
    if proc.wait() != 0:
        raise SystemExit("dynamic run failed")
    wall = time.perf_counter() - start
    return busy(work / "dynamic.out.run.json"), wall


def ratio(times: list[float]) -> float:
    return max(times) / (sum(times) / len(times))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--order", choices=["sorted", "given"], default="sorted")
    parser.add_argument("--work", type=Path, default=HERE / "out" / "balance")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(
        [str(BIN / "paramedic"), "format", "--in", str(DATA / "mmseqs2" / "DB.fasta"), "--dbtype", "prot",
         "--fragments", "1", "--out", "pm/uniprot", "--quiet"], cwd=work, check=True,
    )  # fmt: skip
    queries = read_fasta(DATA / "mmseqs2" / "QUERY.fasta")[: args.queries]
    if args.order == "sorted":
        queries.sort(key=lambda r: -len(r[1]))
    rows = []
    for name, weight in (("LengthSplit", 0), ("WeightSplit", WEIGHT_FACTOR)):
        times, wall = static(work, split(queries, args.groups, weight), name)
        rows.append((name, times, wall))
        print(
            f"{name}: group busy times {', '.join(f'{t:.1f}' for t in times)} s, wall {wall:.1f} s",
            flush=True,
        )
    times, wall = dynamic(work, queries, args.groups)
    rows.append(("Dynamic (partitions)", times, wall))
    print(f"Dynamic: partition busy times {', '.join(f'{t:.1f}' for t in times)} s, wall {wall:.1f} s")
    outputs = {p.name: p.read_bytes() for p in work.glob("*.out")}
    joined = {
        name: b"".join(outputs[f"{name}-{i}.out"] for i in range(args.groups))
        for name, _ in (("LengthSplit", 0), ("WeightSplit", 0))
    }
    same = all(sorted(v.splitlines()) == sorted(outputs["dynamic.out"].splitlines()) for v in joined.values())
    lines = [
        f"## balance: static vs dynamic, {args.queries} queries ({args.order} by length), {args.groups} groups "
        f"({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `.venv/bin/python bench/balance.py --queries {args.queries} --groups {args.groups} "
        f"--order {args.order}` (2 cores; paper, Fig. 4: max/avg 2.3 static, 1.8 dynamic)",
        "",
        "| approach | group times s | max / avg | wall s |",
        "|---|---|---|---|",
        *(
            f"| {n} | {', '.join(f'{t:.1f}' for t in times)} | {ratio(times):.2f} | {w:.1f} |"
            for n, times, w in rows
        ),
        "",
        f"Same hits in every approach: {'yes' if same else 'NO'}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
