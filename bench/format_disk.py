"""bench/format_disk: the disk `paramedic format` takes against makeblastdb's, as the input grows (issue 42).

For FASTA inputs of growing size (the mmseqs2 proteins written N times, ids made unique), side by side:

  makeblastdb           makeblastdb -parse_seqids on the file: the baseline (bytes = 1.00x)
  format               `paramedic format` (one plain BLAST+ database and its description)
  format --layout fragments   the layout of earlier versions (a whole copy and a copy in fragments)

Bytes are every file each leaves on disk; seconds are wall time. The goal: `paramedic format` at most
1.25x makeblastdb's bytes.

    .venv/bin/python bench/format_disk.py --copies 1,4,16 --work /var/tmp/pm-format
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
PARAMEDIC = ROOT / ".venv/bin/paramedic"


def tree_bytes(*paths: Path) -> int:
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return total


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(copies: int, work: Path) -> dict[str, float]:
    place = work / f"x{copies}"
    shutil.rmtree(place, ignore_errors=True)
    place.mkdir(parents=True)
    source = (DATA / "mmseqs2" / "DB.fasta").read_text()
    fasta = place / "db.fasta"
    with open(fasta, "w") as fh:
        for n in range(copies):
            fh.write(source.replace(">", f">c{n}_"))
    row: dict[str, float] = {"copies": copies, "fasta_bytes": fasta.stat().st_size}
    (place / "ref").mkdir()
    row["makeblastdb_seconds"] = timed(
        ["makeblastdb", "-in", str(fasta), "-dbtype", "prot", "-parse_seqids", "-out", "db"], place / "ref"
    )
    row["makeblastdb_bytes"] = tree_bytes(place / "ref")
    for layout in ("blastdb", "fragments"):
        out = place / layout
        out.mkdir()
        row[f"{layout}_seconds"] = timed(
            [str(PARAMEDIC), "format", "--in", str(fasta), "--dbtype", "prot", "--fragments", "8", "--out",
             "db", "--layout", layout, "--quiet"],
            out,
        )  # fmt: skip
        row[f"{layout}_bytes"] = tree_bytes(out)
        row[f"{layout}_ratio"] = round(row[f"{layout}_bytes"] / row["makeblastdb_bytes"], 3)
    shutil.rmtree(place)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", default="1,4,16", help="input sizes, in copies of the 11 MB protein set")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pm-format"))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "format-results.json")
    args = parser.parse_args()
    rows = [measure(int(c), args.work) for c in args.copies.split(",")]
    print(f"{'copies':>6} {'FASTA MB':>9} {'makeblastdb MB':>15} {'format MB':>10} {'ratio':>6} "
          f"{'fragments MB':>13} {'ratio':>6} {'s mbdb/fmt/frag':>17}")  # fmt: skip
    for r in rows:
        print(
            f"{r['copies']:>6} {r['fasta_bytes'] / 1e6:>9.1f} {r['makeblastdb_bytes'] / 1e6:>15.1f} "
            f"{r['blastdb_bytes'] / 1e6:>10.1f} {r['blastdb_ratio']:>6} "
            f"{r['fragments_bytes'] / 1e6:>13.1f} {r['fragments_ratio']:>6} "
            f"{r['makeblastdb_seconds']:>5.1f}/{r['blastdb_seconds']:.1f}/{r['fragments_seconds']:.1f}"
        )
    args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
