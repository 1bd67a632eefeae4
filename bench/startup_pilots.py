"""bench/startup_pilots: the pilot runs behind the nr and nt predictions (`paramedic simulate
--database-profile nr|nt`, bench/RESULTS.md "64 nodes against nr and nt").

  blastp  every 5th mmseqs2 query (100, mean length ~430) against the 20,000 mmseqs2 proteins
  blastn  20 pieces of 1-3 kb of the ragout genomes (bench/bigdb.py's queries) against those genomes cut
          in 1,500-base pieces (one copy, ~48 Mbp)

both made by makeblastdb -parse_seqids and searched in place: `paramedic search ... --np 2 --strategy
fragments -outfmt 0 -evalue 1e-5`. Their run records (WORK/<program>/hits.txt.run.json) hold each task's
BLAST+ seconds with its residues: the search rate per core the predictions take.

    PARAMEDIC_DATA=~/.cache/paramedic/data .venv/bin/python bench/startup_pilots.py --work /var/tmp/pm-pilots

Then `--predict` (no search): a 64-node job (`--nodes 64 --node-ranks 32`: 2,048 ranks, 2,047 workers) of
`--queries` queries against nr (the blastp pilot) and nt (the blastn pilot), first and second job, in place
and staged, and a first job at a slower digest rate; prints a Markdown table of where the time goes, and
each `paramedic simulate` command.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bigdb import genomes, nucleotide_queries  # noqa: E402

PARAMEDIC = str(HERE.parent / ".venv" / "bin" / "paramedic")
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))


def protein(work: Path) -> tuple[str, Path, Path]:
    (work / "db.fasta").write_text((DATA / "mmseqs2" / "DB.fasta").read_text())
    records = (DATA / "mmseqs2" / "QUERY.fasta").read_text().split(">")[1:]
    (work / "q.fasta").write_text("".join(">" + r for r in records[::5]))
    return "prot", work / "db.fasta", work / "q.fasta"


def nucleotide(work: Path) -> tuple[str, Path, Path]:
    with open(work / "db.fasta", "w") as fh:
        for index, (_, seq) in enumerate(genomes()):
            seq = seq.upper()
            for at in range(0, len(seq) - 750, 1500):
                fh.write(f">g{index}_{at + 1}\n{seq[at : at + 1500]}\n")
    nucleotide_queries(20, work / "q.fasta")
    return "nucl", work / "db.fasta", work / "q.fasta"


CASES = [
    ("first job, the pilot's wall rates", ["--core-speed", "1"]),
    ("first job", []),
    ("second job", ["--second-job"]),
    ("first job, digest at 0.7 GB/s", ["--digest-rate", "0.7G"]),
    ("first job, --stage", ["--stage"]),
    ("second job, --stage", ["--stage", "--second-job"]),
]
SHOWN = [
    ("rank 0 start", ["start: rank 0 resolves -db, stamps"]),
    ("verification", ["start: verification"]),
    ("opens + staging", ["start: volume opens", "start: staging"]),
    ("search", ["search"]),
    ("report pieces", ["report pieces"]),
    ("merge + messages", ["merge", "messages"]),
    ("output", ["output"]),
    ("fixed", ["fixed (pilot's start, commit, stop)"]),
    ("idle", ["idle"]),
]


def predict(args: argparse.Namespace) -> None:
    from paramedic.engine.predict.costs import CostModel
    from paramedic.report.record import RunRecord

    records = {"blastp": args.work / "blastp" / "hits.txt.run.json"}
    records["blastn"] = args.work / "blastn" / "hits.txt.run.json"
    records.update(dict(r.split("=", 1) for r in args.records.split(",") if r))  # type: ignore[misc]
    speeds = {k: v for k, v in (s.split("=", 1) for s in args.core_speed.split(",") if s)}
    for program, path in records.items():
        record = RunRecord.load(Path(path))
        rates = sorted(CostModel.from_record(record).search_rates)
        speed = float(speeds.get(program, 1))
        print(
            f"- {program} pilot ({path}): {record.queries} queries, wall {record.wall_seconds:.1f} s, search "
            f"rate {rates[len(rates) // 2]:.3g} s per query letter per database letter (median of "
            f"{len(rates)} tasks; {rates[len(rates) // 2] / speed:.3g} with --core-speed {speed:g})"
        )
    workers = args.nodes * args.node_ranks - 1
    head = "| database | queries | job | wall s | efficiency | core-s a query | rank 0 before the first search s |"
    print(head + "".join(f" {name} |" for name, _ in SHOWN))
    print("|---" * (7 + len(SHOWN)) + "|")
    for (database, program), queries, (name, extra) in itertools.product(
        (("nr", "blastp"), ("nt", "blastn")), args.queries.split(","), CASES
    ):
        argv = [PARAMEDIC, "simulate", "--record", str(records[program]), "--queries", queries]
        argv += ["--core-speed", speeds.get(program, "1")]
        argv += ["--workers", str(workers), "--node-ranks", str(args.node_ranks)]
        argv += ["--database-profile", database, *extra]
        print("<!-- " + " ".join(argv[1:]) + " -->", file=sys.stderr)
        out = json.loads(subprocess.run([*argv, "--json"], check=True, capture_output=True).stdout)
        where = out["where"]
        row = f"| {database} | {int(queries):,} | {name} | {out['wall_seconds']:,.0f} |"
        row += f" {100 * out['efficiency']:.1f}% | {out['work_seconds'] / int(queries):,.0f} |"
        row += f" {out['startup']['rank0_seconds']:,.1f} |"
        for _, keys in SHOWN:
            share = sum(where[k]["share"] for k in keys)
            row += f" {100 * share:.1f}% |"
        print(row, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pm-pilots"))
    parser.add_argument("--programs", default="blastp,blastn")
    parser.add_argument("--predict", action="store_true", help="predict from the pilots' records")
    parser.add_argument("--queries", default="100,1000", help="query counts, comma-separated")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--records", default="", help="blastp=PATH,blastn=PATH: other pilots' records")
    parser.add_argument(
        "--core-speed", default="", help="blastp=X,blastn=Y: simulate --core-speed of each pilot"
    )
    parser.add_argument("--node-ranks", type=int, default=32)
    args = parser.parse_args()
    if args.predict:
        predict(args)
        return 0
    for program in args.programs.split(","):
        work = args.work / program
        work.mkdir(parents=True, exist_ok=True)
        dbtype, fasta, queries = (protein if program == "blastp" else nucleotide)(work)
        subprocess.run(
            ["makeblastdb", "-in", str(fasta), "-dbtype", dbtype, "-out", "db", "-parse_seqids"],
            cwd=work, check=True, capture_output=True,
        )  # fmt: skip
        fasta.unlink()
        argv = [PARAMEDIC, "search", program, "-query", str(queries), "-db", "db", "-out", "hits.txt"]
        argv += ["-outfmt", "0", "-evalue", "1e-5", "--np", "2", "--strategy", "fragments", "--quiet"]
        start = time.perf_counter()
        subprocess.run(argv, cwd=work, check=True)
        print(
            f"{program}: {time.perf_counter() - start:.1f} s, load {os.getloadavg()[0]:.1f}, "
            f"record {work / 'hits.txt.run.json'}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
