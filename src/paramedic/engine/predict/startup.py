"""A job's start-up on a database in place, in virtual time (`paramedic simulate`): what happens before and
around the searches that a pilot run on a small database cannot show, sized for a database the predictor
need not hold (NCBI's nr, nt: `DATABASES`, or any size given).

What the engine does (paramedic.db.locate.in_place, paramedic.db.trust, paramedic.engine.job.job):
- rank 0 resolves `-db` (BLAST+'s `blastdbcmd -info`), reads each volume's header, cuts the fragments (one
  per volume once there are 4 or more; a few offsets of a volume's table read by binary search), and
  stats each file and recalls its remembered digest: a fixed part and a part per volume
  (`RANK0_FIXED_SECONDS`, `RANK0_PER_VOLUME_SECONDS`), whatever the volumes' bytes;
- a first job (no digest remembered) digests every byte of every file before any worker searches, a
  share per node (paramedic.db.spread: the largest files first to the least loaded node, BLAKE3 on every
  core of each), so the wait is the largest share / `DIGEST_BYTES_PER_SECOND` (the shared filesystem is
  assumed to serve every node at that rate); a later job only stamps;
- each rank opens (and fstats) the files of a volume the first time one of its tasks searches it
  (`OPEN_SECONDS` a file); a report piece searches a mask over the whole database: its rank opens every
  volume it has not opened yet;
- with `--stage`, a volume is copied to its node's disk the first time a rank of that node needs it
  (`COPY_BYTES_PER_SECOND`; the node's other ranks wait for that copy) and its copy digested once in every
  rank that uses it (`STAGE_DIGEST_BYTES_PER_SECOND`); a second job finds the copies (a warm cache) and only
  digests them.

The rates are this machine's (bench/startup_model.py, bench/startup-model.json, 2026-12-02): a virtual
disk, 2 cores. A cluster's shared filesystem may be slower or faster: `--digest-rate` and `--copy-rate`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from paramedic.db.blastdb import DEFAULT_FRAGMENTS
from paramedic.db.spread import assign
from paramedic.errors import UsageError

# -- measured here: bench/startup_model.py (bench/startup-model.json) ------------------------------------
# rank 0's start with every digest remembered: 0.0564 s on 1 volume, 0.0942 s on 37 volumes of the same
# 80,000 proteins (makeblastdb -parse_seqids, version 5): 0.055 s + 1.05 ms a volume
RANK0_FIXED_SECONDS = 0.055
RANK0_PER_VOLUME_SECONDS = 0.00105
# BLAKE3 (trust.file_digest, every core) of a 2 GB file whose pages were dropped: 2.10 GB/s (3.7-5.3 GB/s
# from the page cache); bench/startup.py's first jobs, loaded by a test suite beside them: ~0.7 GB/s
DIGEST_BYTES_PER_SECOND = 2.1e9
OPEN_SECONDS = 5e-6  # open + fstat + close of one file
COPY_BYTES_PER_SECOND = 0.77e9  # the 2 GB file copied cold on this disk and fsynced
# a staged copy's check: BLAKE3 from the page cache, 5.3 GB/s (a database in place's units are checked by
# BLAKE3, paramedic.db.units; a `paramedic format` fragment's by SHA-256, 1.13 GB/s here)
STAGE_DIGEST_BYTES_PER_SECOND = 5.3e9

# letters per byte of a database's files, measured on makeblastdb -parse_seqids -blastdb_version 5 builds
# here: the mmseqs2 proteins (36.2 M residues in 61.1 MB), the ragout bacterial genomes (48.2 M bases in
# 12.1 MB: 2 bits a base, few headers). NCBI's nr and nt carry longer deflines (merged entries) and nt many
# short sequences: their real letters are fewer than these give (`--db-residues` takes the real count,
# `blastdbcmd -info`'s "total residues")
LETTERS_PER_BYTE = {"prot": 0.593, "nucl": 3.98}
FILES_PER_VOLUME = 4  # .pin .psq .phr .pog (.n* for nucleotides)
SHARED_FILES = 5  # version 5: .pdb .pos .pot .ptf .pto, one set for the database


@dataclass(frozen=True)
class DatabaseShape:
    """A database by its size alone: its files' bytes, its volumes, its letters (estimated from the bytes
    unless given)."""

    name: str
    dbtype: str  # "prot" or "nucl" ("": the pilot's program's, until `typed`)
    bytes: int
    volumes: int
    residues: int
    note: str = ""

    @classmethod
    def of(
        cls, name: str, dbtype: str, size: int, volumes: int, residues: int | None = None
    ) -> DatabaseShape:
        if size < 1:
            raise UsageError("--db-bytes must be at least 1 byte")
        if volumes < 1:
            raise UsageError("--db-volumes must be at least 1")
        if residues is not None and residues < volumes:
            raise UsageError("--db-residues must be at least one letter a volume")
        shape = cls(name, dbtype, size, volumes, residues or 0, "letters given" if residues else "")
        return shape.typed(dbtype) if dbtype else shape

    def typed(self, dbtype: str) -> DatabaseShape:
        """The shape as a `dbtype` database (given by the pilot's program when only a size was given):
        its letters estimated from its bytes unless given."""
        if self.residues:
            return replace(self, dbtype=dbtype)
        letters = max(self.volumes, round(self.bytes * LETTERS_PER_BYTE[dbtype]))
        note = f"letters estimated at {LETTERS_PER_BYTE[dbtype]} a byte of its files"
        return replace(self, dbtype=dbtype, residues=letters, note=note)

    @property
    def files(self) -> int:
        return self.volumes * FILES_PER_VOLUME + SHARED_FILES

    def volume_bytes(self, volume: int) -> int:
        return self.bytes // self.volumes + (1 if volume < self.bytes % self.volumes else 0)

    def volume_residues(self) -> tuple[int, ...]:
        base, extra = divmod(self.residues, self.volumes)
        return tuple(base + (1 if v < extra else 0) for v in range(self.volumes))

    def fragments(self) -> int:
        """How many fragments a search in place cuts it into (paramedic.db.blastdb.fragment_ranges: each
        volume its share of DEFAULT_FRAGMENTS by letters, at least one; the volumes are equal here)."""
        return self.volumes * max(1, round(DEFAULT_FRAGMENTS / self.volumes))

    def volumes_of(self, fragment: int, fragments: int) -> range:
        """The volumes fragment `fragment` of `fragments` equal ones covers (in place: its own volume, or
        a range inside one; more fragments than volumes split volumes, fewer cover several)."""
        first = fragment * self.volumes // fragments
        last = max(first, math.ceil((fragment + 1) * self.volumes / fragments) - 1)
        return range(first, min(last, self.volumes - 1) + 1)


# NCBI's preformatted databases (../shared/DESIGN.md "Databases in place", issue 42): sizes of all files
DATABASES: dict[str, tuple[str, int, int, str]] = {
    "nr": ("prot", 364 * 10**9, 176, "364 GB (2023), 176 volumes (2026)"),
    "nt": ("nucl", round(1.07 * 2**40), 383, "1.07 TiB, 345-383 volumes (383 taken)"),
    "core_nt": ("nucl", round(0.28 * 2**40), 91, "0.28 TiB, 91 volumes"),
    "swissprot": ("prot", 350 * 10**6, 1, "0.35 GB, 1 volume"),
}


def profile(name: str, residues: int | None = None) -> DatabaseShape:
    if name not in DATABASES:
        raise UsageError(f"--database-profile {name!r}: choose one of {', '.join(DATABASES)}")
    dbtype, size, volumes, source = DATABASES[name]
    shape = DatabaseShape.of(name, dbtype, size, volumes, residues)
    return replace(shape, note=f"{source}; {shape.note}")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)b?\s*$", re.I)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_bytes(text: str, option: str = "--db-bytes") -> int:
    """'364G' (10^9), '1.07TiB' (2^40), '500MB', '4096' -> bytes; UsageError in one line otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"{option} {text!r}: give a size such as 364G, 1.07TiB or 500M")
    power = _POWERS[match.group(2).lower()]
    unit = (1024 if match.group(3) else 1000) ** power
    value = float(match.group(1)) * unit
    if not math.isfinite(value) or value < 1:
        raise UsageError(f"{option} {text!r}: give a size of at least 1 byte")
    return round(value)


@dataclass(frozen=True)
class StartupRates:
    """The start-up model's parameters (defaults: measured here, see the module's notes)."""

    rank0_fixed: float = RANK0_FIXED_SECONDS
    rank0_per_volume: float = RANK0_PER_VOLUME_SECONDS
    digest_rate: float = DIGEST_BYTES_PER_SECOND
    open_seconds: float = OPEN_SECONDS
    copy_rate: float = COPY_BYTES_PER_SECOND
    stage_digest_rate: float = STAGE_DIGEST_BYTES_PER_SECOND

    def __post_init__(self) -> None:
        for name, value in (("--digest-rate", self.digest_rate), ("--copy-rate", self.copy_rate)):
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{name} must be a positive number of bytes per second")


@dataclass
class Startup:
    """A predicted job's start-up: rank 0's before any search, then each rank's first use of a volume
    (its files opened; with staging, the node's copy and the rank's digest of it)."""

    shape: DatabaseShape
    rates: StartupRates
    first_job: bool  # no digest remembered (and, with staging, an empty node cache)
    stage: bool
    node_ranks: int  # ranks per node (staging: a node copies a volume once)
    fragments: int
    nodes: int = 1  # the job's nodes: a first job's digest is shared among them
    opened: set[tuple[int, int]] = field(default_factory=set)  # (rank, volume): its files opened
    used_copies: set[tuple[int, int]] = field(default_factory=set)  # (rank, volume): its staged copy used
    copied: dict[tuple[int, int], float] = field(default_factory=dict)  # (node, volume): copy done at
    open_seconds: float = 0.0  # every rank's, summed
    copy_seconds: float = 0.0
    copy_bytes: int = 0
    stage_digest_seconds: float = 0.0
    stage_digest_bytes: int = 0
    ranks_started: set[int] = field(default_factory=set)

    @property
    def resolve_seconds(self) -> float:
        """Rank 0: -info, headers, cuts, a stamp and a recall per file (every job)."""
        return self.rates.rank0_fixed + self.rates.rank0_per_volume * self.shape.volumes

    @property
    def verify_bytes(self) -> int:
        return self.shape.bytes if self.first_job else 0

    @property
    def verify_seconds(self) -> float:
        """Every byte digested in a first job, a share per node (the job waits for the largest);
        nothing more in a later one."""
        if not self.verify_bytes:
            return 0.0
        volumes = [(Path(str(v)), self.shape.volume_bytes(v)) for v in range(self.shape.volumes)]
        shares = assign(volumes, range(max(1, self.nodes)))
        sizes = {str(path): size for path, size in volumes}
        largest = max(sum(sizes[name] for name in names) for names in shares.values())
        return largest / self.rates.digest_rate

    @property
    def stamp_seconds(self) -> float:
        """Rank 0: every file stat-ed before the searches and again before the output is final."""
        return 2 * self.shape.files * self.rates.open_seconds

    @property
    def rank0_seconds(self) -> float:
        """Rank 0's start, every worker waiting: before the first search."""
        return self.resolve_seconds + self.verify_seconds + self.stamp_seconds

    def first_use(self, rank: int, volumes: range, start: float, staged: bool = True) -> float:
        """When `rank`, starting a task at `start` that reads `volumes`, can begin searching: its first
        use of each volume opens its files (and the shared ones, once a rank); a fragment search with
        staging (`staged`; report pieces read -db where it lies) waits for the node's copy (made by this
        rank when it is the node's first) and digests it."""
        at = start
        node = rank // self.node_ranks
        for volume in volumes:
            if (rank, volume) not in self.opened:
                self.opened.add((rank, volume))
                files = FILES_PER_VOLUME + (SHARED_FILES if rank not in self.ranks_started else 0)
                self.ranks_started.add(rank)
                seconds = files * self.rates.open_seconds
                self.open_seconds += seconds
                at += seconds
            if not (self.stage and staged) or (rank, volume) in self.used_copies:
                continue
            self.used_copies.add((rank, volume))
            size = self.shape.volume_bytes(volume)
            ready = self.copied.get((node, volume))
            if ready is None and self.first_job:  # this rank copies it; the copy is verified as it comes
                copy = size / self.rates.copy_rate + size / self.rates.stage_digest_rate
                self.copy_seconds += copy
                self.copy_bytes += size
                at += copy
                self.copied[(node, volume)] = at
                continue
            at = max(at, ready or 0.0)  # another rank of the node copies it: wait for it
            digest = size / self.rates.stage_digest_rate  # a process's first use of a copy digests it
            self.stage_digest_seconds += digest
            self.stage_digest_bytes += size
            at += digest
        return at

    def report(self) -> dict[str, object]:
        s = self.shape
        return {
            "database": s.name,
            "dbtype": s.dbtype,
            "bytes": s.bytes,
            "volumes": s.volumes,
            "residues": s.residues,
            "about": s.note,
            "job": "first" if self.first_job else "second",
            "stage": self.stage,
            "rank0_resolve_seconds": round(self.resolve_seconds, 3),
            "verify_nodes": self.nodes if self.first_job else 0,
            "rank0_verify_seconds": round(self.verify_seconds, 3),
            "rank0_verify_bytes": self.verify_bytes,
            "rank0_stamp_seconds": round(self.stamp_seconds, 3),
            "rank0_seconds": round(self.rank0_seconds, 3),
            "opens_seconds": round(self.open_seconds, 3),
            "stage_copy_seconds": round(self.copy_seconds, 3),
            "stage_copy_bytes": self.copy_bytes,
            "stage_digest_seconds": round(self.stage_digest_seconds, 3),
            "stage_digest_bytes": self.stage_digest_bytes,
            "rates": {
                "rank0_fixed_seconds": self.rates.rank0_fixed,
                "rank0_per_volume_seconds": self.rates.rank0_per_volume,
                "digest_bytes_per_second": self.rates.digest_rate,
                "open_seconds_per_file": self.rates.open_seconds,
                "copy_bytes_per_second": self.rates.copy_rate,
                "stage_digest_bytes_per_second": self.rates.stage_digest_rate,
            },
        }
