"""Peak disk while tracing: the ranks' logs and the merged file, sampled during a traced run (issue 46, item 3).

Traces examples/trace/poll.c (a polling program, as hpcc's RandomAccess: it writes as much trace as the
rounds ask) with `paramedic trace -out DIR/run.clog2 --max-trace-size BOUND`, and meanwhile samples every
SAMPLE seconds the disk the run holds in DIR (the blocks allocated to every file under it: the ranks'
logs, the merged file being written, the trace renamed into place), keeping the peak. `--source SRC` runs
paramedic from another source tree (e.g. a copy of src/ at an earlier commit, to measure before a change):
PYTHONPATH=SRC, `python -m paramedic`. Prints the peak against the trace's size, and appends a section to
bench/RESULTS.md unless --no-append.

    .venv/bin/python bench/trace_disk.py [--ranks 2] [--rounds 300] [--spin 2000] [--bound 4G] \
        [--source /tmp/before/src --label before] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def allocated(top: Path) -> int:
    """Bytes of disk allocated to the files under `top` (st_blocks: a punched hole holds none)."""
    total = 0
    stack = [str(top)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
    return total


class Sampler(threading.Thread):
    def __init__(self, top: Path, every: float) -> None:
        super().__init__(daemon=True)
        self.top, self.every = top, every
        self.peak = self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, allocated(self.top))
            self.samples += 1
            time.sleep(self.every)


def traced(work: Path, poll: Path, args: argparse.Namespace) -> dict[str, float]:
    out, record = work / "out" / "run.clog2", work / "run.json"
    out.parent.mkdir(exist_ok=True)
    if args.source:
        paramedic = [sys.executable, "-m", "paramedic"]
        env = {**ENV, "PYTHONPATH": str(Path(args.source).resolve())}
    else:
        paramedic, env = [str(Path(sys.executable).parent / "paramedic")], ENV
    command = [*paramedic, "trace", "-out", str(out), "--record", str(record), "--max-trace-size", args.bound,
               "--", "mpiexec.openmpi", "-n", str(args.ranks), str(poll), str(args.rounds), str(args.spin)]  # fmt: skip
    sampler = Sampler(out.parent, args.sample)
    sampler.start()
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    trace = json.loads(record.read_text())["trace"]
    size = out.stat().st_size
    out.unlink()
    return {"wall": wall, "bytes": size, "peak": sampler.peak, "samples": sampler.samples,
            "merge": float(trace.get("merge_seconds", 0.0)), "records": sum(int(n) for n in trace["records"].values())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--spin", type=int, default=2000)
    parser.add_argument("--bound", default="4G")
    parser.add_argument("--sample", type=float, default=0.02)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--source", help="run paramedic from this source tree (PYTHONPATH)")
    parser.add_argument("--label", default="this tree")
    parser.add_argument(
        "--work", help="directory for the trace (default: a temporary one beside the repository)"
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trace-disk-", dir=args.work or ROOT.parent) as tmp:
        work = Path(tmp)
        poll = work / "poll"
        subprocess.run(
            ["mpicc.openmpi", "-O2", "-o", str(poll), str(ROOT / "examples/trace/poll.c")], check=True
        )
        for _ in range(args.runs):
            r = traced(work, poll, args)
            rows.append(r)
            print(f"{args.label}: trace {r['bytes'] / 1e6:,.1f} MB, peak disk {r['peak'] / 1e6:,.1f} MB "
                  f"({r['peak'] / r['bytes']:.2f}x), wall {r['wall']:.1f} s, {r['samples']} samples", flush=True)  # fmt: skip
    options = f" --source {args.source} --label '{args.label}'" if args.source else ""
    command = (
        f".venv/bin/python bench/trace_disk.py --ranks {args.ranks} --rounds {args.rounds} --spin {args.spin} "
        f"--bound {args.bound} --runs {args.runs}{options}"
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "",
        f"### Peak disk while tracing, {args.label} ({when})",
        "",
        f"`{command}`",
        "",
        "| run | ranks | trace MB | records | peak disk MB | peak / trace | wall s | merge s | samples |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {args.label} | {args.ranks} | {r['bytes'] / 1e6:,.1f} | {r['records']:,} | {r['peak'] / 1e6:,.1f} | "
            f"{r['peak'] / r['bytes']:.2f}x | {r['wall']:.1f} | {r['merge']:.1f} | {r['samples']} |"
            for r in rows
        ),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        with (ROOT / "bench/RESULTS.md").open("a") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
