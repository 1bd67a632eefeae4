"""OTF2 conversion time and size against CLOG2 size (issue 46, item 2): `paramedic convert TRACE.clog2 --otf2
DIR` on each trace, in a fresh process under /usr/bin/time (wall seconds, peak RSS), and the archive's
bytes. Traces: the files given; `--lammps STEPS` traces Debian's LAMMPS melt example (2 ranks, Open MPI)
for that many steps; `--synthetic N` a synthetic 4-rank trace of N periods (8 records each, bench/
trace_report.py's, written a segment at a time). Appends a section to bench/RESULTS.md (`--no-append`:
print only).

    .venv/bin/python bench/otf2.py [--lammps 2000] [--synthetic 360000] [TRACE.clog2 ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MELT = Path("/usr/share/lammps/examples/melt/in.melt")
OMPI = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


def timed(command: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) and standard error of `command`, from /usr/bin/time."""
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", *command], check=True, capture_output=True, text=True, cwd=ROOT
    )
    lines = done.stderr.strip().splitlines()
    wall, kib = lines[-1].split()
    return float(wall), int(kib) * 1024, "\n".join(lines[:-1])


def lammps(work: Path, steps: int) -> Path:
    text = MELT.read_text().replace("run\t\t250", f"run\t\t{steps}")
    (work / "in.melt").write_text(text)
    out = work / f"lammps-{steps}.clog2"
    command = [
        "mpiexec.openmpi",
        "-n",
        "2",
        "lmp",
        "-in",
        str(work / "in.melt"),
        "-log",
        "none",
        "-screen",
        "none",
    ]
    subprocess.run(
        [str(BIN / "paramedic"), "trace", "-out", str(out), "--", *command],
        check=True,
        cwd=work,
        env={**os.environ, **OMPI},
        capture_output=True,
    )
    return out


def measure(trace: Path, work: Path) -> dict[str, float]:
    archive = work / (trace.stem + "-otf2")
    wall, rss, said = timed([str(BIN / "paramedic"), "convert", str(trace), "--otf2", str(archive)])
    found = re.search(r"([\d,]+) events on", said)
    events = int(found[1].replace(",", "")) if found else 0
    size = sum(p.stat().st_size for p in archive.rglob("*") if p.is_file())
    return {
        "clog2_mb": trace.stat().st_size / 1e6,
        "events": events,
        "seconds": wall,
        "otf2_mb": size / 1e6,
        "rss_mb": rss / 1e6,
        "us_per_event": wall / max(events, 1) * 1e6,
    }


def table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| trace | CLOG2 MB | OTF2 events | `paramedic convert` s | us/event | OTF2 MB | OTF2/CLOG2 | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['clog2_mb']:,.1f} | {int(r['events']):,} | {r['seconds']:.2f} | {r['us_per_event']:.2f} "
            f"| {r['otf2_mb']:,.1f} | {r['otf2_mb'] / r['clog2_mb']:.2f} | {r['rss_mb']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument(
        "--synthetic", type=int, action="append", default=[], help="periods of a synthetic trace"
    )
    parser.add_argument(
        "--lammps", type=int, action="append", default=[], help="steps of LAMMPS melt, traced"
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(
        dir=ROOT / "bench" / "out" if (ROOT / "bench" / "out").is_dir() else None
    ) as tmp:
        work = Path(tmp)
        traces = [(t.name, t) for t in args.traces]
        for steps in args.lammps:
            traces.append((f"LAMMPS melt, 2 ranks, {steps:,} steps", lammps(work, steps)))
        for periods in args.synthetic:
            sys.path.insert(0, str(ROOT))
            from bench.trace_report import synthetic_file

            path = work / f"synthetic-{periods}.clog2"
            synthetic_file(path, 4, periods)
            traces.append((f"synthetic, 4 ranks, {periods:,} periods", path))
        for name, trace in traces:
            rows.append((name, measure(trace, work)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            for made in work.glob(trace.stem + "-otf2"):
                subprocess.run(["rm", "-rf", str(made)], check=True)
    text = table(rows)
    print(text)
    if not args.no_append:
        load = os.getloadavg()[0]
        section = (
            f"\n## OTF2 conversion: time and size against CLOG2 size ({datetime.now(UTC):%Y-%m-%d})\n\n"
            "`.venv/bin/python bench/otf2.py "
            + " ".join(sys.argv[1:])
            + f"` (the otf2 3.2 wheel; a 2-core machine shared with other jobs, load average {load:.1f} at the "
            "end). Each `paramedic convert` runs in a fresh process under /usr/bin/time; OTF2 MB is every file "
            "of the archive.\n\n" + text + "\n"
        )
        with (ROOT / "bench" / "RESULTS.md").open("a") as fh:
            fh.write(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
