"""CPU seconds of the trace codec alone (issue 22): encode (without its rebuild check, as `paramedic ship`
runs it) and decode of CLOG2 files, in-process, with no link, TLS or interpreter start: what a change to
trace.codec or trace.clog2 saves, with less noise than bench/trace_cpu.py's whole commands.

Each file is encoded and decoded `--repeat` times in a fresh interpreter per side (`--base-src DIR`: the
paramedic package in DIR, e.g. `git archive main src | tar -x -C /tmp/base`, alternately with this tree's,
ROUNDS times: an A/B under the same load); prints the best CPU of each round and the medians over rounds, and
checks that both sides' metadata are the same bytes.

    .venv/bin/python bench/trace_codec_cpu.py FILE.clog2 ... [--rounds 5] [--repeat 3] [--base-src DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import hashlib, json, sys, time
from paramedic.trace import codec
data = open(sys.argv[1], "rb").read()
repeat = int(sys.argv[2])
enc, dec = [], []
for _ in range(repeat):
    t = time.process_time()
    made = codec.encode(data, check=False)
    enc.append(time.process_time() - t)
    t = time.process_time()
    back = codec.decode(made.data)
    dec.append(time.process_time() - t)
    if back != data:
        raise SystemExit("the metadata does not rebuild the file")
print(json.dumps({"encode": min(enc), "decode": min(dec), "meta": hashlib.sha256(made.data).hexdigest()}))
"""


def run(src: str, path: Path, repeat: int) -> dict[str, float | str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(repeat)],
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float | str] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base-src", type=Path, help="also run the paramedic package in this src directory")
    args = parser.parse_args()
    sides = {"this": str(ROOT / "src")}
    if args.base_src is not None:
        sides = {"base": str(args.base_src.resolve()), **sides}
    rows: dict[tuple[str, str], list[dict[str, float | str]]] = {}
    for r in range(args.rounds):
        for path in args.files:
            for side, src in sides.items():
                got = run(src, path, args.repeat)
                rows.setdefault((path.name, side), []).append(got)
                print(
                    f"round {r} {path.name} {side}: encode {got['encode']:.3f} decode {got['decode']:.3f} s CPU"
                )
    print("| trace | code | encode CPU s | decode CPU s | metadata sha256 |")
    print("|---|---|---|---|---|")
    for (name, side), got in rows.items():
        enc = statistics.median(float(g["encode"]) for g in got)
        dec = statistics.median(float(g["decode"]) for g in got)
        print(f"| {name} | {side} | {enc:.3f} | {dec:.3f} | {str(got[0]['meta'])[:16]} |")
    for path in args.files:
        metas = {str(g["meta"]) for side in sides for g in rows[(path.name, side)]}
        if len(metas) != 1:
            print(f"{path.name}: the sides' metadata differ")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
