"""Sizes of MPI traces: raw CLOG2, ParaMEDIC's trace metadata, zstd -19 and xz -9 of the same file.

Traces real MPI programs with `paramedic trace` (Debian's LAMMPS under Open MPI, on lammps-examples inputs;
Debian's GROMACS, `gmx_mpi mdrun` of a box of SPC/E water, the paper's Figure 5 program, when installed:
`make gromacs`; examples/trace/random_comm.c as the aperiodic one), then encodes each file with the trace codec and checks
it regenerates byte for byte. Also the tracer's overhead: the program's wall time untraced and traced
(best of --repeat), and the merge's and the codec's times. Appends a section to bench/RESULTS.md
(`--no-append`: print only). Needs `make mpi-trace`.

    .venv/bin/python bench/traces.py [--ranks 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import zstandard

from paramedic.trace import clog2, codec

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLES = Path("/usr/share/lammps/examples")
ENV = {
    **os.environ,
    "GMX_MAXBACKUP": "-1",  # GROMACS overwrites its outputs instead of keeping numbered backups
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


GROMACS_MDP = """integrator = md
dt = 0.002
nsteps = {steps}
cutoff-scheme = Verlet
nstlist = 10
rlist = 0.9
coulombtype = PME
rcoulomb = 0.9
rvdw = 0.9
tcoupl = v-rescale
tc-grps = System
tau-t = 0.1
ref-t = 300
constraints = h-bonds
nstenergy = 100
nstlog = 100
gen-vel = yes
gen-temp = 300
gen-seed = 11
"""


def gromacs(work: Path, steps: int, launcher: list[str]) -> list[str] | None:
    """The command of a GROMACS run (`gmx_mpi mdrun`, Debian's gromacs package, Open MPI) of `steps` MD steps
    on 510 SPC/E water molecules (a 2.5 nm box, PME): its input made with `gmx solvate` and `gmx grompp`
    from GROMACS's own files in `work`; None when GROMACS is not installed."""
    if not (shutil.which("gmx_mpi") and shutil.which("gmx")):
        return None

    def gmx(*args: str) -> None:
        subprocess.run(
            ["gmx", *args], check=True, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    gmx("solvate", "-cs", "spc216.gro", "-box", "2.5", "2.5", "2.5", "-o", "water.gro")
    (work / "topol.top").write_text(
        '#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spce.itp"\n\n'
        "[ system ]\nwater\n\n[ molecules ]\nSOL 510\n"
    )
    (work / f"md-{steps}.mdp").write_text(GROMACS_MDP.format(steps=steps))
    tpr = work / f"water-{steps}.tpr"
    gmx("grompp", "-f", f"md-{steps}.mdp", "-c", "water.gro", "-p", "topol.top", "-o", tpr.name)
    return [
        *launcher,
        "gmx_mpi",
        "mdrun",
        "-s",
        str(tpr),
        "-ntomp",
        "1",
        "-nb",
        "cpu",
        "-deffnm",
        f"md-{steps}",
        "-quiet",
    ]


def cases(work: Path, ranks: int) -> list[tuple[str, list[str]]]:
    """(name, mpiexec command) for the programs traced."""
    lmp = ["lmp", "-log", "none", "-screen", "none", "-in"]
    melt = work / "in.melt"
    melt.write_text((EXAMPLES / "melt/in.melt").read_text().replace("run\t\t250", "run\t\t500"))
    pois = work / "in.flow.pois"
    pois.write_text((EXAMPLES / "flow/in.flow.pois").read_text())
    program = work / "random_comm"
    subprocess.run(
        ["mpicc.openmpi", "-O2", "-o", str(program), str(ROOT / "examples/trace/random_comm.c")], check=True
    )
    mpiexec = ["mpiexec.openmpi", "-n", str(ranks)]
    out = [
        ("LAMMPS melt (3d LJ, 500 steps)", [*mpiexec, *lmp, str(melt)]),
        ("LAMMPS flow.pois (2d Poiseuille flow)", [*mpiexec, *lmp, str(pois)]),
    ]
    water = gromacs(work, 500, mpiexec)
    if water is None:
        print("bench/traces.py: GROMACS not installed (make gromacs): no GROMACS row", file=sys.stderr)
    else:
        out.append(("GROMACS mdrun (SPC/E water, 500 steps)", water))
    return [*out, ("random_comm 3000 steps (aperiodic)", [*mpiexec, str(program), "3000", "7"])]


def otf2_size(data: bytes, directory: Path) -> int | None:
    """Bytes of the same events written as OTF2 with the `otf2` wheel (extra `bench`), the outside reference:
    states as Enter/Leave of a region per state, messages as MpiSend/MpiRecv, collectives as
    MpiCollectiveEnd; None without the wheel."""
    try:
        import otf2
        from otf2.enums import CollectiveOp, GroupFlag, GroupType, Paradigm
    except ImportError:
        return None
    rec = clog2.read(data).records
    ranks = sorted(set(rec.head[:, 1].tolist()))
    path = directory / "otf2"
    shutil.rmtree(path, ignore_errors=True)
    ns = (rec.seconds() * 1e9).round().astype("int64")
    ns -= ns.min()
    with otf2.writer.open(str(path), timer_resolution=1_000_000_000) as trace:
        node = trace.definitions.system_tree_node("node")
        writers = {
            k: trace.event_writer(
                f"rank {k}", group=trace.definitions.location_group(f"rank {k}", system_tree_parent=node)
            )
            for k in ranks
        }
        locations = [writers[k]._location for k in ranks]
        trace.definitions.group(
            "world",
            group_type=GroupType.COMM_LOCATIONS,
            paradigm=Paradigm.MPI,
            group_flags=GroupFlag.NONE,
            members=locations,
        )
        group = trace.definitions.group(
            "world ranks",
            group_type=GroupType.COMM_GROUP,
            paradigm=Paradigm.MPI,
            group_flags=GroupFlag.NONE,
            members=list(range(len(ranks))),
        )
        comm = trace.definitions.comm("MPI_COMM_WORLD", group=group, parent=None)
        regions: dict[int, object] = {}
        for rank, rectype, body, t in zip(
            rec.head[:, 1].tolist(),
            rec.head[:, 3].tolist(),
            rec.body[:, :5].tolist(),
            ns.tolist(),
            strict=True,
        ):
            w = writers[rank]
            if rectype == 5:
                state = body[0] // 2
                if state not in regions:
                    regions[state] = trace.definitions.region(f"state {state}")
                (w.enter if body[0] % 2 == 0 else w.leave)(t, regions[state])
            elif rectype == 7:
                (w.mpi_send if body[0] == -101 else w.mpi_recv)(t, body[2], comm, body[3], body[4])
            elif rectype == 8:
                w.mpi_collective_end(t, CollectiveOp.ALLREDUCE, comm, body[1], body[2], body[2])
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def best_time(command: list[str], repeat: int, cwd: Path) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.monotonic()
        subprocess.run(command, check=True, env=ENV, cwd=cwd, stdout=subprocess.DEVNULL)
        best = min(best, time.monotonic() - start)
    return best


def measure(name: str, command: list[str], work: Path, repeat: int) -> dict[str, object]:
    untraced = best_time(command, repeat, work)
    out = work / "trace.clog2"
    traced = float("inf")
    total = float("inf")
    summary: dict[str, object] = {}
    for _ in range(repeat):
        start = time.monotonic()
        record = work / "trace.json"
        subprocess.run(
            [str(BIN / "paramedic"), "trace", "-out", str(out), "--record", str(record), "--", *command],
            check=True,
            env=ENV,
            cwd=work,
            capture_output=True,
            text=True,
        )
        total = min(total, time.monotonic() - start)
        summary = json.loads(record.read_text())["trace"]  # the closing line is for people: the record
        traced = min(traced, float(summary["seconds"]))  # type: ignore[arg-type]
    data = out.read_bytes()
    events = len(clog2.read(data).records)
    start = time.monotonic()
    encoded = codec.encode(data)
    encode_s = time.monotonic() - start
    start = time.monotonic()
    assert codec.decode(encoded.data) == data, "the metadata does not regenerate the file"
    decode_s = time.monotonic() - start
    zstd = len(zstandard.ZstdCompressor(level=19).compress(data))
    xz = len(lzma.compress(data, preset=9))
    otf2 = otf2_size(data, work)
    return {
        "name": name,
        "command": " ".join(command),
        "events": events,
        "raw": len(data),
        "metadata": len(encoded.data),
        "zstd19": zstd,
        "xz9": xz,
        "otf2": otf2,
        "mode": encoded.mode,
        "reason": encoded.reason,
        "periods": encoded.periods,
        "untraced_s": round(untraced, 3),
        "traced_s": round(traced, 3),
        "trace_total_s": round(total, 3),
        "encode_s": round(encode_s, 2),
        "decode_s": round(decode_s, 2),
    }


def table(rows: list[dict[str, object]], ranks: int, argv: list[str]) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## Trace sizes (issue 22): CLOG2 vs trace metadata vs zstd -19 / xz -9, {ranks} ranks ({stamp})",
        "",
        f"`.venv/bin/python bench/traces.py {' '.join(argv)}` (Open MPI 4.1, Debian's LAMMPS and GROMACS; times best of runs, 2 shared cores; "
        f"load average {os.getloadavg()[0]:.1f} at the end).",
        "Bytes per event (CLOG2 records, ENDBLOCK/ENDLOG excluded); raw/meta is raw CLOG2 / metadata, xz/meta is xz -9 / metadata.",
        "OTF2: the same events written with the `otf2` wheel (extra `bench`; states as Enter/Leave, messages as MpiSend/MpiRecv).",
        "",
        "| program | events | raw B/ev | metadata B/ev | zstd -19 B/ev | xz -9 B/ev | OTF2 B/ev | raw/meta | xz/meta | codec | periods | untraced s | traced s | encode s | decode s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ev = int(r["events"])  # type: ignore[call-overload]
        per = {k: int(r[k]) / ev for k in ("raw", "metadata", "zstd19", "xz9")}  # type: ignore[call-overload]
        otf2 = f"{int(r['otf2']) / ev:.2f}" if r["otf2"] is not None else "-"  # type: ignore[call-overload]
        periods = ", ".join(f"{v}" for v in r["periods"].values()) if r["periods"] else "-"  # type: ignore[attr-defined]
        lines.append(
            f"| {r['name']} | {ev:,} | {per['raw']:.1f} | {per['metadata']:.2f} | {per['zstd19']:.2f} | {per['xz9']:.2f} | {otf2} "
            f"| {per['raw'] / per['metadata']:.1f}x | {per['xz9'] / per['metadata']:.1f}x | {r['mode']} | {periods} "
            f"| {r['untraced_s']} | {r['traced_s']} | {r['encode_s']} | {r['decode_s']} |"
        )
    lines += ["", "Commands traced:", ""] + [f"- {r['name']}: `{r['command']}`" for r in rows] + [""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if not (shutil.which("lmp") and shutil.which("mpiexec.openmpi")):
        print("bench/traces.py: needs LAMMPS and Open MPI (make mpi-trace)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="traces-") as tmp:
        work = Path(tmp)
        for name, command in cases(work, args.ranks):
            rows.append(measure(name, command, work, args.repeat))
            print(json.dumps(rows[-1]), file=sys.stderr)
    text = table(rows, args.ranks, sys.argv[1:])
    print(text)
    if not args.no_append:
        with open(ROOT / "bench/RESULTS.md", "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
