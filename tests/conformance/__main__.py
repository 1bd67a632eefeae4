"""`python -m tests.conformance [--slice] [--workdir DIR] [--out docs/CONFORMANCE.md]`: run the matrix.

Builds the data sets (once per work directory), judges every cell, prints one line per cell and writes
the table. Exit 1 if any cell differs or errs.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conformance import datasets
from tests.conformance.matrix import FRAGMENT_COUNTS, Judge, Verdict, cells, environment_note
from tests.conftest import DATA


def build_sets(workdir: Path, full: bool) -> dict[str, datasets.DataSet]:
    counts = (*FRAGMENT_COUNTS, 12) if full else (4, 16)
    n = 6 if full else 5
    return {
        "proteins": datasets.proteins(DATA, workdir / "proteins", counts, n),
        "genomes": datasets.genomes(DATA, workdir / "genomes", counts, n),
        "saturating": datasets.saturating(DATA, workdir / "saturating", counts),
    }


def table(verdicts: list[Verdict], command: str, seconds: float) -> str:
    counts = collections.Counter(v.result for v in verdicts)
    blast = subprocess.run(["blastp", "-version"], capture_output=True, text=True).stdout.splitlines()[0]
    lines = [
        "# Conformance: paramedic against one BLAST+ run on the unsplit database",
        "",
        f"Made by `{command}` on {datetime.date.today()} ({environment_note()}, {blast}), "
        f"{len(verdicts)} cells in {seconds / 60:.0f} min: "
        + ", ".join(
            f"{counts[k]} {k}" for k in ("identical", "refused", "n/a", "differs", "error") if counts[k]
        )
        + ".",
        "",
        "Verdicts (tests/conformance/matrix.py): identical = byte-identical output (the text reports' "
        "Posted date aside); refused = exit 2 before searching, one line, no output file; n/a = BLAST+ "
        "itself rejects the combination. Data sets: tests/conformance/datasets.py.",
        "",
        "| data set | program | options | outfmt | fragments | strategy | verdict | detail |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        c = v.cell
        detail = v.detail.replace("|", "\\|")
        lines.append(
            f"| {c.dataset} | {c.program} | {c.label()} | {c.outfmt} | {c.fragments} | {c.strategy}{' (traceback ' + c.traceback + ')' if c.traceback != 'auto' else ''} | "
            f"{v.result} | {detail} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__)
    parser.add_argument("--slice", action="store_true", help="only the cells `make test` runs")
    parser.add_argument("--workdir", type=Path, help="where data sets are built (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="write the table here (e.g. docs/CONFORMANCE.md)")
    parser.add_argument("--only", action="append", help="only cells of this program (repeatable)")
    args = parser.parse_args()
    full = not args.slice
    with tempfile.TemporaryDirectory(prefix="paramedic-conformance-") as tmp:
        workdir = args.workdir or Path(tmp)
        start = time.monotonic()
        print(f"building data sets in {workdir} ...", flush=True)
        sets = build_sets(workdir, full)
        runs = workdir / "runs"
        runs.mkdir(exist_ok=True)
        judge = Judge(sets, runs)
        verdicts = []
        todo = [c for c in cells(full) if not args.only or c.program in args.only]
        for i, cell in enumerate(todo, 1):
            verdict = judge.judge(cell)
            verdicts.append(verdict)
            print(
                f"[{i}/{len(todo)}] {verdict.result:9} {cell.dataset} {cell.program} {cell.label()} "
                f"-outfmt {cell.outfmt} x{cell.fragments} {cell.strategy} {verdict.detail[:120]}",
                flush=True,
            )
        seconds = time.monotonic() - start
    command = "make conformance" if full else "python -m tests.conformance --slice"
    if args.out:
        args.out.write_text(table(verdicts, command, seconds))
    bad = [v for v in verdicts if v.result in ("differs", "error")]
    print(f"{len(verdicts)} cells, {len(bad)} differ or err, {seconds:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
