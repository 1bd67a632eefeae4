"""bench/own_start: paramedic's own start on the blast plan, side by side with BLAST+ (issue 44, item 2).

A short job (BLAST+ itself well under 2 s) is where paramedic's fixed start shows: the interpreter, its
imports, the job's checks (-db resolved by `blastdbcmd -info`, the database's digests, the queries read),
the run record. Each round runs, in an order that alternates every round so that the machine's load
falls on all alike:

  blast    PROGRAM -num_threads CORES (what the user would run instead)
  TREE     `paramedic search` with its defaults (auto: one BLAST+ run on one node), once per source tree
           given by --tree NAME=SRC (a checkout's src/ on PYTHONPATH: the same command at two revisions)

and each paramedic output is compared with BLAST+'s byte for byte. Medians of wall and of CPU (the run's
waited-for children: the interpreter and every BLAST+ it started) over the rounds after a warm-up; the
difference against BLAST+ is paramedic's own start. `--timeline` also prints, for the first tree, one
run's timeline: when each subprocess started (BLAST+'s search last), from an audit hook.

    .venv/bin/python bench/own_start.py --shape n20-6 --rounds 15 \\
        --tree before=/tmp/before/src --tree after=src
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan_costs import SHAPES, prepare  # noqa: E402  (the shapes and their real data)

BIN = Path(sys.executable).parent

# Printed by the timeline's run: every subprocess started, with its time since the interpreter began
AUDIT = """
import sys, time
start = time.perf_counter()
def hook(event, args):
    if event == "subprocess.Popen":
        print(f"{(time.perf_counter() - start) * 1000:7.1f} ms  {' '.join(map(str, args[1]))[:90]}", file=sys.stderr)
sys.addaudithook(hook)
from paramedic.cli import main
code = main(sys.argv[1:])
print(f"{(time.perf_counter() - start) * 1000:7.1f} ms  done (exit {code})", file=sys.stderr)
"""


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (the command's waited-for children) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="n20-6", help=f"one of {', '.join(SHAPES)}")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC (repeatable)")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/paramedic/bench-plan-costs")
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    program, db, queries, outfmt = prepare(args.work, args.shape)
    base = [program, "-query", queries, "-db", db, "-outfmt", outfmt]
    runs: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "blast": ([*base, "-num_threads", str(args.cores), "-out", "o.start-blast"], None)
    }
    for given in args.tree:
        name, _, src = given.partition("=")
        env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user runs it: modules from their compiled files
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(src)], check=True, stdout=subprocess.DEVNULL
        )
        argv = [
            str(BIN / "paramedic"),
            "search",
            *base,
            "-out",
            f"o.start-{name}",
            "--np",
            str(args.cores),
            "--quiet",
        ]
        runs[name] = (argv, env)
    load_before = os.getloadavg()[0]
    walls: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds + 1):  # the first round warms the page cache and the caches
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in order:
            wall, cpu = timed(runs[key][0], args.work, runs[key][1])
            if r:
                walls[key].append(wall)
                cpus[key].append(cpu)
        reference = (args.work / "o.start-blast").read_bytes()
        for key in runs:
            assert (args.work / f"o.start-{key}").read_bytes() == reference, f"{key}'s output differs"
    load_after = os.getloadavg()[0]
    blast_wall = statistics.median(walls["blast"])
    blast_cpu = statistics.median(cpus["blast"])
    lines = [
        f"## own_start: paramedic's own start on the blast plan ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `.venv/bin/python bench/own_start.py {' '.join(sys.argv[1:])}`; shape {args.shape} "
        f"({program}, -outfmt {outfmt}); medians of {args.rounds} rounds after a warm-up, the order alternating; "
        f"load average {load_before:.1f} before, {load_after:.1f} after; every output byte-identical to BLAST+'s.",
        "",
        "| run | wall s | wall - BLAST+ | wall ratio | CPU s | CPU - BLAST+ | CPU ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in runs:
        w, c = statistics.median(walls[key]), statistics.median(cpus[key])
        lines.append(
            f"| {key} | {w:.3f} | {w - blast_wall:+.3f} | {w / blast_wall:.2f}x | {c:.3f} | {c - blast_cpu:+.3f} "
            f"| {c / blast_cpu:.2f}x |"
        )
    if args.timeline:
        name = [k for k in runs if k != "blast"][-1]
        argv, env = runs[name]
        env = dict(env or os.environ)
        done = subprocess.run(
            [sys.executable, "-c", AUDIT, *argv[1:]], cwd=args.work, env=env, capture_output=True, text=True
        )
        lines += [
            "",
            f"One run of {name}, each subprocess's start (ms since the interpreter's first line):",
            "",
        ]
        lines += ["    " + line for line in done.stderr.splitlines()]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_results:
        with open(HERE / "RESULTS.md", "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
