"""The tracer's overhead on a traced program's wall, with and without a bound on the trace (issue 46, item 3).

Runs each program untraced, traced with the default bound (40% of the free disk, at least 64 MiB), and
traced with `--max-trace-size` below its full trace, ROUNDS times in turn, and prints (and appends to
bench/RESULTS.md, unless --no-append) the median wall of each, the trace's size and what the bound left
out. Programs: Debian's LAMMPS (in.melt, Open MPI) and examples/trace/poll.c (a polling program, as hpcc's
RandomAccess). Needs `make mpi-trace`.

    .venv/bin/python bench/trace_bounds.py [--ranks 2] [--rounds 3] [--bound 4M]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MELT = Path("/usr/share/lammps/examples/melt/in.melt")
ENV = {
    **os.environ,
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def programs(work: Path, ranks: int) -> dict[str, list[str]]:
    poll = work / "poll"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(poll), str(ROOT / "examples/trace/poll.c")], check=True)
    mpiexec = ["mpiexec.openmpi", "-n", str(ranks)]
    return {
        "LAMMPS in.melt": [*mpiexec, "lmp", "-in", str(MELT), "-log", "none", "-screen", "none"],
        "poll.c 100 rounds x 2 ms": [*mpiexec, str(poll), "100", "2000"],
    }


def run(command: list[str], work: Path, options: list[str] | None) -> tuple[float, dict[str, object]]:
    """The wall of one run (untraced when `options` is None) and the trace's record."""
    out, record = work / "run.clog2", work / "run.json"
    if options is not None:
        command = [str(BIN / "paramedic"), "trace", "-out", str(out), "--record", str(record), *options, "--",
                   *command]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, cwd=work, env=ENV, check=True, capture_output=True)
    wall = time.perf_counter() - start
    trace: dict[str, object] = json.loads(record.read_text())["trace"] if options is not None else {}
    out.unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return wall, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", default="4M")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    modes: dict[str, list[str] | None] = {
        "untraced": None,
        "traced (default bound)": [],
        f"traced, --max-trace-size {args.bound}": ["--max-trace-size", args.bound],
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="trace-bounds-") as tmp:
        work = Path(tmp)
        for name, command in programs(work, args.ranks).items():
            walls: dict[str, list[float]] = {m: [] for m in modes}
            traces: dict[str, dict[str, object]] = {}
            for _ in range(args.rounds):
                for mode, options in modes.items():
                    wall, trace = run(command, work, options)
                    walls[mode].append(wall)
                    traces[mode] = trace
            base = statistics.median(walls["untraced"])
            for mode in modes:
                median = statistics.median(walls[mode])
                trace = traces[mode]
                left = trace.get("left_out") or {}
                calls = sum(int(v["calls"]) for v in left.values()) if isinstance(left, dict) else 0
                size = f"{int(trace['bytes']) / 1e6:,.1f}" if trace else "-"  # type: ignore[call-overload]
                rows.append((name, mode, median, median / base, size, calls))
                print(f"{name} | {mode} | wall {median:.2f} s ({median / base:.2f}x) | trace {size} MB | "
                      f"left out {calls:,} calls", flush=True)  # fmt: skip
    command = f".venv/bin/python bench/trace_bounds.py --ranks {args.ranks} --rounds {args.rounds} --bound {args.bound}"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "",
        f"## The tracer's overhead with and without a bound on the trace (issue 46, item 3; {when})",
        "",
        f"`{command}`: {args.ranks} ranks (Open MPI) on this machine's 2 shared cores, median wall of "
        f"{args.rounds} rounds (the modes in turn each round), the whole `paramedic trace` command for the "
        "traced runs (start-up, the merge and the rename included).",
        "",
        "| program | run | wall s | against untraced | trace MB | calls left out |",
        "|---|---|---|---|---|---|",
        *(f"| {n} | {m} | {w:.2f} | {r:.2f}x | {s} | {c:,} |" for n, m, w, r, s, c in rows),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        with (ROOT / "bench/RESULTS.md").open("a") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
