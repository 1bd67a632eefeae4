"""--strategy auto: the rule (a pure function of sizes) and how the memory per worker is read (a fake
/proc and /sys under tmp_path, laid out as the kernel lays them out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramedic.engine.core.strategy import (
    QUERIES_MEMORY_SHARE,
    WorkerMemory,
    cgroup_limit,
    decide,
    job_memory,
    local_workers,
    worker_memory,
)
from paramedic.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


def physical(per_worker: int | None, workers: int = 2) -> WorkerMemory:
    total = per_worker * workers if per_worker is not None else None
    return WorkerMemory(per_worker, total, workers, "MPI_LOCALNRANKS=3")


def cgroup(per_worker: int) -> WorkerMemory:
    return WorkerMemory(per_worker, 24 * GiB, 2, "MPI_LOCALNRANKS=3", per_worker, "/job/rank1", 1)


def test_share_is_a_half() -> None:
    assert QUERIES_MEMORY_SHARE == 0.5


def test_whole_database_fits_half_a_worker_queries() -> None:
    c = decide("auto", database_bytes=100 * MiB, fragment_bytes=[25 * MiB] * 4, memory=physical(256 * MiB))
    assert c.strategy == "queries"
    assert "fits in 50% of the memory available per worker (256 MiB per worker: physical memory" in c.reason
    assert "shared by 2 workers on this node (MPI_LOCALNRANKS=3)" in c.reason


def test_boundary_exactly_half_is_queries_one_byte_more_is_fragments() -> None:
    memory = physical(256 * MiB)
    assert decide("auto", database_bytes=128 * MiB, fragment_bytes=[MiB], memory=memory).strategy == "queries"
    over = decide("auto", database_bytes=128 * MiB + 1, fragment_bytes=[MiB], memory=memory)
    assert over.strategy == "fragments"


def test_database_four_times_a_worker_fragments_fit() -> None:
    c = decide("auto", database_bytes=1024 * MiB, fragment_bytes=[64 * MiB] * 16, memory=cgroup(256 * MiB))
    assert c.strategy == "fragments"
    assert "the whole database (1,024 MiB) does not fit" in c.reason
    assert "memory cgroup limit 256 MiB (/job/rank1)" in c.reason
    assert "its largest fragment (64 MiB) does" in c.reason
    record = c.record()
    assert record["chosen"] == "fragments" and record["asked"] == "auto"
    assert record["database_bytes"] == 1024 * MiB and record["largest_fragment_bytes"] == 64 * MiB
    assert record["memory_per_worker_bytes"] == 256 * MiB and record["cgroup_limit_bytes"] == 256 * MiB
    assert record["fragments"] == 16


def test_neither_fits_fragments_and_how_many() -> None:
    c = decide(
        "auto", database_bytes=1000 * MiB, fragment_bytes=[500 * MiB, 500 * MiB], memory=physical(256 * MiB)
    )
    assert c.strategy == "fragments"
    assert "nor does its largest fragment (500 MiB)" in c.reason
    assert "at least 8 fragments" in c.reason  # 1000 / 128, rounded up


def test_unknown_memory_fragments() -> None:
    c = decide("auto", database_bytes=MiB, fragment_bytes=[MiB], memory=physical(None))
    assert c.strategy == "fragments" and "could not be read" in c.reason


def test_asked_strategies_are_kept_and_said() -> None:
    big = dict(database_bytes=1024 * MiB, fragment_bytes=[64 * MiB] * 16, memory=physical(256 * MiB))
    assert decide("queries", **big).reason == "--strategy queries was asked"  # type: ignore[arg-type]
    small = dict(database_bytes=MiB, fragment_bytes=[MiB], memory=physical(256 * MiB))
    assert decide("fragments", **small).strategy == "fragments"  # type: ignore[arg-type]


def test_auto_inexact_queries_metadata_fragments_conflicts_refused() -> None:
    sizes = dict(database_bytes=1024 * MiB, fragment_bytes=[64 * MiB] * 16, memory=physical(256 * MiB))
    c = decide("auto", inexact="cannot honour -culling_limit", **sizes)  # type: ignore[arg-type]
    assert c.strategy == "queries" and "cannot honour -culling_limit" in c.reason
    m = decide("auto", needs_metadata=True, database_bytes=MiB, fragment_bytes=[MiB], memory=physical(GiB))
    assert m.strategy == "fragments" and "metadata" in m.reason
    with pytest.raises(UsageError, match="cannot save, use or ship metadata"):
        decide("queries", needs_metadata=True, **sizes)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--strategy fragments"):
        decide("fragments", inexact="cannot honour -culling_limit", **sizes)  # type: ignore[arg-type]


def test_local_workers_from_the_launcher() -> None:
    assert local_workers({"MPI_LOCALNRANKS": "3"}) == (2, "MPI_LOCALNRANKS=3")
    assert local_workers({"OMPI_COMM_WORLD_LOCAL_SIZE": "9"}) == (8, "OMPI_COMM_WORLD_LOCAL_SIZE=9")
    assert local_workers({"SLURM_TASKS_PER_NODE": "4(x2),3"}) == (3, "SLURM_TASKS_PER_NODE=4(x2),3")
    assert local_workers({"MPI_LOCALNRANKS": "1"})[0] == 1  # a single rank does everything itself
    workers, source = local_workers({})
    assert workers >= 1 and source.endswith("cores")


# -- a fake /proc and /sys ----------------------------------------------------------------------------

MOUNTINFO_V1 = (
    "25 0 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
)
MOUNTINFO_V2 = "25 0 254:0 / / rw - ext4 /dev/vda rw\n40 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
CMDLINE = b"python\0-m\0paramedic\0search\0blastp\0"


def fake_root(tmp_path: Path, membership: str, mountinfo: str, memory_gib: int = 24) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(membership)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    (tmp_path / "proc/self/cmdline").write_bytes(CMDLINE)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal:       {memory_gib * 1024 * 1024} kB\nMemFree: 1 kB\n")
    return tmp_path


def process(root: Path, pid: int, cmdline: bytes = CMDLINE, parent: int = 1) -> str:
    (root / "proc" / str(pid)).mkdir(parents=True)
    (root / "proc" / str(pid) / "cmdline").write_bytes(cmdline)
    (root / "proc" / str(pid) / "stat").write_text(f"{pid} (python3 x) S {parent} {pid} {pid} 0 -1\n")
    return str(pid)


def test_v1_job_cgroup_shared_by_its_ranks(tmp_path: Path) -> None:
    """A batch system's job cgroup (limit 3 GiB) with the node's three ranks in task cgroups below it,
    and another program: the limit is shared by the two workers."""
    root = fake_root(tmp_path, "4:memory:/slurm/job_7/step_0/task_0\n1:cpu:/\n", MOUNTINFO_V1)
    base = root / "sys/fs/cgroup/memory"
    job = base / "slurm/job_7"
    (base / "memory.limit_in_bytes").parent.mkdir(parents=True)
    (base / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    for n in range(3):
        task = job / f"step_0/task_{n}"
        task.mkdir(parents=True)
        (task / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        pids = [process(root, 100 + n)] + ([process(root, 200, b"bash\0")] if n == 0 else [])
        (task / "cgroup.procs").write_text("\n".join(pids) + "\n")
    (job / "memory.limit_in_bytes").write_text(f"{3 * GiB}\n")
    (job / "step_0/memory.limit_in_bytes").write_text(f"{4 * GiB}\n")
    assert cgroup_limit(root) == (3 * GiB, job)
    m = worker_memory(root, {"MPI_LOCALNRANKS": "3"})
    assert (m.cgroup_limit, m.cgroup, m.ranks_in_cgroup) == (3 * GiB, "/sys/fs/cgroup/memory/slurm/job_7", 3)
    assert m.per_worker == 3 * GiB // 2  # the master shares it, holding no database
    assert m.physical == 24 * GiB and m.workers_on_node == 2
    assert (
        "memory cgroup limit 3,072 MiB (/sys/fs/cgroup/memory/slurm/job_7) shared by 2 workers"
        in m.describe()
    )


def test_a_ranks_child_that_has_not_execd_is_not_a_rank(tmp_path: Path) -> None:
    """Two ranks in a job cgroup of 2 GiB, one of them forking (its fork server before exec, its digest's
    child): the child has the rank's command line, and is not counted (seen in make test-cluster: 3)."""
    root = fake_root(tmp_path, "0::/job/step\n", MOUNTINFO_V2)
    job = root / "sys/fs/cgroup/job"
    (job / "step").mkdir(parents=True)
    (job / "memory.max").write_text(f"{2 * GiB}\n")
    (job / "step/memory.max").write_text("max\n")
    pids = [process(root, 100, parent=50), process(root, 101, parent=50), process(root, 102, parent=101)]
    (job / "step/cgroup.procs").write_text("\n".join(pids) + "\n")
    m = worker_memory(root, {"MPI_LOCALNRANKS": "2"})
    assert m.ranks_in_cgroup == 2 and m.per_worker == 2 * GiB


def test_v1_a_cgroup_per_rank(tmp_path: Path) -> None:
    """Each rank in a cgroup of its own (bench/memory.py): the limit is this worker's alone."""
    root = fake_root(tmp_path, "4:memory:/bench/rank0\n", MOUNTINFO_V1)
    for n in range(3):
        rank = root / f"sys/fs/cgroup/memory/bench/rank{n}"
        rank.mkdir(parents=True)
        (rank / "memory.limit_in_bytes").write_text(f"{256 * MiB}\n")
        (rank / "cgroup.procs").write_text(process(root, 100 + n) + "\n")
    m = worker_memory(root, {"MPI_LOCALNRANKS": "3"})
    assert m.ranks_in_cgroup == 1 and m.per_worker == 256 * MiB


def test_v2_max_and_a_limit_above(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "0::/user.slice/job/rank\n", MOUNTINFO_V2, memory_gib=8)
    rank = root / "sys/fs/cgroup/user.slice/job/rank"
    rank.mkdir(parents=True)
    (rank / "memory.max").write_text("max\n")
    (rank.parent / "memory.max").write_text(f"{6 * GiB}\n")
    (rank / "cgroup.procs").write_text(process(root, 100) + "\n")
    assert cgroup_limit(root) == (6 * GiB, rank.parent)
    # physical memory shared by 4 workers (2 GiB each) binds before the cgroup's 6 GiB
    m = worker_memory(root, {"MPI_LOCALNRANKS": "5"})
    assert m.per_worker == 2 * GiB and m.cgroup_limit == 6 * GiB
    assert "physical memory 8,192 MiB shared by 4 workers on this node (MPI_LOCALNRANKS=5)" in m.describe()


def test_no_limit_physical_memory(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "4:memory:/\n", MOUNTINFO_V1)
    top = root / "sys/fs/cgroup/memory"
    top.mkdir(parents=True)
    (top / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limit(root) is None
    m = worker_memory(root, {"MPI_LOCALNRANKS": "3"})
    assert m.per_worker == 12 * GiB and m.cgroup is None


def test_cgroup_namespace_mount_shows_own_cgroup(tmp_path: Path) -> None:
    """In a container the mount's root is the process's own cgroup: its limit is read at the mount."""
    mountinfo = "40 25 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = fake_root(tmp_path, "0::/docker/abc\n", mountinfo)
    top = root / "sys/fs/cgroup"
    top.mkdir(parents=True)
    (top / "memory.max").write_text(f"{GiB}\n")
    assert cgroup_limit(root) == (GiB, top)


def test_nothing_readable(tmp_path: Path) -> None:
    assert cgroup_limit(tmp_path) is None
    m = worker_memory(tmp_path, {"MPI_LOCALNRANKS": "3"})
    assert m.per_worker is None and m.describe() == "unknown"


def test_job_memory_takes_the_tightest_node_and_counts_its_own_ranks() -> None:
    """Rank 0's node (the master and one worker, no cgroup) and node3 (two workers in a 3 GiB cgroup):
    node3 decides, its limit shared by its two ranks (no master there)."""
    free = WorkerMemory(12 * GiB, 24 * GiB, 1, "SLURM_NTASKS_PER_NODE=2")
    tight = WorkerMemory(3 * GiB, 24 * GiB, 1, "SLURM_NTASKS_PER_NODE=2", 3 * GiB, "/pmt-node3", 2)
    measured = [("node1", free), ("node1", free), ("node3", tight), ("node3", tight)]
    memory = job_memory(measured)
    assert (memory.per_worker, memory.node, memory.workers_on_node) == (3 * GiB // 2, "node3", 2)
    assert memory.workers_on_node_from == "2 ranks of the job on node3"
    assert "memory cgroup limit 3,072 MiB (/pmt-node3) shared by 2 workers" in memory.describe()
    # Without node3's cgroup: each worker node's physical memory over its workers (node1: 1, node3: 2).
    measured = [("node1", free), ("node1", free), ("node3", free), ("node3", free)]
    assert job_memory(measured).per_worker == 12 * GiB and job_memory(measured).node == "node3"
    assert "on node3 (2 ranks of the job on node3)" in job_memory(measured).describe()
    # One host: rank 0's own figure, as before.
    assert job_memory([("a", free), ("a", tight)]) is free
