"""bench/startup_model: the numbers behind `paramedic simulate`'s start-up model, measured on this machine.

What a job does before and around its searches on a database in place (paramedic.db.locate.in_place,
paramedic.db.trust, paramedic.db.stage), each measured on its own:

  rank 0, second job   `_in_place` with every digest remembered (BLAST+'s -info, each volume's header,
                       the fragments' cuts, a stamp and a remembered digest per file), on the same
                       sequences in 1 volume and in many: a fixed part and a part per volume
  digest, cold         BLAKE3 (every core, as trust.file_digest) of a large file whose pages were dropped
                       (posix_fadvise DONTNEED): the disk's rate, which bounds a first job's verification
  digest, cached       the same file again, from the page cache
  open + fstat         one file of a volume opened, fstat-ed and closed (what a rank does per file it opens)
  stage copy           the large file copied to another file on this disk, cold, fsynced (a stage copy
                       from a fast shared filesystem: the node's disk rate, not the network's)
  stage digest         SHA-256 of a file from the page cache (db.manifest.volume_sha256: a staged
                       fragment of a `paramedic format` database); a database in place's staged units
                       are checked by BLAKE3 (db.units): the cached BLAKE3 rate above

Writes bench/startup-model.json; the constants in paramedic.engine.predict.startup are these numbers.

    .venv/bin/python bench/startup_model.py --work /var/tmp/pm-cal [--big-gb 2] [--copies 4]
    .venv/bin/python bench/startup_model.py --work /var/tmp/pm-cal --large 100    # 1.53 GB: 1 vs 12 volumes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import blake3

from paramedic.db import trust
from paramedic.db.locate import _IN_PLACE, _in_place

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))


def drop(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (clean pages only: they are fsynced first)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_db(work: Path, name: str, copies: int, max_file: str) -> Path:
    """The mmseqs2 proteins written `copies` times (ids made unique), as makeblastdb -parse_seqids v5."""
    directory = work / name
    if (directory / "p.pdb").exists():
        return directory / "p"
    directory.mkdir(parents=True, exist_ok=True)
    source = (DATA / "mmseqs2" / "DB.fasta").read_text()
    fasta = directory / "in.fasta"
    fasta.write_text("".join(source.replace(">", f">c{n}_") for n in range(copies)))
    subprocess.run(
        ["makeblastdb", "-in", "in.fasta", "-dbtype", "prot", "-out", "p", "-parse_seqids",
         "-blastdb_version", "5", "-max_file_sz", max_file],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    fasta.unlink()
    return directory / "p"


def files_of(db: Path) -> list[Path]:
    return sorted(p for p in db.parent.iterdir() if p.is_file() and not p.name.endswith(".pal"))


def rank0(db: Path, store: Path, fresh: bool) -> float:
    """Seconds of rank 0's start on `db` (this process); `fresh`: with an empty digest store."""
    if fresh:
        shutil.rmtree(store, ignore_errors=True)
    os.environ[trust.STORE_VARIABLE] = str(store)
    _IN_PLACE.clear()
    start = time.perf_counter()
    _in_place(str(db), db.parent, "prot")
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def large(args: argparse.Namespace) -> None:
    """Rank 0's start, first (pages dropped, empty store) and second, on large volumes."""
    dbs = [make_db(args.work, f"large{args.large}-{m}", args.large, m) for m in ("4GB", "80MB")]
    time.sleep(max(0.0, trust.RACY_SECONDS + 1 - (time.time() - dbs[-1].with_suffix(".pdb").stat().st_ctime)))
    for db in dbs * 2:
        store = db.parent.with_name(db.parent.name + "-store")
        drop(files_of(db))
        load = os.getloadavg()[0]
        first = rank0(db, store, fresh=True)
        second = median([rank0(db, store, fresh=False) for _ in range(args.repeat)])
        size = sum(p.stat().st_size for p in files_of(db))
        row = {"volumes": len(list(db.parent.glob("*.pin"))), "bytes": size, "load": round(load, 1)}
        row |= {"first_s": round(first, 3), "second_s": round(second, 4)}
        print(json.dumps(row), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/pm-cal"))
    parser.add_argument("--big-gb", type=float, default=2.0, help="size of the file for the rates")
    parser.add_argument("--copies", type=int, default=4, help="copies of the proteins in the many-volume db")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--large",
        type=int,
        metavar="COPIES",
        help="only rank 0's start on COPIES copies of the proteins in 1 volume and in 80 MB volumes, twice each",
    )
    args = parser.parse_args()
    if args.large:
        large(args)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    one = make_db(args.work, "one", args.copies, "4GB")
    many = make_db(args.work, "many", args.copies, "1MB")
    time.sleep(max(0.0, trust.RACY_SECONDS + 1 - (time.time() - many.with_suffix(".pdb").stat().st_ctime)))
    out: dict[str, object] = {"load_before": os.getloadavg()[0]}

    # rank 0: second job (digests remembered) on 1 and on many volumes of the same sequences
    rows = {}
    for name, db in (("one", one), ("many", many)):
        store = args.work / f"store-{name}"
        drop(files_of(db))
        first = rank0(db, store, fresh=True)
        seconds = [rank0(db, store, fresh=False) for _ in range(args.repeat)]
        rows[name] = {
            "volumes": len(list(db.parent.glob("*.pin"))),
            "files": len(files_of(db)),
            "bytes": sum(p.stat().st_size for p in files_of(db)),
            "first_s": round(first, 4),
            "second_s": round(median(seconds), 4),
        }
    per_volume = (rows["many"]["second_s"] - rows["one"]["second_s"]) / (
        rows["many"]["volumes"] - rows["one"]["volumes"]
    )
    out["rank0"] = rows
    out["rank0_second_fixed_s"] = round(rows["one"]["second_s"] - per_volume, 4)
    out["rank0_second_per_volume_s"] = round(per_volume, 5)

    # a rank opening a volume's files: open, fstat, close
    paths = files_of(many)
    start = time.perf_counter()
    for _ in range(args.repeat * 20):
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.fstat(fd)
            os.close(fd)
    out["open_fstat_per_file_s"] = round((time.perf_counter() - start) / (args.repeat * 20 * len(paths)), 8)

    # the rates, on one large file: BLAKE3 cold and cached, a cold copy, SHA-256 cached
    big = args.work / "big.bin"
    size = int(args.big_gb * 1e9)
    if not big.exists() or big.stat().st_size != size:
        chunk = os.urandom(1 << 24)
        with open(big, "wb") as fh:
            for _ in range(size // len(chunk)):
                fh.write(chunk)
            fh.write(chunk[: size % len(chunk)])
    cold, cached, copy, sha = [], [], [], []
    for _ in range(3):
        drop([big])
        start = time.perf_counter()
        trust.file_digest(big)
        cold.append(size / (time.perf_counter() - start))
        start = time.perf_counter()
        trust.file_digest(big)
        cached.append(size / (time.perf_counter() - start))
        start = time.perf_counter()
        hasher = hashlib.sha256()
        with open(big, "rb", buffering=0) as fh:
            while block := fh.read(1 << 20):
                hasher.update(block)
        sha.append(size / (time.perf_counter() - start))
        drop([big])
        target = args.work / "copy.bin"
        start = time.perf_counter()
        shutil.copyfile(big, target)
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        copy.append(size / (time.perf_counter() - start))
        target.unlink()
    out["blake3_cold_bytes_per_s"] = round(median(cold))
    out["blake3_cached_bytes_per_s"] = round(median(cached))
    out["sha256_cached_bytes_per_s"] = round(median(sha))
    out["copy_cold_bytes_per_s"] = round(median(copy))
    out["blake3_threads"] = blake3.blake3.AUTO
    out["cores"] = len(os.sched_getaffinity(0))
    out["load_after"] = os.getloadavg()[0]
    if not args.keep:
        big.unlink()
    print(json.dumps(out, indent=1))
    (ROOT / "bench" / "startup-model.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
