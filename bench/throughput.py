"""bench/throughput: paramedic search vs NCBI BLAST+ on this machine, side by side in one run.

The 500 mmseqs2-examples queries against its 20,000 proteins, outfmt 0:
  - paramedic search --strategy fragments (2 workers: search fragments, merge, regenerate)
  - paramedic search --strategy queries (2 workers: whole database per task; what `auto` picks here)
  - blastp -num_threads 2
  - blastp -num_threads 2 -mt_mode 1
  - blastp (1 thread)
`--strategy fragments` runs twice: as it is (the searches' alignments stay with the workers, rank 0
receives keys only) and with PARAMEDIC_ALIGNMENTS=tasks (the alignments travel through rank 0, as before
issue 12 and as when the workers cannot see the search store), with rank 0's received bytes for both.
Reports wall times, ratios against the best BLAST+ run, paramedic's per-phase split and peak memory per
rank, and checks that paramedic's output equals BLAST+'s (Posted date line aside). Appends a Markdown
section to bench/RESULTS.md with the command line. Not a test: timings are noisy (+-10% here).

    .venv/bin/python bench/throughput.py [--queries 500] [--fragments 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent
POSTED = re.compile(rb"^ *Posted date: .*$", re.M)  # the text reports indent it by four spaces


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MB of the largest process) using GNU time."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    peak_kb = int(proc.stderr.strip().splitlines()[-1])
    return wall, peak_kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole side-by-side set")
    parser.add_argument("--work", type=Path, default=HERE / "out" / "throughput")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()

    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    (work / "ref").mkdir(parents=True)
    records = (DATA / "mmseqs2" / "QUERY.fasta").read_text().split("\n>")
    queries = "\n>".join(records[: args.queries]).rstrip("\n") + "\n"
    (work / "queries.fasta").write_text(queries if queries.startswith(">") else ">" + queries)
    db_fasta = DATA / "mmseqs2" / "DB.fasta"
    title = "mmseqs2-examples DB"
    subprocess.run(
        ["makeblastdb", "-in", str(db_fasta), "-dbtype", "prot", "-parse_seqids", "-out", "uniprot", "-title", title],
        cwd=work / "ref", check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [str(BIN / "paramedic"), "format", "--in", str(db_fasta), "--dbtype", "prot", "--fragments",
         str(args.fragments), "--out", "pm/uniprot", "--title", title, "--quiet"],
        cwd=work, check=True,
    )  # fmt: skip
    q = str(work / "queries.fasta")
    runs: dict[str, tuple[Any, ...]] = {  # (command, directory[, environment])
        "paramedic search --strategy fragments": (
            [str(BIN / "paramedic"), "search", "blastp", "-query", q, "-db", "uniprot", "-outfmt", "0",
             "-out", str(work / "paramedic.out"), "--np", "2", "--strategy", "fragments", "--quiet"],
            work / "pm",
        ),
        "paramedic search --strategy fragments, alignments through rank 0": (
            [str(BIN / "paramedic"), "search", "blastp", "-query", q, "-db", "uniprot", "-outfmt", "0",
             "-out", str(work / "paramedic-t.out"), "--np", "2", "--strategy", "fragments", "--quiet"],
            work / "pm",
            {"PARAMEDIC_ALIGNMENTS": "tasks"},
        ),
        "paramedic search --strategy queries": (
            [str(BIN / "paramedic"), "search", "blastp", "-query", q, "-db", "uniprot", "-outfmt", "0",
             "-out", str(work / "paramedic-q.out"), "--np", "2", "--strategy", "queries", "--quiet"],
            work / "pm",
        ),
        # the default runner above is worker threads of one process; these are the same jobs on MPI ranks
        "paramedic search --strategy fragments --runner mpi": (
            [str(BIN / "paramedic"), "search", "blastp", "-query", q, "-db", "uniprot", "-outfmt", "0",
             "-out", str(work / "paramedic-m.out"), "--np", "2", "--strategy", "fragments", "--quiet",
             "--runner", "mpi"],
            work / "pm",
        ),
        "paramedic search --strategy queries --runner mpi": (
            [str(BIN / "paramedic"), "search", "blastp", "-query", q, "-db", "uniprot", "-outfmt", "0",
             "-out", str(work / "paramedic-qm.out"), "--np", "2", "--strategy", "queries", "--quiet",
             "--runner", "mpi"],
            work / "pm",
        ),
        "blastp -num_threads 2": (
            ["blastp", "-query", q, "-db", "uniprot", "-outfmt", "0", "-num_threads", "2",
             "-out", str(work / "mt0.out")],
            work / "ref",
        ),
        "blastp -num_threads 2 -mt_mode 1": (
            ["blastp", "-query", q, "-db", "uniprot", "-outfmt", "0", "-num_threads", "2", "-mt_mode", "1",
             "-out", str(work / "mt1.out")],
            work / "ref",
        ),
        "blastp (1 thread)": (
            ["blastp", "-query", q, "-db", "uniprot", "-outfmt", "0", "-out", str(work / "st.out")],
            work / "ref",
        ),
    }  # fmt: skip
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    names = list(runs)
    for round_no in range(args.rounds):
        # each round starts at a different run, so no run always goes first (or right after a long one)
        for name in names[round_no % len(names) :] + names[: round_no % len(names)]:
            cmd, cwd, *env = runs[name]
            wall, peak = timed(cmd, cwd, *env)
            results[name].append((wall, peak))
            print(f"round {round_no + 1}: {name}: {wall:.1f} s, peak {peak:.0f} MB", flush=True)

    reference = POSTED.sub(b"", (work / "st.out").read_bytes())
    same = all(
        POSTED.sub(b"", (work / out).read_bytes()) == reference
        for out in (
            "paramedic.out",
            "paramedic-t.out",
            "paramedic-q.out",
            "paramedic-m.out",
            "paramedic-qm.out",
        )
    )
    blast_version = subprocess.run(["blastp", "-version"], capture_output=True, text=True).stdout.split()[1]
    best_name = min((n for n in runs if n.startswith("blastp")), key=lambda n: min(w for w, _ in results[n]))
    best = min(w for w, _ in results[best_name])
    lines = [
        f"## throughput: {args.queries} queries x 20,000 proteins, outfmt 0, {args.fragments} fragments "
        f"({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Command: `.venv/bin/python bench/throughput.py --queries {args.queries} --fragments {args.fragments}"
        f" --rounds {args.rounds}` (2 cores; BLAST+ {blast_version})",
        "",
        "| run | wall s (min of rounds) | vs best BLAST+ | every round, s | peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for name in runs:
        wall = min(w for w, _ in results[name])
        peak = max(p for _, p in results[name])
        every = ", ".join(f"{w:.1f}" for w, _ in results[name])
        lines.append(f"| {name} | {wall:.1f} | {wall / best:.3f} | {every} | {peak:.0f} |")
    lines += [
        "",
        f"All paramedic outputs identical to BLAST+ (Posted date aside): {'yes' if same else 'NO'}. "
        f"Best BLAST+ run: {best_name}. `--strategy auto` (the default) picks queries for this database.",
        "",
    ]
    lines += received_table(work)
    for strategy, out in (("fragments", "paramedic.out"), ("queries", "paramedic-q.out")):
        lines += phase_table(strategy, json.loads((work / f"{out}.run.json").read_text()))
    lines += shim_cost(work, q, args.fragments)
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        results_md = HERE / "RESULTS.md"
        if not results_md.exists():
            results_md.write_text("# Benchmark results\n\nNewest first within each benchmark.\n\n")
        with open(results_md, "a") as fh:
            fh.write(text + "\n")


def received_table(work: Path) -> list[str]:
    """Rank 0's MPI bytes received and peak memory, alignments with the workers vs through rank 0."""
    rows = []
    for name, out in (("with the workers (store)", "paramedic.out"), ("through rank 0", "paramedic-t.out")):
        record = json.loads((work / f"{out}.run.json").read_text())
        rank0 = record["ranks_stats"][0]
        rows.append(
            f"| {name} | {record['alignments']} | {rank0['received_bytes'] / 1e6:.1f} | "
            f"{record['output_bytes'] / 1e6:.1f} | {rank0['peak_rss_mb']:.0f} | {record['wall_seconds']:.1f} |"
        )
    return [
        "Rank 0, --strategy fragments (last round):",
        "",
        "| alignments | run record | rank 0 received MB | output MB | rank 0 peak RSS MB | wall s |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def shim_cost(work: Path, queries: str, fragments: int) -> list[str]:
    """The preliminary-list shim's own cost: one fragment search with and without it, side by side."""
    from paramedic.blast.prelim import environment

    fragment = sorted((work / "pm" / "uniprot").glob("f000.p*"))[0].with_suffix("")
    cmd = ["blastp", "-query", queries, "-db", str(fragment), "-outfmt", "11", "-out", os.devnull]
    walls = {}
    for name, env in (("plain", {}), ("shim", environment())):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=work, env={**os.environ, **env}, check=True, capture_output=True)
        walls[name] = time.perf_counter() - start
    (work / "paramedic-prelim.bin").unlink(missing_ok=True)
    return [
        "",
        f"Preliminary-list shim, one fragment of {fragments} (1 thread, all queries): "
        f"{walls['shim']:.1f} s with it, {walls['plain']:.1f} s without ({walls['shim'] / walls['plain']:.3f}).",
        "",
    ]


def phase_table(strategy: str, record: dict) -> list[str]:
    """Per-phase totals and the per-rank split of one paramedic run (its last round)."""
    totals = record["phase_totals"]
    search = totals["search"] or 1.0
    lines = [
        f"paramedic --strategy {strategy}, per-phase time (seconds summed over ranks, last round; "
        f"{record['pieces']} pieces): "
        + ", ".join(f"{k} {v:.1f}" for k, v in totals.items())
        + (
            f"; regeneration = {100 * totals['regenerate'] / search:.1f}% of search"
            if totals["regenerate"]
            else ""
        )
        + (
            f"; {record['searched_again']} of {record['queries']} queries searched again (hit list filled)."
            if record.get("searched_again") is not None
            else "."
        ),
        "",
        "| rank | role | search tasks | regen tasks | search s | regenerate s | merge s | write s | "
        "peak RSS MB (python) | peak RSS MB (BLAST+) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["ranks_stats"]:
        s = r["seconds"]
        lines.append(
            f"| {r['rank']} | {r['role']} | {r['tasks']['search']} | {r['tasks']['regenerate']} | "
            f"{s['search']:.1f} | {s['regenerate']:.1f} | {s['merge']:.2f} | {s['write']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_blast_rss_mb']:.0f} |"
        )
    return [*lines, ""]


if __name__ == "__main__":
    main()
