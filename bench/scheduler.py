"""bench/scheduler: the master's cost per decision, `Scheduler.next_task`, on large plans (no MPI, no
BLAST+). A partition master at scale asks it once per task; its cost bounds the tasks per second a master
can hand out. Plans of N search batches (10 queries each, one piece per batch) x --fragments, handed to
--workers workers in turn. With --baseline REV the scheduler module of git revision REV is timed side by
side, in the same process, on the same plans.

    .venv/bin/python bench/scheduler.py --batches 2375,11872 --baseline c3b3939
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from paramedic.engine.core import scheduler as current

MODULE = "src/paramedic/engine/core/scheduler.py"


def load_revision(revision: str) -> ModuleType:
    """The scheduler module as it was at `revision` (imported from a temporary file)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{MODULE}"], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="paramedic-bench-")) / "baseline_scheduler.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_scheduler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_scheduler"] = module
    spec.loader.exec_module(module)
    path.unlink()
    path.parent.rmdir()
    return module


def per_call(module: ModuleType, batches: int, fragments: int, workers: int, calls: int) -> float:
    plan_batches = tuple(range(i * 10, i * 10 + 10) for i in range(batches))
    scheduler = module.Scheduler(module.Plan(plan_batches, fragments, plan_batches, hitlist_size=5))
    calls = min(calls, batches * fragments)
    start = time.perf_counter()
    for i in range(calls):
        scheduler.next_task(1 + i % workers)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="2375", help="comma-separated plan sizes (search batches)")
    parser.add_argument("--fragments", type=int, default=64)
    parser.add_argument("--workers", type=int, default=128)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--baseline", help="a git revision whose scheduler is timed side by side")
    args = parser.parse_args()
    modules = [("current", current)]
    if args.baseline:
        modules.append((args.baseline, load_revision(args.baseline)))
    print(f"| batches | {' | '.join(f'{name} us/call' for name, _ in modules)} | ratio |")
    print(f"|---|{'---|' * len(modules)}---|")
    for batches in (int(b) for b in args.batches.split(",")):
        times = [per_call(m, batches, args.fragments, args.workers, args.calls) for _, m in modules]
        ratio = f"{times[1] / times[0]:.1f}x faster" if len(times) > 1 else ""
        print(f"| {batches:,} | {' | '.join(f'{t * 1e6:.1f}' for t in times)} | {ratio} |")


if __name__ == "__main__":
    main()
