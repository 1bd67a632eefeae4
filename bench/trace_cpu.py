"""CPU seconds of shipping a trace, at both ends: the `paramedic ship` command's and the storage site's
(issue 22). On a shared machine wall times follow the other users' load; CPU seconds much less, so they
say whether a change made the metadata path cheaper.

Traces LAMMPS (melt and flow.pois, 2 ranks) as bench/trace_wan.py does, starts a `paramedic serve` (no
replica) and ships each trace --ship metadata and compressed over plain localhost TLS (no link emulation),
ROUNDS times; prints the medians of wall, the command's CPU (user + system, its children's rusage) and the
site's CPU (its /proc stat over the command, read 0.3 s after). `--base-src DIR`: the same runs with the
paramedic package from DIR (e.g. `git archive main src | tar -x -C /tmp/base`), alternately with this
tree's, each with a site of its own code: an A/B under the same load. Needs `make mpi-trace`.

    .venv/bin/python bench/trace_cpu.py [--rounds 3] [--base-src /tmp/base/src]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_wan import BIN, ENV, paramedic, traces  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def site_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base-src", type=Path, help="also run the paramedic package in this src directory")
    args = parser.parse_args()
    sides = {"this": str(ROOT / "src")}
    if args.base_src is not None:
        sides = {"base": str(args.base_src.resolve()), **sides}
    rows: list[tuple[str, str, str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="trace-cpu-") as tmp:
        work = Path(tmp)
        files = traces(work, [500], [])  # melt (500 steps) and flow.pois, as in the earlier sections
        paramedic("keys", "--out", str(work / "keys"), "--server", "localhost", "--client", "compute")
        servers: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}
        try:
            for side, src in sides.items():
                root = work / f"site-{side}"
                root.mkdir()
                log_path = work / f"serve-{side}.log"
                with open(log_path, "w") as log:
                    proc = subprocess.Popen(
                        [str(BIN / "paramedic"), "serve", "--root", str(root), "--listen", "127.0.0.1:0",
                         "--keys", str(work / "keys/server")],
                        stderr=log, stdout=subprocess.DEVNULL, env={**ENV, "PYTHONPATH": src},
                    )  # fmt: skip
                port = None
                for _ in range(300):
                    match = re.search(r"listening on [^ ]*:(\d+) ", log_path.read_text())
                    if match:
                        port = int(match.group(1))
                        break
                    time.sleep(0.1)
                if port is None:
                    raise SystemExit(f"paramedic serve ({side}) did not start")
                servers[side] = (proc, port, root)
            for r in range(args.rounds):
                for name, path in files.items():
                    for mode in ("metadata", "compressed"):
                        for side, src in sides.items():
                            proc, port, root = servers[side]
                            out = f"{name}-{mode}-{r}.clog2"
                            before = resource.getrusage(resource.RUSAGE_CHILDREN)
                            site_before = site_seconds(proc.pid)
                            start = time.perf_counter()
                            subprocess.run(
                                [str(BIN / "paramedic"), "ship", str(path), "-out", out, "--site",
                                 f"tls://localhost:{port}", "--keys", str(work / "keys/compute"), "--ship", mode],
                                check=True, capture_output=True, env={**ENV, "PYTHONPATH": src},
                            )  # fmt: skip
                            wall = time.perf_counter() - start
                            after = resource.getrusage(resource.RUSAGE_CHILDREN)
                            time.sleep(0.3)
                            site = site_seconds(proc.pid) - site_before
                            (root / out).unlink()
                            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                            rows.append((name, mode, side, wall, cpu, site))
                            print(f"{name} {mode} {side}: wall {wall:.2f} command CPU {cpu:.2f} site CPU "
                                  f"{site:.2f} (load {os.getloadavg()[0]:.1f})", file=sys.stderr)  # fmt: skip
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait(10)
    print("| trace | --ship | code | wall s | command CPU s | site CPU s |")
    print("|---|---|---|---|---|---|")
    for name in files:
        for mode in ("metadata", "compressed"):
            for side in sides:
                sel = [x for x in rows if x[:3] == (name, mode, side)]
                print(
                    f"| {name} | {mode} | {side} | {statistics.median(x[3] for x in sel):.2f} "
                    f"| {statistics.median(x[4] for x in sel):.2f} | {statistics.median(x[5] for x in sel):.2f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
