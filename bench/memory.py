"""Why segment a database: a database several times larger than the memory one worker may use
(issue 13 item 6).

Every worker runs in a memory cgroup of its own (cgroup v1 `memory.limit_in_bytes`; the page cache a
process reads in is charged to its cgroup, so a worker whose files do not fit re-reads them from disk).
Side by side in one run, each with the database's pages dropped from the page cache first:

  - `blastp -num_threads 2`, one process in one cgroup holding the memory of all the workers together;
  - `paramedic search --strategy queries`: every worker searches the whole database;
  - `paramedic search --strategy fragments`: every worker searches fragments (cache affinity keeps a
    worker on the fragments it has read);
  - `paramedic search --strategy auto`, to show what it picks and why (the run record's
    `strategy_reason`).

The ranks are started by MPICH's `mpiexec` (the one in .venv), each through a wrapper that moves the
rank into its cgroup (`rank<PMI_RANK>`) before it execs Python; BLAST+ runs are the rank's children and
inherit it. The master (rank 0) gets a cgroup of the same limit.

The database is built from the real data: the 20,000 mmseqs2 proteins plus decoy copies of them (each
reversed, rotated and given one of a set of conservative substitutions, so that the queries' hits stay
those of the real proteins and the copies cost what unrelated proteins of the same composition and
lengths cost to scan), enough copies that the whole database's BLAST+ files are `--times` the limit.

    .venv/bin/python bench/memory.py --limit-mb 256 --times 4 --workers 8 --fragments 16 --queries 24

Needs root (or a delegated cgroup v1 memory hierarchy); the cgroups are made under this process's own
memory cgroup and removed at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from paramedic.report.record import RunRecord

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
MiB = 1 << 20

# Conservative substitutions (positive BLOSUM62 scores): a decoy copy swaps a random subset of them.
SWAPS = ("IV", "LM", "DE", "KR", "ST", "NQ", "FY")


def read_fasta(path: Path) -> list[tuple[str, str]]:
    records: list[tuple[str, str]] = []
    header, chunks = "", list[str]()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for line in fh:
            if line.startswith(">"):
                if header:
                    records.append((header, "".join(chunks)))
                header, chunks = line[1:].rstrip("\n"), []
            else:
                chunks.append(line.strip())
    if header:
        records.append((header, "".join(chunks)))
    return records


def write_decoys(proteins: list[tuple[str, str]], copies: int, out: Path) -> None:
    """The real proteins, then `copies` decoy copies (reversed, rotated, conservatively substituted)."""
    rng = random.Random(13)
    with open(out, "w") as fh:
        for header, seq in proteins:
            fh.write(f">{header}\n{seq}\n")
        for k in range(1, copies + 1):
            swaps = [s for s in SWAPS if rng.random() < 0.5]
            table = (
                str.maketrans(
                    "".join(swaps) + "".join(s[::-1] for s in swaps),
                    "".join(s[::-1] for s in swaps) + "".join(swaps),
                )
                if swaps
                else None
            )
            for header, seq in proteins:
                rev = seq[::-1]
                shift = (7 * k) % len(rev) if rev else 0
                decoy = rev[shift:] + rev[:shift]
                if table:
                    decoy = decoy.translate(table)
                name, _, rest = header.partition(" ")
                fh.write(f">decoy{k}_{name} {rest}\n{decoy}\n")


def db_bytes(directory: Path, volume: str) -> int:
    return sum(p.stat().st_size for p in directory.glob(volume + ".*") if p.suffix not in (".pal", ".nal"))


def build(work: Path, limit: int, times: float, fragments: int) -> Path:
    """The formatted database (kept in `work` between runs of the bench)."""
    db = work / f"db-{limit // MiB}m-x{times:g}-f{fragments}"
    if (db / "manifest.json").is_file():
        return db
    proteins = read_fasta(DATA / "mmseqs2" / "DB.fasta")
    # bytes of BLAST+ files per residue, from the 20,000 proteins formatted alone
    probe = work / "probe"
    shutil.rmtree(probe, ignore_errors=True)
    subprocess.run(
        [
            BIN / "paramedic",
            "format",
            "--in",
            DATA / "mmseqs2" / "DB.fasta",
            "--dbtype",
            "prot",
            "--fragments",
            "1",
            "--out",
            probe,
        ],
        check=True,
        capture_output=True,
    )
    per_copy = db_bytes(probe, "whole")
    shutil.rmtree(probe)
    probe.with_suffix(".pal").unlink(missing_ok=True)
    copies = max(0, round(times * limit / per_copy) - 1)
    fasta = work / "decoys.fasta"
    print(
        f"building: 20,000 proteins + {copies} decoy copies ({per_copy / MiB:.1f} MiB of BLAST+ files each)",
        file=sys.stderr,
        flush=True,
    )
    write_decoys(proteins, copies, fasta)
    subprocess.run(
        [
            BIN / "paramedic",
            "format",
            "--in",
            fasta,
            "--dbtype",
            "prot",
            "--fragments",
            str(fragments),
            "--out",
            db,
        ],
        check=True,
    )
    fasta.unlink()
    return db


# -- cgroups ------------------------------------------------------------------------------------------


def own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise SystemExit("no cgroup v1 memory controller (this bench needs /sys/fs/cgroup/memory)")


@contextmanager
def cgroups(names: list[str], limit: dict[str, int]) -> Iterator[dict[str, Path]]:
    """Memory cgroups under this process's own, removed afterwards (after their processes ended)."""
    base = own_memory_cgroup() / f"paramedic-bench-{os.getpid()}"
    base.mkdir()
    made = {}
    try:
        for name in names:
            made[name] = base / name
            made[name].mkdir()
            (made[name] / "memory.limit_in_bytes").write_text(str(limit[name]))
        yield made
    finally:
        for path in [*made.values(), base]:
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def cgroup_figures(path: Path) -> dict[str, int]:
    stat = dict(line.split() for line in (path / "memory.stat").read_text().splitlines())
    return {
        "peak": int((path / "memory.max_usage_in_bytes").read_text()),
        "failcnt": int((path / "memory.failcnt").read_text()),
        "major_faults": int(stat.get("total_pgmajfault", 0)),
        "paged_in": int(stat.get("total_pgpgin", 0)) * os.sysconf("SC_PAGE_SIZE"),
    }


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (only theirs): a page cached already is read free by a
    cgroup that did not charge it, so every run starts with the database on disk."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_bytes() -> int:
    """Bytes read from the block devices since boot (/proc/diskstats, whole disks), the whole machine."""
    total = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        name = fields[2]
        if Path("/sys/block", name).exists() and not name.startswith(("loop", "ram")):
            total += int(fields[5]) * 512
    return total


def in_cgroup(path: Path, command: list[str]) -> list[str]:
    return ["sh", "-c", f'echo $$ > {path}/cgroup.procs && exec "$@"', "sh", *command]


def timed(command: list[str], cwd: Path, files: list[Path]) -> tuple[float, int]:
    evict(files)
    before = disk_read_bytes()
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, disk_read_bytes() - before


def sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit-mb", type=int, default=256, help="memory cgroup limit per worker (MiB)")
    parser.add_argument("--times", type=float, default=4, help="database size / limit")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--fragments", type=int, default=16)
    parser.add_argument("--queries", type=int, default=12)
    parser.add_argument("--outfmt", default="6")
    parser.add_argument("--runs", default="blastp,queries,fragments,auto")
    parser.add_argument("--work", type=Path, default=HERE / "out" / "memory")
    args = parser.parse_args()
    limit = args.limit_mb * MiB
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    db = build(work, limit, args.times, args.fragments)
    queries = work / "q.fasta"
    records = read_fasta(DATA / "mmseqs2" / "QUERY.fasta")[: args.queries]
    queries.write_text("".join(f">{h}\n{s}\n" for h, s in records))
    files = [p for p in db.iterdir() if p.is_file()]
    # the master digests a database's volumes on its first search (then cached): not in a timed run
    from paramedic.db.locate import resolve_database

    resolve_database(str(db), work)
    whole = db_bytes(db, "whole")
    largest = max(db_bytes(db, f"f{i:03d}") for i in range(args.fragments))
    ranks = args.workers + 1
    blast_args = ["-query", str(queries), "-db", str(db), "-outfmt", args.outfmt]
    names = ["blastp"] + [f"rank{r}" for r in range(ranks)]
    limits = {"blastp": args.workers * limit, **{f"rank{r}": limit for r in range(ranks)}}
    rows = []
    for run in args.runs.split(","):
        out = work / f"out-{run}.txt"
        with cgroups(names, limits) as cg:
            if run == "blastp":
                command = in_cgroup(
                    cg["blastp"], ["blastp", *blast_args, "-out", str(out), "-num_threads", "2"]
                )
                watched = [cg["blastp"]]
            else:
                rank_cg = cg["rank0"].parent / "rank$PMI_RANK"
                wrapper = ["sh", "-c", f'echo $$ > {rank_cg}/cgroup.procs && exec "$@"', "sh"]
                command = [
                    str(BIN / "mpiexec"), "-n", str(ranks), *wrapper, sys.executable, "-m", "paramedic",
                    "search", "blastp", *blast_args, "-out", str(out), "--strategy", run, "--quiet",
                ]  # fmt: skip
                watched = [cg[f"rank{r}"] for r in range(ranks)]
            wall, read = timed(command, work, files)
            figures = [cgroup_figures(p) for p in watched]
        row = {
            "run": run,
            "wall": round(wall, 1),
            "disk_read_gib": round(read / (1 << 30), 2),
            "peak_mib": [round(f["peak"] / MiB) for f in figures],
            "limit_hits": sum(f["failcnt"] for f in figures),
            "major_faults": sum(f["major_faults"] for f in figures),
            "paged_in_gib": round(sum(f["paged_in"] for f in figures) / (1 << 30), 2),
            "paged_in_gib_per_cgroup": [round(f["paged_in"] / (1 << 30), 2) for f in figures],
            "sha256": sha(out),
        }
        if run != "blastp":
            record = RunRecord.load(Path(str(out) + ".run.json"))
            row["strategy"] = record.strategy
            row["reason"] = record.strategy_reason["reason"] if record.strategy_reason else None
            row["tasks"] = sum(r.tasks["search"] for r in record.ranks_stats)
            row["regenerate"] = sum(r.tasks["regenerate"] for r in record.ranks_stats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = next((r["wall"] for r in rows if r["run"] == "blastp"), None)
    print(
        f"\ndatabase: {whole / MiB:,.0f} MiB of BLAST+ files (whole volume), largest fragment "
        f"{largest / MiB:,.0f} MiB, {args.fragments} fragments; limit {args.limit_mb} MiB per worker "
        f"(blastp: {args.workers} x {args.limit_mb} MiB); {args.workers} workers + master; "
        f"{args.queries} queries, -outfmt {args.outfmt}"
    )
    print(
        "| run | wall s | vs blastp | peak MiB per cgroup (master first) | limit hits | major faults | "
        "paged in GiB | disk read GiB | output sha256 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['wall'] / base:.2f}" if base else "-"
        name = r["run"] if r["run"] == "blastp" else f"--strategy {r['run']} ({r.get('strategy')})"
        print(
            f"| {name} | {r['wall']} | {ratio} | {', '.join(map(str, r['peak_mib']))} | {r['limit_hits']} | "
            f"{r['major_faults']:,} | {r['paged_in_gib']} | {r['disk_read_gib']} | {r['sha256']} |"
        )
    for r in rows:
        if r.get("reason"):
            print(f"\n{r['run']}: {r['reason']}")


if __name__ == "__main__":
    main()
