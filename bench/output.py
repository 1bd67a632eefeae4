"""bench/output: the output strategies side by side (issue 13 item 3), onto a filesystem of limited I/O.

The output goes to an sshfs mount whose every byte crosses bench/wan's emulated link (a private sshd
behind Toxiproxy's latency and the harness's shared rate limiter): a slow shared filesystem that every
rank sees. Why this one: this kernel has no device-mapper (dm-delay: "/dev/mapper/control: open failed")
and cgroup v1's blkio throttle does not hold back buffered writes (the flusher threads write them), so a
throttled block device was not available; the link is the filesystem's bandwidth, shared by all ranks,
as a parallel filesystem's is by a job's nodes.

Each strategy runs the same search (mmseqs2 queries against the 20,000 proteins, outfmt 0, --no-journal
so only the output crosses the link) with as many ranks as asked (more ranks than cores); every output
is compared with the local master run's by sha256. Per rank, as the paper's Table I: init (the launch:
MPI start, the job's checks; the launcher's elapsed time less rank 0's job wall), BLAST (search +
regenerate), write (rank 0: taking pieces and writing; workers: MPI-IO) and other (the rest of the job's
wall: waiting for tasks, merging, messages).

    bash bench/wan/setup.sh           # once: toxiproxy, sshd, sshfs
    .venv/bin/python bench/output.py --queries 150 --np 6 --rate-mbit 10 --rtt-ms 2
    .venv/bin/python bench/output.py --queries 150 --np 8 --partition-size 4   # also in partitions
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import wan  # noqa: E402  (bench/wan.py: the emulated link, sshd, sshfs)

STRATEGIES = ["master", "worker-individual", "worker-collective", "worker-merge"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(
    work: Path, out: Path, strategy: str, np: int, queries: Path, partition_size: int | None = None
) -> dict:
    start = time.perf_counter()
    name = strategy if partition_size is None else f"{strategy}, partitions of {partition_size}"
    record_path = work / f"{name.replace(', ', '-').replace(' ', '-')}.run.json"
    extra = [] if partition_size is None else ["--partition-size", str(partition_size)]
    proc = subprocess.run(
        [wan.PARAMEDIC, "search", "blastp", "-query", str(queries), "-db", "db/uniprot", "-outfmt", "0",
         "-out", str(out), "--np", str(np), "--strategy", "fragments", "--no-journal", "--quiet",
         "--record", str(record_path), "--output-strategy", strategy, *extra],
        cwd=work / "compute", capture_output=True, text=True,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{strategy}: exit {proc.returncode}: {proc.stderr.strip()}")
    record = json.loads(record_path.read_text())
    wall = record["wall_seconds"]
    ranks = []
    for r in record["ranks_stats"]:
        s = r["seconds"]
        blast = s["search"] + s["regenerate"]
        ranks.append(
            {"rank": r["rank"], "role": r["role"], "init": elapsed - wall, "blast": blast, "write": s["write"],
             "other": max(0.0, wall - blast - s["write"])}
        )  # fmt: skip
    return {"strategy": name, "elapsed": elapsed, "wall": wall, "bytes": out.stat().st_size,
            "sha256": sha256(out), "ranks": ranks}  # fmt: skip


def table(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"{args.queries} queries x 20,000 proteins, outfmt 0, {args.np + 1} ranks on {os.cpu_count()} cores, "
        f"output over sshfs through a {args.rate_mbit} Mbit/s, {args.rtt_ms} ms RTT link",
        "",
        "| strategy | elapsed s | job wall s | bytes | same as local master | rank 0 init / BLAST / write / other s "
        "| workers (mean) init / BLAST / write / other s | worker write max s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    local = results[0]["sha256"]
    for res in results[1:]:
        zero = res["ranks"][0]
        # the workers: every rank but 0 and the partition masters (who run no BLAST+ and write nothing)
        workers = [r for r in res["ranks"][1:] if r["role"] == "worker"]

        def mean(key: str, ranks: list[dict] = workers) -> float:
            return sum(r[key] for r in ranks) / len(ranks)

        lines.append(
            f"| {res['strategy']} | {res['elapsed']:.1f} | {res['wall']:.1f} | {res['bytes']:,} | "
            f"{'yes' if res['sha256'] == local else 'NO'} | "
            f"{zero['init']:.1f} / {zero['blast']:.1f} / {zero['write']:.2f} / {zero['other']:.1f} | "
            f"{mean('init'):.1f} / {mean('blast'):.1f} / {mean('write'):.2f} / {mean('other'):.1f} | "
            f"{max(r['write'] for r in workers):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queries", type=int, default=150)
    parser.add_argument("--np", type=int, default=6, help="workers (ranks - 1)")
    parser.add_argument("--fragments", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, default=10.0)
    parser.add_argument("--rtt-ms", type=float, default=2.0)
    parser.add_argument(
        "--partition-size", type=int, help="also run every strategy in partitions of this many ranks"
    )
    parser.add_argument("--work", type=Path, default=Path(__file__).parent / "output-work")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "output-results.json")
    args = parser.parse_args()
    work = args.work.resolve()
    wan.prepare(work, args.fragments)
    queries = wan.write_queries(work, args.queries)
    results = []
    with contextlib.ExitStack() as stack:
        link = wan.EmulatedLink(stack, work, "shared")
        sshd_port, key = wan.start_sshd(stack, work)
        port = link.expose("sshd", sshd_port)
        link.set(args.rtt_ms, args.rate_mbit)
        mount = stack.enter_context(
            wan.sshfs_mount(port, key, work / "storage" / "root", work / "mnt", work / "logs" / "sshfs.log")
        )
        results.append(run(work, work / "compute" / "local" / "hits.txt", "master", args.np, queries))
        sizes = [None] if args.partition_size is None else [None, args.partition_size]
        for partition_size in sizes:
            for strategy in STRATEGIES:
                out = mount / "runs" / f"{strategy}.txt"
                results.append(run(work, out, strategy, args.np, queries, partition_size))
                print(f"{results[-1]['strategy']}: {results[-1]['elapsed']:.1f} s", file=sys.stderr)
                out.unlink()
    args.out.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=1)
    )
    print(table(results, args))


if __name__ == "__main__":
    main()
