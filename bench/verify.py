"""What digesting the database in every job costs (issue 23 item 1): `verify_volumes` against a search.

Formats the mmseqs2 proteins (the whole DB.fasta) into 4 fragments, times `verify_volumes` (the digest
rank 0 makes in every job: the whole-database volume and every fragment volume), with the page cache
warm as it is for a search that follows, and times searches of --queries queries with --np 2. Prints one
JSON line: the digest's seconds (median of 5), the search's (median of --runs), their ratio, and the
digest's throughput.

    .venv/bin/python bench/verify.py [--queries 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paramedic.db.manifest import load_manifest, verify_volumes

DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent


def take(source: Path, dest: Path, count: int | None) -> None:
    records = source.read_text().split("\n>")
    chosen = records if count is None else records[:count]
    text = "\n>".join(chosen)
    dest.write_text((text if text.startswith(">") else ">" + text).rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        base = Path(tmp)
        take(DATA / "mmseqs2" / "DB.fasta", base / "db.fasta", None)
        take(DATA / "mmseqs2" / "QUERY.fasta", base / "q.fasta", args.queries)
        subprocess.run(
            [str(BIN / "paramedic"), "format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "4",
             "--out", "db/uni", "--quiet"], cwd=base, check=True,
        )  # fmt: skip
        db = base / "db" / "uni"
        manifest = load_manifest(db)
        size = sum(p.stat().st_size for p in db.iterdir() if p.suffix not in (".pal", ".nal", ".json"))
        digests = []
        for _ in range(5):
            start = time.perf_counter()
            verify_volumes(db, manifest)
            digests.append(time.perf_counter() - start)
        searches = []
        for i in range(args.runs):
            start = time.perf_counter()
            subprocess.run(
                [str(BIN / "paramedic"), "search", "blastp", "-query", "q.fasta", "-db", "db/uni", "-out",
                 f"out{i}.txt", "--np", "2", "--quiet", "--no-journal"], cwd=base, check=True,
            )  # fmt: skip
            searches.append(time.perf_counter() - start)
    digest, search = statistics.median(digests), statistics.median(searches)
    print(
        json.dumps(
            {
                "database_bytes": size,
                "proteins": manifest.nseq,
                "queries": args.queries,
                "digest_seconds": round(digest, 4),
                "digest_mb_s": round(size / digest / 1e6, 1),
                "search_seconds": round(search, 2),
                "digest_share_of_search": round(digest / search, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
