"""The first job's digest of a database in place, spread over the job's nodes (issue 42, item 4).

A database's files are digested once per user and then remembered (paramedic.db.trust). The first job
pays for it: nt (1.07 TiB) at ~1.5 GB/s is 12 minutes on one node while every rank waits. Rank 0 lists
the files whose stamps it does not know (`paramedic.db.locate.files_to_digest`), one rank per node
digests a share balanced by bytes (each node reads from the shared filesystem at its own rate, BLAKE3
on all its cores), and rank 0 takes each digest for the file as rank 0 sees it, only when the stamps
agree (inode, size, mtime_ns, ctime_ns: a file changed in between is digested again by rank 0). A share
that fails (an unreadable file) is digested by rank 0 again, which says why in one line. The MPI
exchange is the runtime's (paramedic.engine.runtime.on_ranks); this module only decides and digests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paramedic.db.trust import DigestStore, file_digest, hand


@dataclass(frozen=True)
class Digested:
    """One file's digest as the rank that computed it saw the file, or why it could not."""

    path: str
    digest: str = ""  # "" when `failure`
    started_ns: int = 0
    stamp: tuple[int, int, int, int] = (0, 0, 0, 0)  # inode, size, mtime_ns, ctime_ns before and after
    failure: str = ""


def leaders(hosts: Sequence[str]) -> list[int]:
    """The lowest rank on each host, in rank order: the rank that digests its node's share."""
    seen: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        seen.setdefault(host, rank)
    return sorted(seen.values())


def assign(files: Sequence[tuple[Path, int]], ranks: Sequence[int]) -> dict[int, list[str]]:
    """`files` (path, bytes) over `ranks`, the largest first to the least loaded (so the job waits for
    about the largest share, not the sum)."""
    load = {rank: 0 for rank in ranks}
    shares: dict[int, list[str]] = {rank: [] for rank in ranks}
    for path, size in sorted(files, key=lambda f: (-f[1], str(f[0]))):
        rank = min(load, key=lambda r: (load[r], r))
        shares[rank].append(str(path))
        load[rank] += size
    return {rank: paths for rank, paths in shares.items() if paths}


def digest_share(paths: Sequence[str]) -> list[Digested]:
    """This rank's share: each file's digest, refused for a file that changed while it was read."""
    out = []
    for name in paths:
        path = Path(name)
        try:
            before = path.stat()
            started = time.time_ns()
            digest = file_digest(path)
            after = path.stat()
        except OSError as exc:
            out.append(Digested(name, failure=exc.strerror or str(exc)))
            continue
        if _stamp(before) != _stamp(after):
            out.append(Digested(name, failure="changed while it was digested"))
            continue
        out.append(Digested(name, digest, started, _stamp(before)))
    return out


def accept(results: Sequence[Digested], store: DigestStore | None = None) -> tuple[int, int]:
    """Take the other ranks' digests for the files as this rank sees them: (files taken, their bytes).
    A file whose stamp here differs, or that failed there, is left to be digested here."""
    taken = size = 0
    for result in results:
        if result.failure:
            continue
        path = Path(result.path)
        try:
            info = path.stat()
        except OSError:
            continue
        if _stamp(info) == result.stamp:
            hand(path, info, result.digest, result.started_ns, store)
            taken += 1
            size += info.st_size
    return taken, size


def _stamp(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
