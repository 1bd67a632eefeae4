"""The engine across three emulated nodes under real Slurm (issue 26; tests/support/cluster.py).

Three nodes, each a network namespace on a private bridge with its own hostname and its own node-local
scratch (a tmpfs only it sees), one slurmd each; slurmctld and munged on a fourth host; the cluster's
shared/ directory is the parallel filesystem the database, the queries and the output live on. The Slurm
example (examples/slurm/search.sbatch) is submitted from the host as a user would, `sbatch -N 3
--ntasks-per-node=2`: 6 ranks, 2 per node, which reach the ranks on other nodes over TCP through the
bridge (their namespaces share no network and no /dev/shm). Each run's output must be one plain BLAST+
run's bytes. `make test-cluster` runs this file (root; `make slurm` installs Slurm and munge).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, blast, paramedic, take_fasta, without_posted_date
from tests.integration.test_slurm import OPTIONS, SCRIPT, TITLE, adapt, error_lines
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODES = 3
PER_NODE = 2
SBATCH_OPTIONS = (
    f"--nodes={NODES}",
    f"--ntasks={NODES * PER_NODE}",
    f"--ntasks-per-node={PER_NODE}",
    "--exclusive",
    "--time=10",
)
EXAMPLE_ENGINE = "--partition-size 128 --replica-group-size 64 --output-strategy worker-merge"
QUERIES = 30
# node3 is smaller than the others: a memory cgroup of 2 GiB holds its slurmd, its job steps and ranks.
NODE3_MEMORY = 2 << 30


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("PARAMEDIC_CLUSTER_TESTS") != "1":
        pytest.skip("the emulated cluster's tests run under `make test-cluster` (PARAMEDIC_CLUSTER_TESTS=1)")
    if os.getuid() != 0:
        pytest.skip("namespaces, a bridge and slurmd need root")
    # A prefix and subnet of the tests' own: a cluster of `make cluster` (pmc) is left alone.
    box = Cluster(
        nodes=NODES,
        prefix="pmt",
        subnet="10.226.27",
        root=Path("/var/tmp/pmt-cluster"),
        others=("site",),
        memory={"node3": NODE3_MEMORY},
    )
    try:
        box.up()
        yield box
    finally:
        box.down()
    assert not box.root.exists()


@pytest.fixture(scope="module", autouse=True)
def shared_stores(cluster: Cluster) -> Iterator[None]:
    """The remembered digests and the metadata key on the shared directory, as a user's home on a cluster
    is: the tests' own stores (tests/conftest.py) lie under the host's /tmp, which each node has its own
    of (a rank on node1 made its /tmp/pytest-of-root/.../digests there, and left it)."""
    saved = {name: os.environ.get(name) for name in ("PARAMEDIC_DIGESTS", "PARAMEDIC_METADATA_KEY")}
    home = cluster.shared / "home"
    home.mkdir(mode=0o700)
    os.environ["PARAMEDIC_DIGESTS"] = str(home / "digests")
    os.environ["PARAMEDIC_METADATA_KEY"] = str(home / "metadata.key")
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def data(cluster: Cluster, data_dir: Path) -> Path:
    """On the shared directory: a paramedic database (3 fragments), a BLAST+ reference of the same
    proteins, 30 queries, and the reference output."""
    root = cluster.shared / "data"
    (root / "ref").mkdir(parents=True)
    take_fasta(data_dir / "mmseqs2" / "DB.fasta", root / "db.fasta", 2000)
    take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", root / "q.fasta", QUERIES)
    blast("makeblastdb", "-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-out", "proteins",
          "-title", TITLE, cwd=root / "ref")  # fmt: skip
    # a BLAST+ database searched in place (makeblastdb's files and a description of 3 fragments)
    paramedic("format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "3", "--out", "p/proteins",
              "--title", TITLE, "--quiet", cwd=root)  # fmt: skip
    blast("blastp", "-query", "../q.fasta", "-db", "proteins", *OPTIONS, "-out", "ref.txt", cwd=root / "ref")
    return root


def expected(data: Path) -> bytes:
    return without_posted_date((data / "ref" / "ref.txt").read_bytes(), "0")


def script_for(data: Path, run: Path, engine: str | None = None, query: Path | None = None) -> Path:
    """The example with the user's two changes, and other engine options when given."""
    path = adapt(data / "p" / "proteins", query or data / "q.fasta", run / "search.sbatch")
    if engine is not None:
        text, n = re.subn(r"^ENGINE=\(.*\)$", f"ENGINE=({engine})", path.read_text(), flags=re.M)
        assert n == 1, "the example's ENGINE line moved"
        path.write_text(text)
    return path


def submit(cluster: Cluster, script: Path, cwd: Path, *options: str) -> str:
    env_path = f"{BIN}:{os.environ.get('PATH', '')}"  # an activated virtual environment
    command = ("env", f"PATH={env_path}", "sbatch", "--parsable", *SBATCH_OPTIONS, *options, str(script))
    proc = cluster.slurm(*command, cwd=cwd)
    return proc.stdout.strip()


def job(cluster: Cluster, job_id: str) -> dict[str, str]:
    line = cluster.slurm("scontrol", "show", "job", "-o", job_id).stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


def wait_job(cluster: Cluster, job_id: str, seconds: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    while (info := job(cluster, job_id))["JobState"] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        if time.monotonic() > deadline:
            cluster.slurm("scancel", job_id, check=False)
            raise AssertionError(
                f"job {job_id} still {info['JobState']} ({info.get('Reason')}) after {seconds} s, nodes "
                f"{cluster.states()}:\n{cluster.log_tail()}"
            )
        time.sleep(0.3)
    return info


def run_job(cluster: Cluster, script: Path, run: Path) -> tuple[dict[str, str], str]:
    info = wait_job(cluster, submit(cluster, script, run))
    log = (run / f"paramedic-{info['JobId']}.log").read_text()
    return info, log


def check_ok(info: dict[str, str], log: str, out: Path, data: Path) -> dict[str, object]:
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert info["NodeList"] == "node[1-3]", info["NodeList"]
    assert not error_lines(log) and "Traceback" not in log, log
    assert without_posted_date(out.read_bytes(), "0") == expected(data), "differs from BLAST+"
    record: dict[str, object] = json.loads(out.with_name(out.name + ".run.json").read_text())
    assert record["ranks"] == NODES * PER_NODE
    return record


def test_example_on_three_nodes(cluster: Cluster, data: Path) -> None:
    """The example as it is (one partition, the workers write with MPI-IO on the shared directory)."""
    assert f"ENGINE=({EXAMPLE_ENGINE})" in SCRIPT.read_text()
    run = cluster.shared / "run-example"
    run.mkdir()
    started = time.monotonic()
    info, log = run_job(cluster, script_for(data, run), run)
    record = check_ok(info, log, run / "hits.txt", data)
    reason = record["strategy_reason"]
    assert isinstance(reason, dict)
    # --strategy auto's memory rule counts each node's own limits: node3's cgroup (2 GiB for its two
    # workers), not rank 0's node (the host's memory for one worker), sets the memory per worker.
    assert reason["workers_on_node_from"] == f"{PER_NODE} ranks of the job on node3", reason
    assert reason["cgroup"].endswith("/pmt-node3") and reason["cgroup_limit_bytes"] == NODE3_MEMORY, reason
    assert reason["memory_per_worker_bytes"] == NODE3_MEMORY // PER_NODE, reason
    assert "shared by 2 workers" in reason["reason"], reason
    # The first job on the database in place: its files digested a share per node (ranks 0, 2 and 4, the
    # first of each node), rank 0 took every digest and read none of them again.
    files = [p for p in (data / "p" / "proteins").glob("proteins.*") if p.suffix != ".pal"]
    first = record["first_digest"]
    assert isinstance(first, dict) and len(files) >= NODES, (first, files)
    assert (first["nodes"], first["files"]) == (NODES, len(files)), first
    assert first["bytes"] == sum(p.stat().st_size for p in files), first
    assert sorted(first["per_rank"]) == ["0", "2", "4"], first
    print(f"3-node job {info['JobId']}: {time.monotonic() - started:.1f} s from sbatch to the end")


@pytest.mark.parametrize("strategy", ["master", "worker-individual", "worker-collective", "worker-merge"])
def test_partitions_span_nodes_with_each_output_strategy(cluster: Cluster, data: Path, strategy: str) -> None:
    """--partition-size 3 on 6 ranks: partitions [1, 2, 3] (node1's rank 1 masters node2's ranks 2 and
    3) and [4, 5]; the output written by each strategy onto the shared directory."""
    run = cluster.shared / f"run-part-{strategy}"
    run.mkdir()
    info, log = run_job(
        cluster, script_for(data, run, f"--partition-size 3 --output-strategy {strategy}"), run
    )
    record = check_ok(info, log, run / "hits.txt", data)
    assert (record["partitions"], record["output_strategy"]) == (2, strategy)


def test_stage_on_each_nodes_own_scratch(cluster: Cluster, data: Path) -> None:
    """--stage on the node-local scratch (the same path on every node, a tmpfs of its own behind it): each
    node copies the volume its ranks search once (the database in place is one volume of 3 fragments: a
    volume is what is staged); the second run copies nothing again; the host sees none of it. The scratch itself is everybody's (mode 1777, as a site's /local/scratch): paramedic refuses it,
    so the cache is a directory of the user's own in it."""
    engine = f"--partition-size 128 --output-strategy worker-merge --strategy fragments --stage {cluster.scratch}/paramedic"
    per_run = []
    for name in ("cold", "warm"):
        run = cluster.shared / f"run-stage-{name}"
        run.mkdir()
        info, log = run_job(cluster, script_for(data, run, engine), run)
        record = check_ok(info, log, run / "hits.txt", data)
        ranks = [r for r in record["ranks_stats"] if r.get("stage")]  # type: ignore[attr-defined]
        nodes: dict[str, dict[str, object]] = {}
        for r in ranks:
            stage = r["stage"]
            node = nodes.setdefault(stage["node"], {"copies": 0, "bytes": 0, "hits": 0, "fragments": set()})
            node["copies"] += stage["copies"]  # type: ignore[operator]
            node["bytes"] += stage["copied_bytes"]  # type: ignore[operator]
            node["hits"] += stage["hits"]  # type: ignore[operator]
            node["fragments"] |= set(r["fragments"])  # type: ignore[operator]
        per_run.append(nodes)
        section: Any = record["stage"]  # the last run's: the warm one's
        print(f"stage {name}: " + ", ".join(
            f"{n}: {v['copies']} copies, {v['bytes']} bytes, {v['hits']} hits" for n, v in sorted(nodes.items())
        ))  # fmt: skip
    cold, warm = per_run
    # node1 holds rank 0 and the partition's master, nodes 2 and 3 the workers: they searched and staged.
    assert cold and set(cold) <= {"node2", "node3"}, cold
    volume = (data / "p" / "proteins" / "proteins.psq").stat().st_size
    for node, figures in cold.items():
        assert figures["copies"] == 1 and figures["fragments"], (node, figures)
        assert volume < figures["bytes"] < 2 * volume, (node, figures, volume)  # type: ignore[operator]
    # The second run copies nothing: each node searches any fragment of the volume it staged in the
    # first, and the run record's per-node figures say so.
    for node, figures in warm.items():
        assert figures["copies"] == figures["bytes"] == 0 and figures["hits"] > 0, (node, figures)
    assert section["per_node"] == {
        node: {"copies": 0, "copied_bytes": 0, "hits": figures["hits"]} for node, figures in warm.items()
    }, section
    # Node-local: each node's scratch holds what it staged, the host's directory of the same name nothing.
    assert list(cluster.scratch.iterdir()) == []
    for node in cold:
        listing = cluster.on_node(node, "find", str(cluster.scratch), "-type", "f")
        assert listing.returncode == 0 and listing.stdout.strip(), (node, listing)


SITE_PORT = 7700
SITE_RATE = "20mbit"


def test_paramedic_to_a_storage_site_on_another_host_over_a_shaped_link(cluster: Cluster, data: Path) -> None:
    """ParaMEDIC from the cluster: the example's ranks on three nodes ship metadata over TLS, through the
    bridge, to `paramedic serve` on another emulated host (`site`, its link limited to 20 Mbit/s each
    way), which regenerates the output there: one BLAST+ run's bytes."""
    keys = cluster.shared / "keys"
    paramedic("keys", "--out", str(keys), "--server", "site", "--client", "compute")
    site_root = cluster.root / "site-root"  # the storage site's own disk
    site_root.mkdir()
    cluster.shape("site", SITE_RATE)
    log = cluster.logs / "serve.out"
    cluster.spawn("site", "serve", [
        str(BIN / "paramedic"), "serve", "--replica", str(data / "p" / "proteins"), "--root", str(site_root),
        "--listen", f"{cluster.address('site')}:{SITE_PORT}", "--keys", str(keys / "server"),
    ])  # fmt: skip
    cluster.wait(lambda: log.exists() and "listening on" in log.read_text(), "paramedic serve listening", 60)
    run = cluster.shared / "run-site"
    run.mkdir()
    engine = f"--strategy fragments --site tls://site:{SITE_PORT} --ship metadata --keys {keys / 'compute'}"
    script = script_for(data, run, engine)
    # With --site, -out names the file under the storage site's root: a relative path (an absolute one is
    # refused, exit 2); the run record stays here, in the directory sbatch was run from.
    text, n = re.subn(r"^OUT=.*$", "OUT=hits.txt", script.read_text(), flags=re.M)
    assert n == 1
    script.write_text(text)
    started = time.monotonic()
    info, out_log = run_job(cluster, script, run)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out_log + log.read_text()
    written = [p for p in site_root.rglob("hits.txt")]
    assert len(written) == 1, sorted(str(p) for p in site_root.rglob("*"))
    assert without_posted_date(written[0].read_bytes(), "0") == expected(data), "differs from BLAST+"
    record = json.loads((run / "hits.txt.run.json").read_text())
    ship = record["ship"]
    figures = (
        "output_bytes",
        "shipped_payload_bytes",
        "wire_bytes",
        "transfer_seconds",
        "g_site_decode_seconds",
    )
    print(f"site over {SITE_RATE}: {time.monotonic() - started:.1f} s from sbatch; " + ", ".join(
        f"{k} {ship[k]}" for k in figures
    ))  # fmt: skip
    assert ship["mode"] == "metadata" and ship["wire_bytes"] < ship["output_bytes"], ship


def finished_work(journal: Path) -> bool:
    """A fragment search or a report piece in the journal (paramedic.engine.rank.journal's layout)."""
    kinds = [journal / "search", journal / "piece"]
    return any(p.is_file() and not p.name.startswith(".") for d in kinds if d.is_dir() for p in d.iterdir())


@pytest.fixture(scope="module")
def lost_queries(data: Path, data_dir: Path) -> Path:
    """300 queries (a job long enough to lose a node in), and BLAST+'s report of them (ref-lost.txt)."""
    queries = take_fasta(data_dir / "mmseqs2" / "QUERY.fasta", data / "q-lost.fasta", 300)
    blast("blastp", "-query", str(queries), "-db", "proteins", *OPTIONS, "-out", "ref-lost.txt",
          cwd=data / "ref")  # fmt: skip
    return queries


def test_node_lost_mid_job_then_the_same_sbatch_resumes(
    cluster: Cluster, data: Path, lost_queries: Path
) -> None:
    """node3 crashes (every process on it killed at once: slurmd, its job step, its ranks, BLAST+) once the
    journal holds finished work. Slurm cancels the job (NODE_FAIL, its own line in the log, no traceback),
    nothing of the job runs on the surviving nodes, and once node3 is back the same sbatch continues from
    the journal on the shared directory and writes one BLAST+ run's bytes."""
    queries = lost_queries
    run = cluster.shared / "run-lost"
    run.mkdir()
    script = script_for(data, run, "--partition-size 128 --output-strategy master", query=queries)
    # --no-requeue: Slurm's default (JobRequeue=1) puts a batch job whose node failed back in the queue,
    # to start again (and resume from the journal) when enough nodes are up; here the job is to fail.
    job_id = submit(cluster, script, run, "--no-requeue")
    journal = run / ".hits.txt.journal"
    deadline = time.monotonic() + 120
    while not finished_work(journal):
        assert job(cluster, job_id)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), "ended too soon"
        assert time.monotonic() < deadline, "no finished work in the journal"
        time.sleep(0.2)
    cluster.crash("node3")
    info = wait_job(cluster, job_id)
    log = (run / f"paramedic-{job_id}.log").read_text()
    print(f"lost node: {info['JobState']} {info['ExitCode']}\n{log}")
    # Slurm sees the node fail (SlurmdTimeout) and cancels the job before MPI notices: NODE_FAIL, and its
    # own line in the log. The ranks it stops (SIGTERM) unwind: rank 0 says once why the job ended and
    # that the journal keeps its work; no error line, no traceback.
    assert info["JobState"] == "NODE_FAIL", log
    assert "CANCELLED AT" in log and "DUE TO NODE FAILURE" in log, log
    said = [line for line in log.splitlines() if line.startswith("paramedic: interrupted:")]
    assert len(said) == 1 and "the batch system stopped the job" in said[0], log
    assert f"finished work is kept in {journal}" in log, log
    assert not error_lines(log) and "Traceback" not in log, log
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [journal.name]
    assert not (run / "hits.txt").exists()
    # Nothing of the job is left on the surviving nodes: only their slurmd runs, their /dev/shm (MPICH's
    # segment) and /tmp (the ranks' and BLAST+ runs' directories) are empty.
    for node in ("node1", "node2"):
        cluster.wait(lambda n=node: len(cluster.pids(n)) == 1, f"{node} without the job's processes", 30)  # type: ignore[misc]
        for directory in ("/dev/shm", "/tmp"):
            left = cluster.left_on_node(node, directory)
            assert left == [], (node, directory, left)

    cluster.restart("node3")
    again = wait_job(cluster, submit(cluster, script, run, "--no-requeue"))
    log = (run / f"paramedic-{again['JobId']}.log").read_text()
    assert (again["JobState"], again["ExitCode"]) == ("COMPLETED", "0:0"), log
    reference = without_posted_date((data / "ref" / "ref-lost.txt").read_bytes(), "0")
    assert without_posted_date((run / "hits.txt").read_bytes(), "0") == reference, "differs from BLAST+"
    record = json.loads((run / "hits.txt.run.json").read_text())
    assert record["resumed"] and (record["resumed"]["searches"] or record["resumed"]["pieces"]), record[
        "resumed"
    ]
    print(f"resumed: {record['resumed']}")
    assert not journal.exists()


def test_node_cut_off_mid_job_its_processes_alive_then_slurm_requeues(
    cluster: Cluster, data: Path, lost_queries: Path
) -> None:
    """node3's network is cut (its processes live on, reaching nobody) once the journal holds finished
    work, under Slurm's default requeue: Slurm declares the node lost and puts the job back in the queue;
    rank 0 says one line and the surviving nodes are left clean. When the network is back, Slurm ends
    what still ran of the job on node3 (its ranks unwind too: its /tmp and /dev/shm are empty), and the
    requeued job starts again (after `cred_expire`), continues from the journal and writes one BLAST+
    run's bytes."""
    run = cluster.shared / "run-cut"
    run.mkdir()
    # 300 queries in 14 batches: node3 still has searches to do when it is cut off
    engine = "--partition-size 128 --output-strategy master --strategy fragments --batch 10"
    script = script_for(data, run, engine, query=lost_queries)
    job_id = submit(cluster, script, run)
    journal = run / ".hits.txt.journal"
    log = run / f"paramedic-{job_id}.log"
    deadline = time.monotonic() + 120
    while not finished_work(journal):
        assert job(cluster, job_id)["JobState"] in ("PENDING", "CONFIGURING", "RUNNING"), "ended too soon"
        assert time.monotonic() < deadline, "no finished work in the journal"
        time.sleep(0.2)
    cluster.cut("node3")
    cut_at = time.monotonic()
    try:
        cluster.wait(lambda: job(cluster, job_id)["Restarts"] == "1", "the job requeued", 90)
        print(f"requeued {time.monotonic() - cut_at:.1f} s after the cut")
        assert job(cluster, job_id)["JobState"] in ("PENDING", "COMPLETING")  # requeued, ending the first
        for node in ("node1", "node2"):
            cluster.wait(lambda n=node: len(cluster.pids(n)) == 1, f"{node} without the job's processes", 30)  # type: ignore[misc]
            for directory in ("/dev/shm", "/tmp"):
                assert cluster.left_on_node(node, directory) == [], (node, directory)
        first = log.read_text()
        print(f"cut node: requeued, {len(cluster.pids('node3'))} processes on node3\n{first}")
        said = [line for line in first.splitlines() if line.startswith("paramedic: interrupted:")]
        assert len(said) == 1 and not error_lines(first) and "Traceback" not in first, first
        assert len(cluster.pids("node3")) > 1, "node3's processes were to live on behind the cut"
    finally:
        cluster.mend("node3")
    mended_at = time.monotonic()
    cluster.wait(lambda: len(cluster.pids("node3")) == 1 or job(cluster, job_id)["JobState"] == "RUNNING",
                 "node3 without the first run's processes", 90)  # fmt: skip
    print(f"node3 clean {time.monotonic() - mended_at:.1f} s after the mend")
    cluster.wait(lambda: cluster.states() == ["idle"] * NODES or job(cluster, job_id)["JobState"] == "RUNNING",
                 "node3 back in service", 120)  # fmt: skip
    print(f"node3 back {time.monotonic() - mended_at:.1f} s after the mend")
    info = wait_job(cluster, job_id)
    print(f"requeued job ended {time.monotonic() - mended_at:.1f} s after the mend")
    text = log.read_text()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), text
    reference = without_posted_date((data / "ref" / "ref-lost.txt").read_bytes(), "0")
    assert without_posted_date((run / "hits.txt").read_bytes(), "0") == reference, "differs from BLAST+"
    record = json.loads((run / "hits.txt.run.json").read_text())
    assert record["resumed"] and record["resumed"]["searches"], record["resumed"]
    assert not journal.exists()
    for node in cluster.node_names:
        for directory in ("/dev/shm", "/tmp"):
            assert cluster.left_on_node(node, directory) == [], (node, directory)
    print(f"requeued run: resumed {record['resumed']}")


def test_up_after_an_owner_killed_outright_then_down_leaves_nothing() -> None:
    """`up` from a process that then goes away (as `make cluster`, or pytest after kill -9) leaves the
    daemons running; the next `up` removes them and starts afresh, and `down` leaves no process,
    namespace, link or directory of the prefix, and the host's routes and other interfaces as they were."""
    if os.environ.get("PARAMEDIC_CLUSTER_TESTS") != "1" or os.getuid() != 0:
        pytest.skip("under `make test-cluster`, as root")
    import subprocess
    import sys

    def host_network() -> tuple[str, str]:
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
        links = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, check=True).stdout
        ours = ("pmk", "pmt", "pmc", "pmb")  # this file's, and any other emulated cluster's
        return (
            "\n".join(r for r in routes.splitlines() if "10.226." not in r),
            "\n".join(line for line in links.splitlines() if not line.startswith(ours)),
        )

    before = host_network()
    command = [sys.executable, "-m", "tests.support.cluster", "--prefix", "pmk", "--subnet", "10.226.29"]
    root = Path("/var/tmp/pmk-cluster")
    for _ in range(2):
        proc = subprocess.run([*command, "up", "--nodes", "2"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    box = Cluster(nodes=2, prefix="pmk", subnet="10.226.29", root=root)
    assert box.states() == ["idle", "idle"]
    names = sorted(
        (p / "comm").read_text().strip()
        for host in ("ctl", "node1", "node2")
        for p in (Path(f"/proc/{pid}") for pid in box.pids(host))
    )
    # One of each (the first up's were removed); slurmscriptd is slurmctld's helper.
    assert names == ["munged", "slurmctld", "slurmd", "slurmd", "slurmscriptd"], names
    proc = subprocess.run([*command, "down"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "pmk-" not in netns and "pmk" not in links and not root.exists()
    leftovers = [
        p.name for p in Path("/proc").iterdir() if p.name.isdigit() and str(root).encode() in _cmdline(p)
    ]
    assert leftovers == [], leftovers
    assert host_network() == before


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
