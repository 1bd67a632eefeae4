"""Shipping MPI traces over an emulated link: metadata against compressed, and what `auto` picks (issue 22).

Traces LAMMPS (melt, at --melt-steps steps, and flow.pois, 2 ranks) with `paramedic trace`, starts a `paramedic serve` with no
replica, and ships each trace with `paramedic ship --ship metadata|compressed|auto` through bench/wan's
SharedLink relay (one bottleneck of the given rate each way, in user space; no added latency: Toxiproxy,
which bench/wan.py uses for the delay, is not needed here) at 100, 10 and 1 Mbit/s. Every file the site
writes is compared with the local trace by SHA-256. Wall time is the whole `paramedic ship` command
(encoding, transfer, the site's regeneration and its check). Appends a section to bench/RESULTS.md
(`--no-append`: print only). Needs `make mpi-trace`.

    .venv/bin/python bench/trace_wan.py [--rates 100,10,1] [--repeat 3] [--precision 1us] [--melt-steps 500,5000]
        [--gromacs-steps 500,5000]

--repeat runs each command N times and keeps the fastest (the machine is shared: the fastest run is the
one least slowed by others). --precision adds a column: the metadata with `--trace-precision` (that site
file is the reduced trace, checked by the site against its own digest, not against the local trace).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from traces import gromacs  # noqa: E402  (bench/traces.py's GROMACS run)
from wan import SharedLink  # noqa: E402  (bench/wan.py's shared-bottleneck relay)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLES = Path("/usr/share/lammps/examples")
ENV = {
    **os.environ,
    "GMX_MAXBACKUP": "-1",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
LISTENING = re.compile(r"listening on [^ ]*:(\d+) ")


def paramedic(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(BIN / "paramedic"), *args], env=ENV, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"paramedic {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def traces(work: Path, melt_steps: list[int], gromacs_steps: list[int]) -> dict[str, Path]:
    """melt at each number of steps (500: "melt", as in every earlier section; others "melt-N"), flow.pois,
    and GROMACS ("gromacs-N": `gmx_mpi mdrun` of SPC/E water, bench/traces.py) at each of `gromacs_steps`."""
    scripts = []
    for steps in melt_steps:
        melt = work / f"in.melt-{steps}"
        melt.write_text((EXAMPLES / "melt/in.melt").read_text().replace("run\t\t250", f"run\t\t{steps}"))
        scripts.append(("melt" if steps == 500 else f"melt-{steps}", melt))
    pois = work / "in.flow.pois"
    pois.write_text((EXAMPLES / "flow/in.flow.pois").read_text())
    out = {}
    for name, script in (*scripts, ("flow.pois", pois)):
        path = work / f"{name}.clog2"
        paramedic(
            "trace",
            "-out",
            str(path),
            "--",
            "mpiexec.openmpi",
            "-n",
            "2",
            "lmp",
            "-log",
            "none",
            "-screen",
            "none",
            "-in",
            str(script),
        )
        out[name] = path
    for steps in gromacs_steps:
        command = gromacs(work, steps, ["mpiexec.openmpi", "-n", "2"])
        if command is None:
            raise SystemExit("bench/trace_wan.py: --gromacs-steps needs GROMACS (make gromacs)")
        path = work / f"gromacs-{steps}.clog2"
        paramedic("trace", "-out", str(path), "--", *command, cwd=work)
        out[f"gromacs-{steps}"] = path
    return out


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a running process, from /proc (the site's share of a ship)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def serve(stack: contextlib.ExitStack, work: Path, keys: Path) -> tuple[Path, int, int]:
    root = work / "site"
    root.mkdir()
    log = open(work / "serve.log", "w")  # noqa: SIM115 (closed by the stack)
    stack.callback(log.close)
    proc = subprocess.Popen(
        [str(BIN / "paramedic"), "serve", "--root", str(root), "--listen", "127.0.0.1:0", "--keys", str(keys / "server")],
        stderr=log, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    stack.callback(proc.wait, 10)
    stack.callback(proc.terminate)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = LISTENING.search((work / "serve.log").read_text())
        if match:
            return root, int(match.group(1)), proc.pid
        time.sleep(0.1)
    raise SystemExit("paramedic serve did not start: " + (work / "serve.log").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,10,1", help="link rates in Mbit/s")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command; the fastest counts")
    parser.add_argument(
        "--precision", default="", help="also ship as metadata with this --trace-precision (e.g. 1us)"
    )
    parser.add_argument(
        "--only", default="", help="ship only these traces (comma-separated: melt, flow.pois, ...)"
    )
    parser.add_argument(
        "--melt-steps",
        default="500",
        help="melt's run lengths, comma-separated (500: 1.3 MB of trace, 2 ranks)",
    )
    parser.add_argument(
        "--gromacs-steps",
        default="",
        help="also GROMACS (make gromacs) at these run lengths, comma-separated",
    )
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trace-wan-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        files = traces(
            work,
            [int(x) for x in args.melt_steps.split(",")],
            [int(x) for x in args.gromacs_steps.split(",") if x],
        )
        paramedic("keys", "--out", str(work / "keys"), "--server", "localhost", "--client", "compute")
        root, port, site_pid = serve(stack, work, work / "keys")
        link = SharedLink(stack)
        relay = link.relay(port)
        for name, path in files.items():
            if args.only and name not in args.only.split(","):
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            for rate in rates:
                link.set_rate(rate)
                row: dict[str, object] = {"trace": name, "bytes": path.stat().st_size, "rate_mbit": rate}
                row["load"] = round(os.getloadavg()[0], 1)
                modes = ["metadata", "compressed", "auto"] + (["lossy"] if args.precision else [])
                for mode in modes:
                    best = float("inf")
                    for attempt in range(args.repeat):
                        out = f"{name}-{rate:g}-{mode}-{attempt}.clog2"
                        record = work / f"{out}.json"
                        flags = ["--ship", mode]
                        if mode == "lossy":
                            flags = ["--ship", "metadata", "--trace-precision", args.precision]
                        start = time.monotonic()
                        cpu_client, cpu_site = children_cpu(), cpu_of(site_pid)
                        paramedic(
                            "ship", str(path), "-out", out, "--site", f"tls://localhost:{relay}",
                            "--keys", str(work / "keys/compute"), *flags, "--record", str(record),
                        )  # fmt: skip
                        seconds = time.monotonic() - start
                        cpu = (round(children_cpu() - cpu_client, 2), round(cpu_of(site_pid) - cpu_site, 2))
                        site_digest = hashlib.sha256((root / out).read_bytes()).hexdigest()
                        (root / out).unlink()
                        if mode != "lossy":
                            assert site_digest == digest, "site file differs"
                        ship = json.loads(record.read_text())["ship"]
                        if seconds < best:
                            best = seconds
                            row[f"{mode}_cpu"] = cpu
                            row[f"{mode}_split"] = (
                                ship["f_encode_seconds"],
                                ship["finish_wait_seconds"],
                                ship["g_site_decode_seconds"],
                            )
                    row[mode] = round(best, 2)
                    row[f"{mode}_payload"] = ship["shipped_payload_bytes"]
                    if mode == "auto":
                        row["auto_mode"] = ship["mode"]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lossy = f" | metadata {args.precision} s | payload" if args.precision else ""
    lossy_rule = "|---|---" if args.precision else ""
    lines = [
        f"## Trace shipping over an emulated link (issue 22, {stamp})",
        "",
        f"`.venv/bin/python bench/trace_wan.py {' '.join(sys.argv[1:])}`: `paramedic ship` of LAMMPS (and GROMACS) traces (2 ranks) to a",
        "`paramedic serve` without replica, through bench/wan's SharedLink relay (rate only, no added delay).",
        "Seconds are the whole command (encode, transfer, the site's regeneration and check), the fastest of",
        f"{args.repeat} run(s); every lossless site file was identical to the local trace. Metadata split: the",
        "record's f (encode; the rebuild check included), the wait for the site after sending, g (site decode).",
        "CPU: seconds of CPU of the `paramedic ship` command / of the site's `paramedic serve` during it, for",
        "the run counted. Load: the 1-minute load average before the row's first command (2 cores).",
        "compressed/metadata: the compressed command's seconds over the metadata's (above 1: metadata faster).",
        "",
        "| trace | CLOG2 bytes | Mbit/s | load | metadata s | CPU | payload | compressed s | CPU | payload "
        "| compressed/metadata | auto picks | auto s | CPU | metadata split f / wait / g" + lossy + " |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---" + lossy_rule + "|",
    ]

    def cpu(pair: object) -> str:
        return " / ".join(str(x) for x in pair)  # type: ignore[attr-defined]

    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['bytes']:,} | {r['rate_mbit']:g} | {r['load']} | {r['metadata']} | {cpu(r['metadata_cpu'])} "
            f"| {r['metadata_payload']:,} | {r['compressed']} | {cpu(r['compressed_cpu'])} | {r['compressed_payload']:,} "
            f"| {float(r['compressed']) / float(r['metadata']):.1f}x "  # type: ignore[arg-type]
            f"| {r['auto_mode']} | {r['auto']} | {cpu(r['auto_cpu'])} | {' / '.join(str(x) for x in r['metadata_split'])} |"  # type: ignore[attr-defined]
            + (f" {r['lossy']} | {r['lossy_payload']:,} |" if args.precision else "")
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_append:
        with open(ROOT / "bench/RESULTS.md", "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
