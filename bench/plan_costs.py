"""bench/plan_costs: issue 44's shapes on one node, `--strategy auto` against BLAST+ itself, and the cost
model's predictions against the measured walls.

For each shape, alternating the order every round, on the same cores:
  - `PROGRAM -num_threads N` (-mt_mode 0) and, where the program has it, `-mt_mode 1`;
  - `paramedic search` with its defaults (auto: the cost model chooses, the run record says which plans
    it weighed and their predicted seconds);
  - `paramedic search --strategy fragments` and `--strategy queries` (the engine's plans by name: what
    auto chose on one node before issue 44 was one of them);
and every paramedic output is compared with BLAST+'s byte for byte. Medians over the rounds after a
warm-up; ratios against the faster BLAST+ mode. It also measures the model's inputs here (`--calibrate`):
BLAST+'s start (CPU seconds of `-version`), the single-thread rate per residue pair of blastp and blastn
on the shapes' databases, and the threads' efficiency (single-thread CPU over cores x wall), to set
paramedic.engine.core.costs.Costs.

Shapes (real data from `make data`; kept in --work between runs):
  - p30x16k-0: 30 mmseqs2 queries x 16,600 mmseqs2 proteins, -outfmt 0 (issue 44's first row);
  - p71x16k-0: 71 queries x the same database, -outfmt 0;
  - p20x20k-6: 20 queries x the 20,000 proteins, -outfmt 6;
  - p500x20k-6: the 500 queries x the 20,000 proteins, -outfmt 6 (-mt_mode 1's shape);
  - n20-6: 20 pieces of 600 bp x the ragout-examples genomes and contigs (65 Mbp), -outfmt 6;
  - n1-6, n20-0: 1 such piece, -outfmt 6; the 20 pieces, -outfmt 0 (pairwise);
  - p1x20k-6: 1 query x the 20,000 proteins, -outfmt 6.

    .venv/bin/python bench/plan_costs.py --shapes p30x16k-0,p20x20k-6,n20-6 --rounds 2 [--calibrate]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE.parent))
from tests.integration.equality import read_gz_fasta  # noqa: E402  (the tests' own reader)

SHAPES = {  # name: (program, database, proteins in it or None, queries (start, count), outfmt)
    "p30x16k-0": ("blastp", "prot16k", 16_600, (0, 30), "0"),
    "p71x16k-0": ("blastp", "prot16k", 16_600, (100, 71), "0"),
    "p20x20k-6": ("blastp", "prot20k", None, (200, 20), "6"),
    "p500x20k-6": ("blastp", "prot20k", None, (0, 500), "6"),
    "n20-6": ("blastn", "nucl", None, (0, 20), "6"),
    "n1-6": ("blastn", "nucl", None, (0, 1), "6"),
    "n20-0": ("blastn", "nucl", None, (0, 20), "0"),
    "p1x20k-6": ("blastp", "prot20k", None, (300, 1), "6"),
}


def records(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    return [(h, "".join(b.split())) for h, _, b in (r.partition("\n") for r in text.lstrip(">").split("\n>"))]


def write(path: Path, items: list[tuple[str, str]]) -> None:
    with open(path, "w") as fh:
        for header, seq in items:
            fh.write(f">{header}\n{seq}\n")


def prepare(work: Path, shape: str) -> tuple[str, str, str, str]:
    """The shape's database (makeblastdb, searched in place) and query file in `work`."""
    program, db, proteins, (start, count), outfmt = SHAPES[shape]
    if not (work / f"{db}.fasta").exists():
        if program == "blastp":
            write(work / f"{db}.fasta", records(DATA / "mmseqs2" / "DB.fasta")[: proteins or None])
        else:
            genomes = sorted((DATA / "ragout").glob("*/*.fasta.gz")) + sorted(
                (DATA / "ragout").glob("*/references/*.fasta.gz")
            )
            write(work / f"{db}.fasta", [r for p in genomes for r in read_gz_fasta(p)])
        kind = "prot" if program == "blastp" else "nucl"
        subprocess.run(
            ["makeblastdb", "-in", f"{db}.fasta", "-dbtype", kind, "-out", db],
            cwd=work, check=True, capture_output=True,
        )  # fmt: skip
    queries = f"{shape}.fasta"
    if not (work / queries).exists():
        if program == "blastp":
            write(work / queries, records(DATA / "mmseqs2" / "QUERY.fasta")[start : start + count])
        else:
            genomes = [r for r in records(work / f"{db}.fasta") if len(r[1]) > 101_000]
            write(
                work / queries,
                [
                    (f"q{i + 1}", genomes[i % len(genomes)][1][(i * 7919) % 100_000 :][:600])
                    for i in range(count)
                ],
            )
    return program, db, queries, outfmt


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (the command's waited-for children) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_shape(work: Path, shape: str, rounds: int, cores: int) -> list[str]:
    program, db, queries, outfmt = prepare(work, shape)
    base = [program, "-query", queries, "-db", db, "-outfmt", outfmt]
    runs = {
        "blast0": [*base, "-num_threads", str(cores), "-out", "o.blast0"],
        "auto": [str(BIN / "paramedic"), "search", *base, "-out", "o.auto", "--np", str(cores), "--quiet"],
        "fragments": [
            str(BIN / "paramedic"), "search", *base, "-out", "o.fragments", "--np", str(cores), "--quiet",
            "--strategy", "fragments",
        ],
        "queries": [
            str(BIN / "paramedic"), "search", *base, "-out", "o.queries", "--np", str(cores), "--quiet",
            "--strategy", "queries",
        ],
    }  # fmt: skip
    if program != "tblastx" and outfmt in ("6", "10"):
        runs["blast1"] = [*base, "-num_threads", str(cores), "-mt_mode", "1", "-out", "o.blast1"]
    walls: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[float]] = {k: [] for k in runs}
    predicted: dict[str, float] = {}
    chosen = ""
    for r in range(rounds + 1):  # the first round warms the page cache and the caches
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in order:
            wall, cpu = timed(runs[key], work)
            if r:
                walls[key].append(wall)
                cpus[key].append(cpu)
        reference = (work / "o.blast0").read_bytes()
        for key in runs:
            if key != "blast0":
                same = (work / f"o.{key}").read_bytes() == reference
                assert same, f"{shape}: {key}'s output differs from BLAST+'s"
        reason = json.loads((work / "o.auto.run.json").read_text())["strategy_reason"]
        chosen = reason["chosen"]
        predicted = {p["plan"]: p["predicted_seconds"] for p in reason.get("plans", [])}
    best = min(statistics.median(walls[k]) for k in runs if k.startswith("blast"))
    line = [f"| {shape} | {program} | {os.getloadavg()[0]:.1f} |"]
    for key in ("blast0", "blast1", "auto", "fragments", "queries"):
        if key in runs:
            w = statistics.median(walls[key])
            line.append(f" {w:.2f} s ({w / best:.2f}x, CPU {statistics.median(cpus[key]):.1f} s) |")
        else:
            line.append(" - |")
    line.append(f" {chosen} | " + ", ".join(f"{k} {v:.2f}" for k, v in predicted.items()) + " |")
    return ["".join(line)]


def calibrate(work: Path) -> list[str]:
    """The model's inputs measured here: BLAST+'s start, rates per residue pair, threads' efficiency."""
    lines = []
    for program in ("blastp", "blastn"):
        starts = []
        for _ in range(5):
            _, cpu = timed([program, "-version"], work)
            starts.append(cpu)
        lines.append(f"- {program} start: {min(starts):.3f} s of CPU (least of 5)")
    for shape in ("p30x16k-0", "n20-6"):
        program, db, queries, outfmt = prepare(work, shape)
        argv = [program, "-query", queries, "-db", db, "-outfmt", outfmt, "-out", "/dev/null"]
        one_wall, one_cpu = timed([*argv, "-num_threads", "1"], work)
        two_wall, two_cpu = timed([*argv, "-num_threads", "2"], work)
        q = sum(len(s) for _, s in records(work / queries))
        d = sum(len(s) for _, s in records(work / f"{db}.fasta"))
        lines.append(
            f"- {shape}: one thread {one_wall:.2f} s wall / {one_cpu:.2f} s CPU, rate "
            f"{one_cpu / (q * d):.2e} s per residue pair ({q:,} x {d:,}); -num_threads 2 {two_wall:.2f} s: "
            f"efficiency {one_cpu / (2 * two_wall):.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="p30x16k-0,p20x20k-6,n20-6")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/paramedic/bench-plan-costs")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    lines = [
        f"## plan_costs: auto against BLAST+ on one node ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `.venv/bin/python bench/plan_costs.py {' '.join(sys.argv[1:])}`; load average before: "
        f"{os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds after a warm-up, ratios against the "
        "faster BLAST+ mode; every output byte-identical to BLAST+'s.",
        "",
        "| shape | program | load | BLAST+ -mt_mode 0 | -mt_mode 1 | auto | --strategy fragments "
        "| --strategy queries | auto chose | predicted s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in args.shapes.split(","):
        lines += run_shape(args.work, shape, args.rounds, args.cores)
    if args.calibrate:
        lines += ["", "Calibration:", *calibrate(args.work)]
    lines.append(f"Load average after: {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_results:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
