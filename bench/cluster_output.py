"""The output strategies' write times on the emulated cluster with the shared output directory behind a
shaped link (issue 26; tests/support/cluster.py).

A fourth emulated host, `nas`, serves a directory over SFTP (a private sshd); every node mounts it with
sshfs at the same path (inside the node's own mount and network namespaces, so its traffic crosses the
bridge), and `nas`'s link is limited with tc tbf (Cluster.shape; this kernel has no netem, so no delay).
The database and the queries stay on the unshaped shared directory; the job is submitted from a directory
on the mount, as a user whose home is on the cluster's network filesystem would: the output, its run
record, its journal and the job's log all cross the link. Each output is compared with one BLAST+ run.
Root; `make bench-cluster-output` installs openssh-server and sshfs. Prints a Markdown table.

    .venv/bin/python -m bench.cluster_output [--rates unshaped,100mbit,10mbit] [--queries 300]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import blast, paramedic, take_fasta, without_posted_date
from tests.integration.test_slurm import OPTIONS, TITLE, adapt
from tests.support.cluster import Cluster

BIN = Path(sys.executable).parent
DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
STRATEGIES = ("master", "worker-individual", "worker-collective", "worker-merge")
SSH_OPTIONS = "StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR"
# sshfs caches names and attributes (20 s by default): rank 0 then sees a file the workers wrote through
# their own mounts as empty (worker-individual: "the file holds 0 bytes"; measured with --cache default).
# NFS revalidates them on open (close-to-open); these options are the nearest sshfs has.
COHERENT = "attr_timeout=0,entry_timeout=0,negative_timeout=0,dir_cache=no"


def start_nas(cluster: Cluster, export: Path) -> Path:
    """sshd on `nas` (its own host key, one client key); returns the client key."""
    ssh = cluster.root / "ssh"
    ssh.mkdir()
    for key in ("host_ed25519", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / key)], check=True)
    shutil.copyfile(ssh / "id_ed25519.pub", ssh / "authorized_keys")
    (ssh / "sshd_config").write_text(
        f"Port 22\nListenAddress {cluster.address('nas')}\nHostKey {ssh / 'host_ed25519'}\n"
        f"PidFile {ssh / 'sshd.pid'}\nAuthorizedKeysFile {ssh / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    cluster.spawn("nas", "sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(ssh / "sshd_config")])
    export.mkdir()
    return ssh / "id_ed25519"


def mount_everywhere(cluster: Cluster, key: Path, export: Path, mount: Path, cache: str) -> None:
    """sshfs of nas:export at `mount` on every node (in its namespaces: its slurmd's jobs see it)."""
    mount.mkdir()
    for node in cluster.node_names:
        pid = cluster.daemon_pid(node)
        log = open(cluster.logs / f"sshfs-{node}.out", "ab")  # noqa: SIM115 (the daemon keeps it)
        subprocess.Popen(
            ["nsenter", "-t", str(pid), "-n", "-u", "-m", "sshfs", "-f", "-o",
             f"IdentityFile={key},{SSH_OPTIONS}" + ("" if cache == "default" else f",{COHERENT}"),
             f"root@nas:{export}", str(mount)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        cluster.wait(
            lambda n=node: cluster.on_node(n, "mountpoint", "-q", str(mount)).returncode == 0,  # type: ignore[misc]
            f"sshfs on {node}",
            30,
        )


def prepare_data(cluster: Cluster, queries: int) -> Path:
    root = cluster.shared / "data"
    (root / "ref").mkdir(parents=True)
    take_fasta(DATA / "mmseqs2" / "DB.fasta", root / "db.fasta", 2000)
    take_fasta(DATA / "mmseqs2" / "QUERY.fasta", root / "q.fasta", queries)
    blast("makeblastdb", "-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-out", "proteins",
          "-title", TITLE, cwd=root / "ref")  # fmt: skip
    paramedic("format", "--in", "db.fasta", "--dbtype", "prot", "--fragments", "3", "--out", "p/proteins",
              "--title", TITLE, "--quiet", cwd=root)  # fmt: skip
    blast("blastp", "-query", "../q.fasta", "-db", "proteins", *OPTIONS, "-out", "ref.txt", cwd=root / "ref")
    return root


def one_job(cluster: Cluster, data: Path, strategy: str, name: str, export: Path, mount: Path) -> dict:
    """The example from a directory on the mount; seconds from sbatch to the end, the record's writes."""
    (export / name).mkdir()
    (mount / name).mkdir()  # the host's side of the path (sbatch's working directory): empty
    script = adapt(data / "p" / "proteins", data / "q.fasta", cluster.shared / f"{name}.sbatch")
    text = re.sub(r"^ENGINE=\(.*\)$", f"ENGINE=(--partition-size 128 --output-strategy {strategy})",
                  script.read_text(), flags=re.M)  # fmt: skip
    script.write_text(text)
    env_path = f"PATH={BIN}:{os.environ.get('PATH', '')}"
    options = ("--nodes=3", "--ntasks=6", "--ntasks-per-node=2", "--exclusive", "--parsable")
    started = time.monotonic()
    job = cluster.slurm("env", env_path, "sbatch", *options, str(script), cwd=mount / name).stdout.strip()
    while True:
        state = cluster.slurm("scontrol", "show", "job", "-o", job).stdout
        if not re.search(r"JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING)", state):
            break
        if time.monotonic() - started > 300:
            cluster.slurm("scancel", job, check=False)
            raise SystemExit(f"job {job} ({strategy}) still running after 300 s")
        time.sleep(0.1)
    seconds = time.monotonic() - started
    run = export / name
    log = (run / f"paramedic-{job}.log").read_text() if (run / f"paramedic-{job}.log").exists() else ""
    journal_left = (run / ".hits.txt.journal").exists()
    if "JobState=COMPLETED" not in state:
        said = [line for line in log.splitlines() if line.startswith("paramedic: error:")]
        exit_code = re.search(r"ExitCode=(\S+)", state)
        return {"strategy": strategy, "seconds": round(seconds, 2), "failed": said[0] if said else log[-300:],
                "exit": exit_code.group(1) if exit_code else "?", "journal_left": journal_left}  # fmt: skip
    same = without_posted_date((run / "hits.txt").read_bytes(), "0") == without_posted_date(
        (data / "ref" / "ref.txt").read_bytes(), "0"
    )
    record = json.loads((run / "hits.txt.run.json").read_text())
    writes = [r["seconds"].get("write", 0.0) for r in record["ranks_stats"]]
    return {
        "strategy": strategy,
        "seconds": round(seconds, 2),
        "search_seconds": record.get("wall_seconds"),
        "write_seconds_max_rank": round(max(writes), 3),
        "write_seconds_all_ranks": round(sum(writes), 3),
        "output_bytes": (run / "hits.txt").stat().st_size,
        "same_as_blast": same,
        "journal_left": journal_left,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="unshaped,100mbit,10mbit")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--cache", choices=("coherent", "default"), default="coherent",
                        help="sshfs's caches: off (as NFS's close-to-open, the default) or sshfs's own")  # fmt: skip
    args = parser.parse_args()
    cluster = Cluster(
        nodes=3, prefix="pmo", subnet="10.226.30", root=Path("/var/tmp/pmo-cluster"), others=("nas",)
    )
    rows = []
    try:
        cluster.up()
        export, mount = cluster.root / "export", cluster.root / "net"
        key = start_nas(cluster, export)
        data = prepare_data(cluster, args.queries)
        mount_everywhere(cluster, key, export, mount, args.cache)
        for rate in args.rates.split(","):
            if rate != "unshaped":
                cluster.shape("nas", rate)
            for strategy in args.strategies.split(","):
                row = one_job(cluster, data, strategy, f"{strategy}-{rate}", export, mount)
                row["rate"] = rate
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        cluster.down()
    print(f"\n{args.queries} queries x 2,000 proteins (3 fragments), outfmt 0, 6 ranks on 3 nodes, "
          f"sshfs caches: {args.cache}\n")  # fmt: skip
    print("| link to nas | strategy | sbatch -> end (s) | write, slowest rank (s) | write, all ranks (s) "
          "| bytes | = BLAST+ | journal left |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['rate']} | {r['strategy']} | {r['seconds']:.2f} | failed, exit {r['exit']}: "
                  f"{r['failed']} | | | | {'yes' if r['journal_left'] else 'no'} |")  # fmt: skip
            continue
        print(
            f"| {r['rate']} | {r['strategy']} | {r['seconds']:.2f} | {r['write_seconds_max_rank']:.3f} | "
            f"{r['write_seconds_all_ranks']:.3f} | {r['output_bytes']:,} | {'yes' if r['same_as_blast'] else 'NO'} | "
            f"{'yes' if r['journal_left'] else 'no'} |"
        )
    return 0


if __name__ == "__main__":
    os.environ.pop("SLURM_CONF", None)
    sys.exit(main())
