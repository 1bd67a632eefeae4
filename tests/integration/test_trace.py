"""`paramedic trace` on real MPI programs with real mpiexec ranks: LAMMPS (Debian's, Open MPI) and
examples/trace/random_comm.c (Open MPI and the mpich wheel's MPICH), checked record by record, and the
trace's metadata regenerating the file byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from paramedic.trace import clog2, codec
from tests.conftest import BIN, paramedic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RANDOM_COMM = ROOT / "examples/trace/random_comm.c"
MELT = Path("/usr/share/lammps/examples/melt/in.melt")
OMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
STATES = {  # clogtrace_states.h
    "Finalize": 2,
    "Isend": 14,
    "Irecv": 17,
    "Sendrecv": 18,
    "Waitall": 21,
    "Bcast": 31,
    "Allreduce": 33,
}


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None and not Path(t).exists()]
    if missing:
        message = f"missing {', '.join(missing)} (make mpi-trace installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


class Lcg:
    """random_comm.c's generator."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next(self) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return self.state >> 33


def expected_states(steps: int, seed: int, size: int) -> Counter[int]:
    """How many times each rank calls each traced MPI function in random_comm (the same on every rank)."""
    rng, calls = Lcg(seed), Counter[int]()
    for _ in range(steps):
        rng.next(), rng.next(), rng.next()
        kind = rng.next() % 10
        if kind == 0:
            calls[STATES["Allreduce"]] += 1
        elif kind == 1:
            rng.next()
            calls[STATES["Bcast"]] += 1
        elif kind < 5:
            calls[STATES["Sendrecv"]] += 1
        else:
            calls[STATES["Irecv"]] += 1
            calls[STATES["Isend"]] += 1
            calls[STATES["Waitall"]] += 1
        i = 0
        while i < rng.next() % 2000:
            i += 1
    calls[STATES["Finalize"]] += 1
    return calls


def check_structure(trace: clog2.Trace, size: int) -> None:
    """Every rank's states open and close in order; sends and receives pair up; times grow per rank."""
    rec = trace.records
    assert set(np.unique(rec.head[:, 1]).tolist()) == set(range(size))
    sends, recvs = Counter(), Counter()
    for rank in range(size):
        mine = rec.take(np.flatnonzero(rec.head[:, 1] == rank))
        assert np.all(np.diff(mine.seconds()) >= 0)
        open_state = None
        for rectype, body in zip(mine.head[:, 3].tolist(), mine.body[:, :5].tolist(), strict=True):
            if rectype == 5:
                etype = body[0]
                if etype % 2 == 0:
                    assert open_state is None, "a state starts inside another"
                    open_state = etype // 2
                else:
                    assert open_state == etype // 2, "a state ends that did not start"
                    open_state = None
            elif rectype == 7:
                assert open_state is not None
                key = (rank, body[2], body[3]) if body[0] == -101 else (body[2], rank, body[3])
                (sends if body[0] == -101 else recvs)[key] += 1
        assert open_state is None
    assert sends == recvs


def trace_and_check(tmp_path: Path, command: list[str], size: int, env: dict[str, str]) -> clog2.Trace:
    out = tmp_path / "run.clog2"
    proc = paramedic("trace", "-out", str(out), "--", *command, env=env)
    assert "trace written" in proc.stderr
    data = out.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # rank logs removed
    trace = clog2.read(data)
    assert trace.big_endian and trace.block_size == 65536
    assert clog2.write(trace) == data
    check_structure(trace, size)
    encoded = codec.encode(data)
    assert codec.decode(encoded.data) == data
    return trace


def state_counts(trace: clog2.Trace, rank: int) -> Counter[int]:
    rec = trace.records
    starts = (rec.head[:, 1] == rank) & (rec.head[:, 3] == 5) & (rec.body[:, 0] % 2 == 0)
    return Counter((rec.body[starts, 0] // 2).tolist())


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_random_comm_records_match_the_calls(tmp_path: Path, flavour: str) -> None:
    mpicc, mpiexec = (
        ("mpicc.openmpi", "mpiexec.openmpi")
        if flavour == "openmpi"
        else (str(BIN / "mpicc"), str(BIN / "mpiexec"))
    )
    need(mpicc, mpiexec)
    program = tmp_path / "random_comm"
    subprocess.run([mpicc, "-O2", "-o", str(program), str(RANDOM_COMM)], check=True)
    run = tmp_path / "run"
    run.mkdir()
    steps, seed, size = 300, 11, 3
    trace = trace_and_check(
        run, [mpiexec, "-n", str(size), str(program), str(steps), str(seed)], size, OMPI_ENV
    )
    expected = expected_states(steps, seed, size)
    for rank in range(size):
        assert state_counts(trace, rank) == expected
    rec = trace.records
    defined = (ROOT / "src/paramedic/trace/native/clogtrace_states.h").read_text().count("\nSTATE(")
    definitions = int(np.sum((rec.head[:, 3] == 2) & (rec.head[:, 1] == 0)))
    assert definitions == defined == 132  # the state definitions
    assert int(np.sum(rec.head[:, 3] == 11)) == 2 * size  # clock offsets at init and finalize


def test_lammps_melt(tmp_path: Path) -> None:
    need("lmp", "mpiexec.openmpi", str(MELT))
    (tmp_path / "in.melt").write_text(MELT.read_text().replace("run\t\t250", "run\t\t100"))
    run = tmp_path / "run"
    run.mkdir()
    command = [
        "mpiexec.openmpi",
        "-n",
        "2",
        "lmp",
        "-in",
        str(tmp_path / "in.melt"),
        "-log",
        "none",
        "-screen",
        "none",
    ]
    trace = trace_and_check(run, command, 2, OMPI_ENV)
    assert len(trace.records) > 2000
    encoded = codec.encode((run / "run.clog2").read_bytes())
    assert all(encoded.periods.values())  # a period found on every rank (used only where it pays)
    assert len(encoded.data) * 10 < len((run / "run.clog2").read_bytes())
    paramedic("report", str(run / "run.clog2"), "-out", str(run / "run.html"), "--max-records", "3000")
    page = (run / "run.html").read_text()
    data = json.loads(page.split("<script id='data' type='application/json'>", 1)[1].split("</script>", 1)[0])
    assert "MPI_Sendrecv" in [c[0] for c in data["categories"]]
    assert sum(map(sum, data["matrix"]["messages"])) > 100 and all(p[0] for p in data["periods"].values())
    assert 0 < sum(w[3] for w in data["detail"]["windows"]) <= 3000  # --max-records: the single calls kept
    assert "MPI_File_delete" not in page  # defined, never called: not on the page
    mask = os.umask(0)
    os.umask(mask)
    for made in (run / "run.clog2", run / "run.html"):  # files of the user's, as the site's copy (were 0600)
        assert made.stat().st_mode & 0o777 == 0o666 & ~mask


def test_failing_program_leaves_no_trace(tmp_path: Path) -> None:
    need("mpiexec.openmpi")
    out = tmp_path / "bad.clog2"
    proc = paramedic(
        "trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "2", "false", check=False, env=OMPI_ENV
    )
    assert proc.returncode == 7 and "paramedic: error:" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("built", ["openmpi", "mpich"])
def test_program_of_the_other_mpi_is_refused(tmp_path: Path, built: str) -> None:
    """An Open MPI program (Debian's LAMMPS is one) started by an MPICH mpiexec (the wheel's, first on a
    virtualenv's PATH), or the reverse, is refused with the reason: it crashed in MPI_Init (status 11)."""
    mpicc, mpiexec = (
        ("mpicc.openmpi", str(BIN / "mpiexec"))
        if built == "openmpi"
        else (str(BIN / "mpicc"), "mpiexec.openmpi")
    )
    need(mpicc, mpiexec)
    program = tmp_path / "random_comm"
    subprocess.run([mpicc, "-O2", "-o", str(program), str(RANDOM_COMM)], check=True, capture_output=True)
    run = tmp_path / "run"
    run.mkdir()
    proc = paramedic(
        "trace", "-out", str(run / "run.clog2"), "--", mpiexec, "-n", "2", str(program), "50", "3",
        check=False, env=OMPI_ENV,
    )  # fmt: skip
    other = "Open MPI" if built == "openmpi" else "MPICH"
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert last.startswith(f"paramedic: error: this program is linked with {other}, but the launcher is"), (
        last
    )
    assert "Traceback" not in proc.stderr
    assert list(run.iterdir()) == []


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trace-keys")
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    return base / "keys"


@pytest.fixture(scope="module")
def random_comm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("mpicc.openmpi", "mpiexec.openmpi")
    program = tmp_path_factory.mktemp("random-comm") / "random_comm"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(program), str(RANDOM_COMM)], check=True)
    return program


def test_trace_ships_to_a_site_without_replica(tmp_path: Path, keys: Path, random_comm: Path) -> None:
    """`trace --site`: the metadata crosses real TLS to a `paramedic serve` with no database replica, which
    regenerates the trace; the site's file equals the local one byte for byte. Then `paramedic ship` of the
    same file compressed, and of a file that is no trace (refused before anything is sent)."""
    from tests.support.site import StorageSite

    root = tmp_path / "root"
    root.mkdir()
    site = StorageSite(None, root, keys / "server", tmp_path / "serve.log")
    site.start()
    try:
        local = tmp_path / "run.clog2"
        record = tmp_path / "ship.json"
        proc = paramedic(
            "trace", "-out", "run.clog2", "--site", site.url, "--keys", str(keys / "compute-a"),
            "--ship", "metadata", "--record", str(record), "--",
            "mpiexec.openmpi", "-n", "3", str(random_comm), "400", "3",
            cwd=tmp_path, env=OMPI_ENV,
        )  # fmt: skip
        assert "identical" in proc.stderr
        assert (root / "run.clog2").read_bytes() == local.read_bytes()
        ship = json.loads(record.read_text())["ship"]
        assert ship["mode"] == "metadata" and ship["codec"] == "trace-metadata"
        assert ship["shipped_payload_bytes"] * 5 < local.stat().st_size

        paramedic(
            "ship", str(local), "-out", "again/run.clog2", "--site", site.url,
            "--keys", str(keys / "compute-a"), "--ship", "compressed",
        )  # fmt: skip
        assert (root / "again/run.clog2").read_bytes() == local.read_bytes()

        auto = tmp_path / "auto.json"
        paramedic(
            "ship", str(local), "-out", "auto/run.clog2", "--site", site.url,
            "--keys", str(keys / "compute-a"), "--ship", "auto", "--record", str(auto),
        )  # fmt: skip
        assert (root / "auto/run.clog2").read_bytes() == local.read_bytes()
        decision = json.loads(auto.read_text())["ship"]["auto_decision"]
        assert (
            decision["mode"] in ("metadata", "compressed")
            and decision["link"]["bandwidth_bytes_per_second"] > 0
            and decision["c_compress_seconds"] >= 0
            and "B*(f+g-c)" in decision["reason"]
        )
        # g, the site's decoding, is estimated from f by the trace codec's measured share (not as f)
        assert decision["g_estimated_per_f"] == 0.6
        assert decision["g_seconds"] == pytest.approx(0.6 * decision["f_seconds"], abs=2e-4)
        assert json.loads(auto.read_text())["ship"]["mode"] == decision["mode"]

        bad = tmp_path / "not-a-trace"
        bad.write_bytes(b"hello\n" * 100)
        proc = paramedic(
            "ship",
            str(bad),
            "-out",
            "bad",
            "--site",
            site.url,
            "--keys",
            str(keys / "compute-a"),
            check=False,
        )
        assert proc.returncode == 3 and proc.stderr.startswith("paramedic: error:")
        assert not (root / "bad").exists()
    finally:
        site.stop()


def test_site_refuses_corrupt_trace_metadata(tmp_path: Path, keys: Path, random_comm: Path) -> None:
    """Metadata damaged on the way (a digest that the regenerated file does not match): the site fails the
    job with a clear error and writes no file; the compute site exits 8 with one line."""
    from paramedic.ship.client import SiteAddress, TlsShipper
    from paramedic.ship.transport import SiteError
    from tests.support.site import StorageSite

    trace_path = tmp_path / "t.clog2"
    paramedic(
        "trace",
        "-out",
        str(trace_path),
        "--",
        "mpiexec.openmpi",
        "-n",
        "2",
        str(random_comm),
        "200",
        "5",
        env=OMPI_ENV,
    )
    data = trace_path.read_bytes()
    meta = bytearray(codec.encode(data).data)
    meta[meta.index(b'"sha256":"') + 10] ^= 1  # the recorded digest, one hex digit changed
    root = tmp_path / "root"
    root.mkdir()
    site = StorageSite(None, root, keys / "server", tmp_path / "serve.log")
    site.start()
    try:
        shipper = TlsShipper(SiteAddress.parse(site.url), keys / "compute-a", "trace-metadata",
                             {"out": "t.clog2"}, b"", streams=1, timeout=20)  # fmt: skip
        shipper.start()
        shipper.send({"offset": 0, "size": len(data)}, bytes(meta))
        with pytest.raises(SiteError, match="SHA-256"):
            shipper.finish({"size": len(data), "sha256": "0" * 64})
        shipper.close()
        assert not (root / "t.clog2").exists()
        assert [p.name for p in root.iterdir()] == [".paramedic-state"]
    finally:
        site.stop()


def test_site_bounds_the_memory_of_trace_regeneration(tmp_path: Path, keys: Path, random_comm: Path) -> None:
    """Regenerating a trace takes about 10 bytes of memory per byte of file, and metadata can claim a file of
    16 GiB: a real `paramedic serve --trace-memory 4M` refuses metadata of a trace that needs more, before
    decoding it (one line at the compute site, exit 8, no file), and takes the same trace compressed. Before,
    the site decoded whatever size the metadata claimed (a 152 MB trace peaked at 1.3 GB)."""
    from tests.support.site import StorageSite

    local = tmp_path / "t.clog2"
    paramedic(
        "trace", "-out", str(local), "--", "mpiexec.openmpi", "-n", "2", str(random_comm), "1500", "5",
        env=OMPI_ENV,
    )  # fmt: skip
    assert 4 * 2**20 < 10 * local.stat().st_size < 10 * 2**20  # 0.4-1 MB: a 4 MiB budget cannot decode it
    root = tmp_path / "root"
    root.mkdir()
    site = StorageSite(None, root, keys / "server", tmp_path / "serve.log", extra=("--trace-memory", "4M"))
    site.start()
    try:
        ship = ("ship", str(local), "-out", "t.clog2", "--site", site.url, "--keys", str(keys / "compute-a"))
        proc = paramedic(*ship, "--ship", "metadata", check=False)
        assert proc.returncode == 8, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("paramedic: error:"), proc.stderr
        assert (
            "over this storage site's memory for traces (4 MiB, serve --trace-memory): ship it compressed"
            in lines[0]
        )
        assert not (root / "t.clog2").exists()
        paramedic(*ship, "--ship", "compressed")
        assert (root / "t.clog2").read_bytes() == local.read_bytes()
    finally:
        site.stop()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
