"""bench/mirrors: fetching a database's fragment volumes from mirrored remote replicas (issue 14, items 2-4).

Two `paramedic serve --replica` processes (replica A, replica B: byte-for-byte copies of the 20,000
mmseqs2 proteins formatted into --fragments fragments), each behind its own emulated link of --rate-mbit
(its own bottleneck, bench/wan.py's SharedLink, plus Toxiproxy's latency for --rtt-ms). A fetch reads
every fragment volume through `db.stripes.ReplicaSet` into a scratch directory, verified against the
manifest, volumes one after the other (as one worker staging them); its wall time is what is measured
(opening the replicas, a manifest request each, is not). Side by side, each point --repeat times:

  mirrors  replica B unstressed, then stressed (its link slowed --slow times, as CEFT-PVFS's stressed
           disk), each with: B alone (the original tool: one copy), A+B round robin (plain striping: stripe i
           from replica i mod 2), A+B adaptive (pull by measured rate, hot-spot skipping, end-game re-issue)
  streams  one replica over an emulated WAN (--wan-rtt-ms, --wan-rate-mbit) read over 1, 4 and 16 TLS
           streams, with the rate per connection (Toxiproxy's bandwidth toxic: each TCP stream held to
           the rate, as a window-limited stream on a long fat link) and as one shared bottleneck

The stress is the link, not the paper's disk load (a loop of synchronous 1 MiB appends): both replicas
live on this machine's one disk, so loading "B's disk" would load A's too. Prerequisites:
`bash bench/wan/setup.sh` (Toxiproxy). Writes --out (JSON) and prints the Markdown tables.

    .venv/bin/python bench/mirrors.py [--repeat 3] [--parts mirrors,streams]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import wan  # noqa: E402  (bench/wan.py: the emulated link, processes)

from paramedic.db.manifest import Manifest, load_manifest  # noqa: E402
from paramedic.db.stripes import ReplicaSet  # noqa: E402
from paramedic.ship.transport import open_replica  # noqa: E402

SYSTEMS = {  # name: (label, replicas, policy, skip ratio)
    "one": ("B alone (one copy)", ["b"], "adaptive", 4.0),
    "rr": ("A+B round robin (plain striping)", ["a", "b"], "round-robin", 4.0),
    "pull": ("A+B pull by rate, no skipping", ["a", "b"], "adaptive", 1e9),
    "adaptive": ("A+B adaptive (pull + skipping)", ["a", "b"], "adaptive", 4.0),
}


def prepare(work: Path, fragments: int) -> Path:
    db = work / "a" / "uni"
    if not (db / "manifest.json").exists():
        wan.subprocess.run(
            [wan.PARAMEDIC, "format", "--in", str(wan.DATA / "mmseqs2" / "DB.fasta"), "--dbtype", "prot",
             "--fragments", str(fragments), "--out", str(db), "--quiet"], check=True,
        )  # fmt: skip
        shutil.copytree(work / "a", work / "b")
        shutil.copytree(work / "a", work / "wan")
    if not (work / "keys").exists():
        wan.subprocess.run(
            [wan.PARAMEDIC, "keys", "--out", str(work / "keys"), "--server", "localhost", "--client", "compute"],
            check=True, capture_output=True,
        )  # fmt: skip
    return db


def serve(stack: contextlib.ExitStack, work: Path, name: str) -> int:
    root = work / f"root-{name}"
    root.mkdir(exist_ok=True)
    port = wan.free_port()
    log = work / "logs" / f"serve-{name}.log"
    proc = wan.start(
        stack,
        [wan.PARAMEDIC, "serve", "--replica", str(work / name / "uni"), "--root", str(root), "--listen",
         f"127.0.0.1:{port}", "--keys", str(work / "keys/server"), "--io-workers", "1"],
        log,
    )  # fmt: skip
    wan.wait_for_port(port, proc, f"paramedic serve ({name})", log)
    return port


def fetch(
    urls: list[str],
    keys: Path,
    manifest: Manifest,
    policy: str,
    stripe: int,
    dest: Path,
    skip_ratio: float = 4.0,
) -> dict:
    rs = ReplicaSet.open(
        urls, manifest, keys, opener=open_replica, stripe_bytes=stripe, policy=policy, skip_ratio=skip_ratio
    )
    dest.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        size = 0
        for fragment in manifest.fragments:
            size += rs.fetch_volume(fragment.volume, fragment.sha256, dest).bytes
        seconds = time.perf_counter() - t0
        return {"seconds": round(seconds, 3), "bytes": size, "replicas": rs.report()}
    finally:
        rs.close()
        shutil.rmtree(dest, ignore_errors=True)


def run_mirrors(
    args: argparse.Namespace, stack: contextlib.ExitStack, work: Path, manifest: Manifest
) -> dict:
    ports = {name: serve(stack, work, name) for name in ("a", "b")}
    links = {name: wan.EmulatedLink(stack, work / f"link-{name}", "shared") for name in ports}
    exposed = {name: links[name].expose(f"serve-{name}", ports[name]) for name in ports}
    probe = wan.probe_server(stack)
    probes = {name: links[name].expose(f"probe-{name}", probe) for name in ports}
    keys = work / "keys/compute"
    urls = {name: f"tls://localhost:{exposed[name]}/{name}?streams={args.streams}" for name in ports}
    results: dict[str, Any] = {"links": {}, "runs": []}
    for stressed in (False, True):
        rate_b = args.rate_mbit / args.slow if stressed else args.rate_mbit
        links["a"].set(args.rtt_ms, args.rate_mbit)
        links["b"].set(args.rtt_ms, rate_b)
        for name, rate in (("a", args.rate_mbit), ("b", rate_b)):
            check = wan.check_link(probes[name], args.rtt_ms, rate, streams=2)
            results["links"][f"{name}-{'stressed' if stressed else 'normal'}"] = check
            print(f"link {name} at {rate:g} Mbit/s: measured {check['measured_down_mbit']} Mbit/s down, "
                  f"rtt {check['measured_rtt_ms']} ms, ok={check['ok']}", flush=True)  # fmt: skip
        for repeat in range(args.repeat):
            for system, (label, names, policy, skip_ratio) in SYSTEMS.items():
                run = fetch([urls[n] for n in names], keys, manifest, policy, args.stripe_kib * 1024,
                            work / "fetched", skip_ratio)  # fmt: skip
                run.update(system=system, stressed=stressed, repeat=repeat)
                results["runs"].append(run)
                skipped = [r["replica"] for r in run["replicas"] if r["skipped"]]
                print(f"{'stressed' if stressed else 'normal  '} {label:35s} {run['seconds']:7.2f} s "
                      f"{[r['stripes'] for r in run['replicas']]} stripes, skipped {skipped}", flush=True)  # fmt: skip
    return results


def run_streams(
    args: argparse.Namespace, stack: contextlib.ExitStack, work: Path, manifest: Manifest
) -> dict:
    port = serve(stack, work, "wan")
    keys = work / "keys/compute"
    results: dict[str, Any] = {"links": {}, "runs": []}
    probe = wan.probe_server(stack)
    for shaper in ("toxiproxy", "shared"):
        link = wan.EmulatedLink(stack, work / f"link-wan-{shaper}", shaper)
        exposed = link.expose("serve-wan", port)
        probe_port = link.expose("probe-wan", probe)
        link.set(args.wan_rtt_ms, args.wan_rate_mbit)
        check = wan.check_link(probe_port, args.wan_rtt_ms, args.wan_rate_mbit, streams=4)
        results["links"][shaper] = check
        print(f"WAN ({shaper}): rtt {check['measured_rtt_ms']} ms, {check['measured_down_mbit']} Mbit/s one "
              f"stream, {check['measured_parallel_up_mbit']} Mbit/s 4 streams", flush=True)  # fmt: skip
        for repeat in range(args.repeat):
            for streams in args.stream_counts:
                url = f"tls://localhost:{exposed}/a?streams={streams}"
                run = fetch([url], keys, manifest, "adaptive", args.stripe_kib * 1024, work / "fetched")
                run.update(shaper=shaper, streams=streams, repeat=repeat)
                results["runs"].append(run)
                mbit = run["bytes"] * 8 / run["seconds"] / 1e6
                print(
                    f"WAN {shaper:9s} {streams:2d} streams: {run['seconds']:7.2f} s  {mbit:6.2f} Mbit/s",
                    flush=True,
                )
    return results


def tables(results: dict, args: argparse.Namespace) -> str:
    out = []
    if "mirrors" in results:
        runs = results["mirrors"]["runs"]

        def median(system: str, stressed: bool) -> float:
            return statistics.median(
                r["seconds"] for r in runs if r["system"] == system and r["stressed"] == stressed
            )

        base_one = median("one", False)
        out += [
            f"Fetch of all {args.fragments} fragment volumes ({runs[0]['bytes'] / 1e6:.1f} MB), each replica behind "
            f"its own {args.rate_mbit:g} Mbit/s link (RTT {args.rtt_ms:g} ms), stripes {args.stripe_kib} KiB, "
            f"{args.streams} streams per replica; stressed: replica B's link at 1/{args.slow:g} of the rate. "
            f"Median of {args.repeat}.",
            "",
            "| system | unstressed (s) | B stressed (s) | slowdown (stressed / unstressed) | stressed vs B alone unstressed | paper |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        paper = {"one": "10x", "rr": "21x", "pull": "", "adaptive": "2x"}
        for system, (label, *_) in SYSTEMS.items():
            normal, stressed = median(system, False), median(system, True)
            out.append(
                f"| {label} | {normal:.2f} | {stressed:.2f} | {stressed / normal:.2f}x | "
                f"{stressed / base_one:.2f}x | {paper[system]} |"
            )
        last = [r for r in runs if r["system"] == "adaptive" and r["stressed"]][-1]
        out += ["", "Adaptive, B stressed (last run), per replica:", "",
                "| replica | stripes | MB | busy s | MB/s | skipped |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for row in last["replicas"]:
            out.append(f"| {row['replica'].split('?')[0]} | {row['stripes']} | {row['bytes'] / 1e6:.2f} | "
                       f"{row['seconds']} | {row['throughput_mb_s']} | {row['skipped'] or ''} |")  # fmt: skip
        out.append("")
    if "streams" in results:
        runs = results["streams"]["runs"]
        out += [
            f"One remote replica over the emulated WAN: RTT {args.wan_rtt_ms:g} ms, {args.wan_rate_mbit:g} Mbit/s "
            f"(per connection, or one shared bottleneck), stripes {args.stripe_kib} KiB. Median of {args.repeat}.",
            "",
            "| streams | per-connection rate: s | Mbit/s | shared bottleneck: s | Mbit/s |",
            "|---:|---:|---:|---:|---:|",
        ]
        for streams in args.stream_counts:
            cells = []
            for shaper in ("toxiproxy", "shared"):
                secs = statistics.median(
                    r["seconds"] for r in runs if r["shaper"] == shaper and r["streams"] == streams
                )
                cells += [f"{secs:.2f}", f"{runs[0]['bytes'] * 8 / secs / 1e6:.2f}"]
            out.append(f"| {streams} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="mirrors,streams")
    parser.add_argument("--fragments", type=int, default=16)
    parser.add_argument("--rate-mbit", type=float, default=20.0, help="each replica's link (mirrors)")
    parser.add_argument("--rtt-ms", type=float, default=2.0, help="each replica's link (mirrors)")
    parser.add_argument(
        "--slow", type=float, default=10.0, help="the stressed link is this many times slower"
    )
    parser.add_argument("--stripe-kib", type=int, default=64)
    parser.add_argument("--streams", type=int, default=4, help="TLS streams per replica (mirrors)")
    parser.add_argument("--wan-rtt-ms", type=float, default=50.0)
    parser.add_argument("--wan-rate-mbit", type=float, default=10.0)
    parser.add_argument("--stream-counts", default="1,4,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new one in /tmp, removed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "mirrors-results.json")
    args = parser.parse_args()
    args.stream_counts = [int(s) for s in args.stream_counts.split(",")]
    parts = args.parts.split(",")
    work = args.work or Path(tempfile.mkdtemp(prefix="paramedic-mirrors-"))
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k not in ("work", "out")}}
    try:
        with contextlib.ExitStack() as stack:
            (work / "logs").mkdir(parents=True, exist_ok=True)
            db = prepare(work, args.fragments)
            manifest = load_manifest(db)
            if "mirrors" in parts:
                results["mirrors"] = run_mirrors(args, stack, work, manifest)
            if "streams" in parts:
                results["streams"] = run_streams(args, stack, work, manifest)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    results["args"]["stream_counts"] = args.stream_counts
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print()
    print(tables(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
