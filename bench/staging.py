"""bench/staging: reading fragments in place on slow shared storage vs staging them to a node-local cache
(issue 14 item 4, staging rows), side by side in one run.

The database lies on an sshfs mount whose every byte crosses bench/wan's emulated link (a private sshd
behind Toxiproxy's latency and the harness's shared rate limiter): shared storage slower than the node's
disk, as a cluster's parallel filesystem is under load. The same search runs, in turn:

  in-place    -db on the mount, no --stage: every fragment search reads the fragment over the link
  stage-cold  --stage on local disk, empty: each fragment is copied once, then searched locally
  stage-warm  --stage again: the copies of the run before are used, nothing is copied

Before every run the page cache of the database's files (on the mount) and of the stage cache is dropped
(posix_fadvise DONTNEED, as bench/memory.py does), so no run is helped by the one before except through
the stage cache itself. The whole-database volume (headers for the report, regeneration) is read from the
mount in every configuration: only fragments are staged. Every output is compared by sha256.

    bash bench/wan/setup.sh           # once: toxiproxy, sshd, sshfs
    .venv/bin/python bench/staging.py --queries 100 --np 2 --rate-mbit 20 --rtt-ms 2 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import wan  # noqa: E402  (bench/wan.py: the emulated link, sshd, sshfs)

from paramedic.db.manifest import load_manifest, verify_volumes  # noqa: E402

CONFIGS = ["in-place", "stage-cold", "stage-warm"]


def drop_cache(directory: Path) -> None:
    """Drop the page cache of every file under `directory` (a FUSE mount's too)."""
    for path in directory.rglob("*"):
        if path.is_file():
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def run(work: Path, db: str, config: str, round_: int, args: argparse.Namespace, queries: Path) -> dict:
    cache = work / "compute" / "stage"
    if config == "stage-cold":
        shutil.rmtree(cache, ignore_errors=True)
    drop_cache(work / "mnt" / "db")
    if cache.exists():
        drop_cache(cache)
    out = work / "compute" / "runs" / f"{config}-{round_}.txt"
    record_path = work / "compute" / "runs" / f"{config}-{round_}.run.json"
    stage = [] if config == "in-place" else ["--stage", str(cache)]
    start = time.perf_counter()
    proc = subprocess.run(
        [wan.PARAMEDIC, "search", "blastp", "-query", str(queries), "-db", db, "-outfmt", "0",
         "-out", str(out), "--np", str(args.np), "--strategy", "fragments", "--batch", str(args.batch),
         "--no-journal", "--quiet", "--record", str(record_path), *stage],
        cwd=work / "compute", capture_output=True, text=True,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{config}: exit {proc.returncode}: {proc.stderr.strip()}")
    record = json.loads(record_path.read_text())
    search = sum(r["seconds"]["search"] for r in record["ranks_stats"])
    result = {
        "config": config,
        "round": round_,
        "elapsed": round(elapsed, 2),
        "wall": record["wall_seconds"],
        "search_seconds": round(search, 2),
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "stage": record.get("stage"),
        "searches": sum(r["tasks"]["search"] for r in record["ranks_stats"]),
    }
    out.unlink()
    return result


def table(results: list[dict], args: argparse.Namespace, db_bytes: int, fragment_bytes: int) -> str:
    lines = [
        f"{args.queries} queries x 20,000 proteins ({args.fragments} fragments, {fragment_bytes / 2**20:.1f} MiB of "
        f"fragment files, {db_bytes / 2**20:.1f} MiB in all), outfmt 0, --batch {args.batch}, {args.np} workers "
        f"on {os.cpu_count()} cores; database on sshfs through a {args.rate_mbit} Mbit/s, {args.rtt_ms} ms "
        f"RTT link, stage cache on local disk",
        "",
        "| run | round | elapsed s | job wall s | vs in-place | BLAST search s (all ranks) | searches | copies "
        "| copied MiB | copy s | hits | same output |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = results[0]["sha256"]
    for res in results:
        base = next(r for r in results if r["config"] == "in-place" and r["round"] == res["round"])
        st = res["stage"] or {}
        lines.append(
            f"| {res['config']} | {res['round']} | {res['elapsed']:.1f} | {res['wall']:.1f} | "
            f"{res['elapsed'] / base['elapsed']:.2f} | {res['search_seconds']:.1f} | {res['searches']} | "
            f"{st.get('copies', '-')} | "
            + (f"{st['copied_bytes'] / 2**20:.1f}" if st else "-")
            + f" | {st.get('copy_seconds', '-')} | {st.get('hits', '-')} | "
            f"{'yes' if res['sha256'] == reference else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--np", type=int, default=2, help="workers (ranks - 1)")
    parser.add_argument("--batch", type=int, default=25, help="queries per search task")
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, default=20.0)
    parser.add_argument("--rtt-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1, help="in-place, cold, warm, this many times")
    parser.add_argument("--work", type=Path, default=Path(__file__).parent / "staging-work")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "staging-results.json")
    args = parser.parse_args()
    work = args.work.resolve()
    wan.prepare(work, args.fragments)  # compute/db/uniprot, and storage/replica: a byte copy
    shutil.move(work / "storage" / "replica", work / "storage" / "root" / "db")
    queries = wan.write_queries(work, args.queries)
    (work / "compute" / "runs").mkdir(exist_ok=True)
    results = []
    try:
        with contextlib.ExitStack() as stack:
            link = wan.EmulatedLink(stack, work, "shared")
            sshd_port, key = wan.start_sshd(stack, work)
            port = link.expose("sshd", sshd_port)
            link.set(args.rtt_ms, args.rate_mbit)
            mount = stack.enter_context(
                wan.sshfs_mount(
                    port, key, work / "storage" / "root", work / "mnt", work / "logs" / "sshfs.log"
                )
            )
            db = mount / "db" / "uniprot"
            manifest = load_manifest(db)
            verify_volumes(db, manifest)  # digests once (cached): not part of any run's time
            db_bytes = sum(p.stat().st_size for p in db.iterdir())
            fragment_bytes = sum(
                p.stat().st_size for f in manifest.fragments for p in db.glob(f.volume + ".*")
            )
            for round_ in range(1, args.rounds + 1):
                for config in CONFIGS:
                    results.append(run(work, str(db), config, round_, args, queries))
                    print(f"{config} {round_}: {results[-1]['elapsed']:.1f} s", file=sys.stderr)
    finally:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=1)
        )
    print(table(results, args, db_bytes, fragment_bytes))


if __name__ == "__main__":
    main()
