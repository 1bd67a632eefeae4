"""A cluster in a box: N emulated nodes under real Slurm on this one machine (issue 26).

Each node is a network namespace on a private bridge with its own IP address, its own hostname (a UTS
namespace) and its own mount namespace, in which a tmpfs is mounted on the node-local scratch directory,
on /tmp, on /dev/shm, and a hosts file naming every node over /etc/hosts: no other node sees them. One more
namespace, the controller, runs munged and slurmctld; each node runs its own slurmd. The cluster's root
directory (its `shared/` folder, the virtual environment, the data) is seen by every node alike: the
parallel filesystem. The host gets the bridge's first address, so sbatch, squeue and scontrol work from
it as from a login node (SLURM_CONF=<root>/slurm.conf).

Every name carries a prefix (`pmc` by default: bridge `pmcbr0`, namespaces `pmc-ctl`, `pmc-node1`, ...),
and `down` removes whatever has that prefix: the processes in its namespaces (every daemon, job step and
rank runs in one), the namespaces (their veth pairs and private mounts go with them), the bridge and the
root directory. `up` does the same first, so a run after a kill -9 of the last one starts clean. Nothing
else of the host is touched: not its default route, its other interfaces, or its DNS.

    python -m tests.support.cluster up [--nodes 3]      # make cluster
    python -m tests.support.cluster down                # make cluster-down
    python -m tests.support.cluster exec node2 CMD...   # a command on a node (its namespaces)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DAEMON_COMMANDS = ("munged", "slurmctld", "slurmd", "ip", "tc", "unshare", "nsenter")
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
# The node-local scratch: a tmpfs of this size on each node, private to it.
SCRATCH_SIZE = "512m"
# Seconds a job step's credential lives, and a requeued job waits before it starts again.
CRED_EXPIRE = 10
# UCX's transports for every task on the emulated nodes (their TaskProlog): the network only.
UCX_TRANSPORTS = "tcp,self"
# Where a node's own memory cgroup is made (`Cluster.memory`), named <prefix>-<node>.
MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass
class Cluster:
    """The names, addresses and directories of one emulated cluster; `up` and `down` act on them."""

    nodes: int = 3
    prefix: str = "pmc"
    subnet: str = "10.226.26"  # a /24 of our own on the bridge: the host is .1, the controller .2
    root: Path = field(default_factory=lambda: Path("/var/tmp/pmc-cluster"))
    cpus: int = 2
    # Hosts on the bridge that are no Slurm nodes (e.g. "site", a storage site): .3, .4, ...
    others: tuple[str, ...] = ()
    # Nodes with a memory cgroup of their own (cgroup v1), e.g. {"node3": 2 << 30}: its slurmd, and so
    # every job step and rank on it, runs under that limit (a node smaller than the others).
    memory: dict[str, int] = field(default_factory=dict)
    # The daemons this object started, kept until `down` reaps them (a Popen dropped while its process
    # runs is a ResourceWarning at whichever test the collector runs in)
    spawned: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False, compare=False)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def shared(self) -> Path:
        """The parallel filesystem's stand-in: every node sees it (as it sees all of the host's files)."""
        return self.root / "shared"

    @property
    def scratch(self) -> Path:
        """Node-local scratch: the same path on every node, a different tmpfs behind it on each."""
        return self.root / "scratch"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def address(self, host: str) -> str:
        if host == "ctl":
            return f"{self.subnet}.2"
        if host in self.others:
            return f"{self.subnet}.{3 + self.others.index(host)}"
        return f"{self.subnet}.{10 + int(host.removeprefix('node'))}"

    def veth(self, host: str) -> str:
        """The host side of `host`'s veth pair (on the bridge)."""
        return f"{self.prefix}-v{['ctl', *self.others, *self.node_names].index(host)}"

    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    @property
    def env(self) -> dict[str, str]:
        """A client's environment on the host: this cluster's configuration, no enclosing job's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_"))}
        return {**env, "SLURM_CONF": str(self.conf)}

    # --- up --------------------------------------------------------------------------------------------

    def up(self, timeout: float = 60) -> None:
        """Clean whatever an earlier run left, then the bridge, the hosts, munged, slurmctld, the slurmds;
        return when every node is idle. On any failure, tear everything down again."""
        missing = [c for c in DAEMON_COMMANDS if shutil.which(c) is None]
        if missing:
            raise RuntimeError(f"missing: {', '.join(missing)} (run `make slurm cluster-tools`)")
        if os.getuid() != 0:
            raise RuntimeError("namespaces, a bridge and slurmd need root")
        self.down()
        try:
            self._make_dirs()
            self._make_network()
            self._start_munge()
            self._write_conf()
            self._spawn("ctl", "slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for node in self.node_names:
                self._spawn(node, f"slurmd-{node}", ["slurmd", "-D", "-f", str(self.conf), "-N", node])
            self.wait(lambda: self.states() == ["idle"] * self.nodes, "every node idle", timeout)
        except BaseException:
            self.down()
            raise

    def _make_dirs(self) -> None:
        for sub in ("munge", "state", "spool", "log", "run", "shared", "scratch"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.node_names:
            (self.root / "spool" / node).mkdir(exist_ok=True)
        for path in (self.root, self.root / "munge", self.shared, self.scratch):
            path.chmod(0o755)  # munged: its socket's directory must be searchable by all
        self.shared.chmod(0o1777)
        names = [(n, self.address(n)) for n in ("ctl", *self.others, *self.node_names)]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in names)
        (self.root / "hosts").write_text(hosts)

    def _make_network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for host in ["ctl", *self.others, *self.node_names]:
            ns, veth = self.netns(host), self.veth(host)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn("ctl", "munged", [
            "munged", "-F", f"--socket={munge / 'socket'}", f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
            f"--log-file={self.logs / 'munged.log'}",
        ])  # fmt: skip
        self.wait(lambda: (munge / "socket").exists(), "munged's socket", 20)

    def _write_conf(self) -> None:
        lines = [
            "ClusterName=paramedic-box",
            f"SlurmctldHost=ctl({self.address('ctl')})",
            f"SlurmctldPort={SLURMCTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: also how long a requeued job waits before it starts again (default 120 s)
            f"AuthInfo=socket={self.root / 'munge' / 'socket'},cred_expire={CRED_EXPIRE}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd-%n.log'}",
            f"TmpFS={self.scratch}",
            f"TaskProlog={self.root / 'task-prolog'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            # a job whose begin time passes (a requeued one, after cred_expire) starts within seconds,
            # not at the next full pass (60 s by default)
            "SchedulerParameters=sched_interval=5",
            "ReturnToService=2",
            # A node that stops answering is down within seconds, not the default 5 minutes.
            "SlurmdTimeout=10",
            "MessageTimeout=5",
            "MailProg=/bin/true",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "KillWait=5",
            *(
                f"NodeName={n} NodeAddr={self.address(n)} NodeHostname={n} CPUs={self.cpus} State=UNKNOWN"
                for n in self.node_names
            ),
            "PartitionName=box Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]
        self.conf.write_text("\n".join(lines))
        # The nodes share one kernel, and UCX (the transport of MPICH's wheel) reaches a process on the
        # same kernel through shared memory (/proc/<pid>/fd, process_vm_readv) whatever its namespaces:
        # ranks on different nodes would never use the bridge, and a node cut off would still compute.
        # Every task of the cluster gets TCP only (and `self`), as between real nodes.
        prolog = self.root / "task-prolog"
        prolog.write_text(f"#!/bin/sh\necho export UCX_TLS={UCX_TRANSPORTS}\n")
        prolog.chmod(0o755)

    def spawn(self, host: str, log: str, command: list[str]) -> int:
        """Start a long-running command on `host` (in its namespaces); its output goes to log/<log>.out.
        `down` ends it with everything else on the host."""
        return self._spawn(host, log, command)

    def shape(self, host: str, rate: str) -> None:
        """Limit `host`'s link both ways to `rate` (e.g. "20mbit"): a token bucket (tc tbf) on each end
        of its veth pair. (This kernel has no netem: no added delay or loss.)"""
        tbf = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms"]
        _run("tc", "qdisc", "replace", "dev", self.veth(host), *tbf)
        _run("ip", "netns", "exec", self.netns(host), "tc", "qdisc", "replace", "dev", "eth0", *tbf)

    def _spawn(self, host: str, log: str, command: list[str]) -> int:
        """Start a daemon on `host`: in its network namespace, with its hostname, its private mounts."""
        setup = [
            f"hostname {host}",
            f"mount --bind {self.root / 'hosts'} /etc/hosts",
            "mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm",
        ]
        if host in self.memory:
            cgroup = self._memory_cgroup(host)
            setup.insert(0, f"echo $$ > {cgroup / 'cgroup.procs'}")
        if host in self.node_names:
            setup.append(f"mount -t tmpfs -o size={SCRATCH_SIZE},mode=1777 tmpfs {self.scratch}")
            # the node's own /tmp, as on a real node: what a job leaves there stays on the node (and
            # goes with it at `down`), never in the host's. The checkout (its .venv, its sources) may
            # live under the host's /tmp (a fresh clone in CI): it is bound aside first, then back in.
            for i, kept in enumerate(self.kept):
                aside = self.root / "kept" / host / str(i)
                setup.append(f"mkdir -p {aside} && mount --bind {kept} {aside}")
            setup.append("mount -t tmpfs -o size=256m,mode=1777 tmpfs /tmp")
            for i, kept in enumerate(self.kept):
                aside = self.root / "kept" / host / str(i)
                setup.append(f"mkdir -p {kept} && mount --bind {aside} {kept}")
        script = " && ".join(setup) + ' && exec "$@"'
        with open(self.logs / f"{log}.out", "ab") as out:
            proc = subprocess.Popen(
                # nsenter, not `ip netns exec`: that mounts a /sys of its own, without the cgroup
                # filesystem slurmd reads.
                ["nsenter", f"--net=/run/netns/{self.netns(host)}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", script, "sh", *command],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True, cwd=self.root,
            )  # fmt: skip
        self.spawned.append(proc)
        return proc.pid

    def _memory_cgroup(self, host: str) -> Path:
        """The host's memory cgroup (made with its limit when missing)."""
        cgroup = MEMORY_CGROUPS / f"{self.prefix}-{host}"
        if not MEMORY_CGROUPS.is_dir():
            raise RuntimeError(
                f"no cgroup v1 memory hierarchy at {MEMORY_CGROUPS}: a node's own limit needs it"
            )
        cgroup.mkdir(exist_ok=True)
        (cgroup / "memory.limit_in_bytes").write_text(str(self.memory[host]))
        return cgroup

    # --- state -----------------------------------------------------------------------------------------

    def slurm(
        self, *command: str, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client on the host (the login node)."""
        proc = subprocess.run(command, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def states(self) -> list[str]:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%t", check=False)
        return out.stdout.split() if out.returncode == 0 else []

    def wait(self, ready: Callable[[], bool], what: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {seconds:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 12) -> str:
        if not self.logs.is_dir():
            return ""
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
            for p in sorted(self.logs.iterdir())
        )

    def pids(self, host: str) -> list[int]:
        """Every process in the host's network namespace: its daemons, job steps, ranks, BLAST+."""
        out = _run("ip", "netns", "pids", self.netns(host), check=False)
        return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []

    @property
    def kept(self) -> list[Path]:
        """What every node must still see of the host's /tmp under its own: the checkout this module is
        part of and the Python environment running it, when they live there."""
        here = Path(__file__).resolve().parents[2]
        paths = {here, Path(sys.prefix).resolve()}
        return sorted(p for p in paths if p.is_relative_to("/tmp") and p != Path("/tmp"))

    def left_on_node(self, host: str, directory: str) -> list[str]:
        """What is in `directory` on `host`, the checkout's own entry in /tmp aside (`kept`)."""
        names = self.on_node(host, "ls", "-A", directory).stdout.split()
        ours = {p.relative_to("/tmp").parts[0] for p in self.kept} if directory == "/tmp" else set()
        return [n for n in names if n not in ours]

    def on_node(self, host: str, *command: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a command on a node, in all its namespaces (those of its slurmd)."""
        pid = self.daemon_pid(host)
        return subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "-u", "-m", *command],
            capture_output=True, text=True, timeout=60, **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip

    def daemon_pid(self, host: str) -> int:
        name = "slurmctld" if host == "ctl" else "slurmd"
        for pid in self.pids(host):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    return pid
            except OSError:
                continue
        raise RuntimeError(f"no {name} on {host}")

    def crash(self, host: str) -> None:
        """The node is lost: every process on it is killed at once (its slurmd, job steps and ranks)."""
        kill_all(self.pids(host), grace=0)

    def cut(self, host: str) -> None:
        """The host's network is cut (its link on the bridge down): its processes live on, and reach
        nobody, nor does anybody reach them."""
        _run("ip", "link", "set", self.veth(host), "down")

    def mend(self, host: str) -> None:
        """The host's network is back (the link that `cut` took down is up again)."""
        _run("ip", "link", "set", self.veth(host), "up")

    def restart(self, host: str, timeout: float = 60) -> None:
        """A lost node comes back (as after a reboot: its scratch is empty again); Slurm returns it to
        service when its slurmd registers (ReturnToService=2)."""
        self._spawn(host, f"slurmd-{host}", ["slurmd", "-D", "-f", str(self.conf), "-N", host])
        self.wait(lambda: self.states() == ["idle"] * self.nodes, "every node idle", timeout)

    # --- down ------------------------------------------------------------------------------------------

    def down(self) -> None:
        """Remove everything with this prefix, whoever made it: processes, namespaces, bridge, root."""
        namespaces = [
            n
            for n in _run("ip", "netns", "list", check=False).stdout.split()
            if n.startswith(f"{self.prefix}-")
        ]
        kill_all([p for ns in namespaces for p in _ns_pids(ns)], grace=5)
        for proc in self.spawned:  # killed above with their namespaces: reaped here
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.spawned.clear()
        for ns in namespaces:
            _run("ip", "netns", "del", ns, check=False)
        links = _run("ip", "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name == self.bridge or name.startswith(f"{self.prefix}-v"):
                _run("ip", "link", "del", name, check=False)
        for cgroup in MEMORY_CGROUPS.glob(f"{self.prefix}-*") if MEMORY_CGROUPS.is_dir() else []:
            try:
                cgroup.rmdir()  # empty now: its processes were killed
            except OSError:
                pass
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)


def _ns_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def kill_all(pids: Sequence[int], grace: float) -> None:
    """SIGTERM (when there is a grace period), then SIGKILL what is left; wait until they are gone."""
    if grace > 0:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    _signal(pids, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie is gone for our purposes: its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--prefix", default="pmc", help="names of the bridge and namespaces (default pmc)")
    parser.add_argument(
        "--subnet", default="10.226.26", help="the bridge's /24, as A.B.C (default 10.226.26)"
    )
    parser.add_argument("--root", type=Path, default=None, help="default /var/tmp/<prefix>-cluster")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="bring the cluster up (after removing any earlier one)")
    up.add_argument("--nodes", type=int, default=3)
    sub.add_parser("down", help="remove everything with the prefix")
    run = sub.add_parser("exec", help="run a command on a node, in its namespaces")
    run.add_argument("node")
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    root = args.root or Path(f"/var/tmp/{args.prefix}-cluster")
    cluster = Cluster(nodes=getattr(args, "nodes", 3), prefix=args.prefix, subnet=args.subnet, root=root)
    try:
        if args.action == "up":
            started = time.monotonic()
            cluster.up()
            print(f"cluster up in {time.monotonic() - started:.1f} s: {', '.join(cluster.node_names)}")
            print(f"  export SLURM_CONF={cluster.conf}    # then sinfo, sbatch -N {cluster.nodes} ...")
            print(
                f"  shared directory: {cluster.shared}; node-local scratch: {cluster.scratch} (one per node)"
            )
        elif args.action == "down":
            cluster.down()
            print("cluster down")
        else:
            proc = subprocess.run(["nsenter", "-t", str(cluster.daemon_pid(args.node)), "-n", "-u", "-m",
                                   *args.command])  # fmt: skip
            return proc.returncode
    except RuntimeError as e:
        print(f"cluster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
