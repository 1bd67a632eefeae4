"""bench/startup: how a job's start grows with the database it searches in place (issue 42, "Scale").

Databases of growing size are made by makeblastdb from the mmseqs2 proteins written N times (ids made
unique), in volumes of 1 GB as update_blastdb.pl's are. For each size, side by side:

  blast        one query with blastp -num_threads 2: the baseline
  first job    paramedic search of the same query with an empty digest store (every file digested)
  second job   the same search again (every digest remembered: nothing of the volumes read to start)

and, in this process, what rank 0 does before the first search (`resolve_database`: BLAST+'s -info, each
volume's header, the fragments' cuts, the digests) with its wall time and the bytes it digested. The
goal: a second job reads at most 1% of the volumes' bytes outside BLAST+'s search, and its time to the
first search does not grow with the database.

    .venv/bin/python bench/startup.py --sizes 0.25,1,4 --work /var/tmp/pm-startup
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from paramedic.db import trust
from paramedic.db.locate import _in_place

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
PARAMEDIC = ROOT / ".venv/bin/paramedic"


def make_database(size_gb: float, work: Path) -> Path:
    """A protein database of about `size_gb` GB of residues (its files are larger), made once."""
    db = work / f"db-{size_gb:g}GB" / "p"
    if db.with_suffix(".pal").exists() or db.with_name("p.pin").exists():
        return db
    source = (DATA / "mmseqs2" / "DB.fasta").read_text()
    copies = max(1, round(size_gb * 1e9 / 9.06e6))
    fasta = work / f"in-{size_gb:g}.fasta"
    with open(fasta, "w") as fh:
        for n in range(copies):
            fh.write(source.replace(">", f">c{n}_"))
    db.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["makeblastdb", "-in", str(fasta), "-dbtype", "prot", "-out", "p", "-max_file_sz", "1GB"],
        cwd=db.parent, check=True, capture_output=True,
    )  # fmt: skip
    fasta.unlink()
    return db


def volume_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.iterdir() if p.is_file())


def rank0_start(db: Path, store: Path) -> tuple[float, int]:
    """Seconds of rank 0's start on `db` (in this process) and the bytes it digested."""
    os.environ[trust.STORE_VARIABLE] = str(store)
    digested = 0
    original = trust.file_digest

    def counting(path: Path) -> str:
        nonlocal digested
        digested += path.stat().st_size
        return original(path)

    trust.file_digest = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        _in_place(str(db), db.parent, "prot")
        return time.perf_counter() - start, digested
    finally:
        trust.file_digest = original  # type: ignore[assignment]


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.25,1,4", help="database sizes in GB of residues")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pm-startup"))
    parser.add_argument("--keep", action="store_true", help="keep the databases for another run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    query = args.work / "q.fasta"
    query.write_text(">" + (DATA / "mmseqs2" / "QUERY.fasta").read_text().split(">")[1])
    rows = []
    for size in [float(s) for s in args.sizes.split(",")]:
        db = make_database(size, args.work)
        while time.time() - max(p.stat().st_ctime for p in db.parent.iterdir()) < trust.RACY_SECONDS + 1:
            time.sleep(1)  # files changed less than a minute ago are digested again by design
        store = args.work / f"store-{size:g}"
        shutil.rmtree(store, ignore_errors=True)
        first_rank0, first_bytes = rank0_start(db, store)
        second_rank0, second_bytes = rank0_start(db, store)
        env = {**os.environ, trust.STORE_VARIABLE: str(args.work / f"jobs-{size:g}")}
        shutil.rmtree(env[trust.STORE_VARIABLE], ignore_errors=True)
        search = ["-query", str(query), "-db", str(db), "-evalue", "1e-5", "-outfmt", "6"]
        blast = timed(["blastp", *search, "-num_threads", "2", "-out", os.devnull], env)
        first = timed([str(PARAMEDIC), "search", "blastp", *search, "-out", str(args.work / "o1.tsv")], env)
        second = timed([str(PARAMEDIC), "search", "blastp", *search, "-out", str(args.work / "o2.tsv")], env)
        blast_again = timed(["blastp", *search, "-num_threads", "2", "-out", os.devnull], env)
        row = {
            "size_gb": size,
            "volume_bytes": volume_bytes(db),
            "volumes": len(list(db.parent.glob("*.pin"))),
            "rank0_first_s": round(first_rank0, 3),
            "rank0_first_digested": first_bytes,
            "rank0_second_s": round(second_rank0, 3),
            "rank0_second_digested": second_bytes,
            "blastp_s": round(min(blast, blast_again), 2),
            "first_job_s": round(first, 2),
            "second_job_s": round(second, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not args.keep:
            shutil.rmtree(db.parent)
    (ROOT / "bench" / "startup-results.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
