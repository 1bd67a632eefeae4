"""What the resume journal costs, and what a resume saves (issue 11 item 16).

Side by side in one run, alternating, on the mmseqs2 queries against the 20,000 proteins (outfmt 0,
--strategy fragments, 2 workers):
  - `paramedic search` (journal kept: the default) against the same with `--no-journal` (the baseline);
    the journal's peak size on disk is sampled while it runs;
  - a run whose every rank is SIGKILLed when half of its fragment searches are journaled, then run again:
    the second run's wall time against an uninterrupted run's (what the resume saves), and its output
    compared with the uninterrupted output (sha256).

    .venv/bin/python bench/journal.py --queries 200 --rounds 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from paramedic.report.record import RunRecord

BIN = Path(sys.executable).parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))


def journal_bytes(journal: Path) -> int:
    total = 0
    for root, _, files in os.walk(journal):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                pass
    return total


def run(command: list[str], cwd: Path, journal: Path) -> tuple[float, int]:
    """Wall seconds, and the journal's peak size sampled every 50 ms."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], journal_bytes(journal))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return wall, peak[0]


def records(directory: Path) -> list[str]:
    """The journal's finished records (not the temporary files of one being written)."""
    return [n for n in os.listdir(directory) if not n.startswith(".")]


def killed_half_way(command: list[str], cwd: Path, journal: Path, searches: int) -> int:
    """Run under our own mpiexec and SIGKILL every rank once half the searches are journaled."""
    ranks_dir = cwd / "ranks"
    ranks_dir.mkdir(exist_ok=True)
    tmp = cwd / "tmp"  # the killed ranks' temporary files stay in the bench's directory (removed at the end)
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PARAMEDIC_RANKS_DIR": str(ranks_dir), "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [str(BIN / "mpiexec"), "-n", "3", sys.executable, "-m", "paramedic", *command[1:]],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    search = journal / "search"
    while not (search.is_dir() and len(records(search)) >= searches // 2):
        if proc.poll() is not None:
            raise SystemExit("the run ended before half of its searches were journaled")
        time.sleep(0.01)
    kept = len(records(search))
    for pid in (int(p.name) for p in ranks_dir.iterdir() if p.name.isdigit()):
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-journal-"))
    records = (DATA / "mmseqs2" / "QUERY.fasta").read_text().split("\n>")
    queries = "\n>".join(records[: args.queries]).rstrip("\n") + "\n"
    (work / "q.fasta").write_text(queries if queries.startswith(">") else ">" + queries)
    subprocess.run(
        [str(BIN / "paramedic"), "format", "--in", str(DATA / "mmseqs2" / "DB.fasta"), "--dbtype", "prot",
         "--fragments", str(args.fragments), "--out", "db/uniprot", "--quiet"],
        cwd=work, check=True,
    )  # fmt: skip

    def command(out: str, *extra: str) -> list[str]:
        return [str(BIN / "paramedic"), "search", "blastp", "-query", "q.fasta", "-db", "db/uniprot",
                "-outfmt", "0", "-out", out, "--np", "2", "--strategy", "fragments", "--quiet", *extra]  # fmt: skip

    walls: dict[str, list[float]] = {"journal": [], "no journal": []}
    peak = 0
    for round_ in range(args.rounds):  # the two alternate which goes first
        for name in ("journal", "no journal") if round_ % 2 == 0 else ("no journal", "journal"):
            if name == "journal":
                wall, size = run(command("j.out"), work, work / ".j.out.journal")
                peak = max(peak, size)
            else:
                wall, _ = run(command("n.out", "--no-journal"), work, work / ".n.out.journal")
            walls[name].append(wall)
    reference = hashlib.sha256((work / "n.out").read_bytes()).hexdigest()
    assert hashlib.sha256((work / "j.out").read_bytes()).hexdigest() == reference
    record = RunRecord.load(work / "j.out.run.json")
    searches = record.batches * record.fragments

    kept = killed_half_way(command("r.out"), work, work / ".r.out.journal", searches)
    resumed_wall, _ = run(command("r.out"), work, work / ".r.out.journal")
    resumed = RunRecord.load(work / "r.out.run.json").resumed
    identical = hashlib.sha256((work / "r.out").read_bytes()).hexdigest() == reference

    best = {name: min(w) for name, w in walls.items()}
    output_bytes = (work / "n.out").stat().st_size
    print(f"{args.queries} queries x {args.fragments} fragments, outfmt 0, 2 workers, {args.rounds} rounds "
          f"(best of), {searches} fragment searches, output {output_bytes:,} bytes")  # fmt: skip
    print("| configuration | wall (s) | ratio to --no-journal |")
    print("|---|---|---|")
    for name in ("no journal", "journal"):
        print(f"| {name} | {best[name]:.1f} | {best[name] / best['no journal']:.3f} |")
    print(f"journal peak on disk: {peak / 1e6:.1f} MB ({peak / output_bytes:.2f} x the output)")
    print(
        f"killed with {kept} of {searches} searches journaled; run again: {resumed_wall:.1f} s "
        f"({resumed_wall / best['journal']:.2f} of an uninterrupted run), resumed {resumed}, "
        f"output identical: {identical}"
    )
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
