"""Shipping traces the other ways (issue 22): reduced timestamp precision, the signed inbox, a stopped run
started again, and a file the columns do not rebuild. Real `paramedic serve` (no replica), real TLS, a
real traced MPI program (examples/trace/random_comm.c under Open MPI)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from paramedic.trace import clog2, codec, precision
from tests.conftest import paramedic
from tests.integration.test_trace import OMPI_ENV, RANDOM_COMM, need
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trace-ship-keys")
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    return base / "keys"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of random_comm (2 ranks, 600 steps) under Open MPI."""
    return trace_random_comm(tmp_path_factory.mktemp("traced") / "run.clog2", steps=600)


def trace_random_comm(out: Path, steps: int) -> Path:
    """random_comm built with Open MPI's mpicc beside `out`, traced on 2 ranks for `steps` steps."""
    need("mpicc.openmpi", "mpiexec.openmpi")
    random_comm = out.parent / "random_comm"
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(random_comm), str(RANDOM_COMM)], check=True)
    paramedic("trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "2", str(random_comm), str(steps), "9",
              env=OMPI_ENV)  # fmt: skip
    return out


@pytest.fixture
def site(tmp_path: Path, keys: Path):
    root = tmp_path / "root"
    root.mkdir()
    site = StorageSite(None, root, keys / "server", tmp_path / "serve.log")
    site.start()
    yield site
    site.stop()


def ship(site: StorageSite, keys: Path, path: Path, out: str, *flags: str, check: bool = True):
    return paramedic("ship", str(path), "-out", out, "--site", site.url, "--keys", str(keys / "compute-a"),
                     *flags, check=check)  # fmt: skip


def test_reduced_precision_is_explicit_and_recorded(tmp_path: Path, keys: Path, site, traced: Path) -> None:
    """--trace-precision 1us: the site's file is the trace with every time rounded to the microsecond (the
    same records, in the same order), the record and the metadata say so, and it ships smaller; lossless
    stays the default; a bad precision is one line and nothing at the site."""
    local = traced.read_bytes()
    record = tmp_path / "ship.json"
    proc = ship(site, keys, traced, "coarse.clog2", "--trace-precision", "1us", "--record", str(record))
    assert "rounded to 1us" in proc.stderr
    coarse = (site.root / "coarse.clog2").read_bytes()
    assert coarse == precision.reduce(local, 1000) and coarse != local
    ns = np.rint(clog2.read(coarse).records.seconds() * 1e9).astype(np.int64)
    assert np.all(ns % 1000 == 0)
    original = clog2.read(local).records
    assert np.array_equal(clog2.read(coarse).records.body, original.body)
    ship_section = json.loads(record.read_text())["ship"]
    assert ship_section["precision"] == "1us" and ship_section["mode"] == "metadata"
    meta = codec.encode(coarse, precision="1us").data
    assert b'"precision":"1us"' in meta and b'"time_unit":1000' in meta

    lossless = tmp_path / "lossless.json"
    ship(site, keys, traced, "exact.clog2", "--record", str(lossless))
    assert (site.root / "exact.clog2").read_bytes() == local
    exact = json.loads(lossless.read_text())["ship"]
    assert exact["precision"] == "lossless"
    assert ship_section["shipped_payload_bytes"] < exact["shipped_payload_bytes"]

    for bad in ("1 hour", "0us", "2s"):
        proc = ship(site, keys, traced, "bad.clog2", "--trace-precision", bad, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith("paramedic: error: --trace-precision")
        assert len(proc.stderr.splitlines()) == 1
    proc = paramedic("trace", "-out", str(tmp_path / "x.clog2"), "--trace-precision", "1us", "--",
                     "mpiexec.openmpi", "-n", "2", "true", check=False, env=OMPI_ENV)  # fmt: skip
    assert proc.returncode == 2 and "give --site" in proc.stderr
    assert sorted(p.name for p in site.root.iterdir()) == [".paramedic-state", "coarse.clog2", "exact.clog2"]


def test_a_stopped_ship_resumes_and_a_finished_one_is_not_refused(keys: Path, site, traced: Path) -> None:
    """A run stopped after its metadata reached the site (its job open, the chunk acknowledged, never
    finished: what a killed `paramedic ship` leaves) is finished by the same command run again, which
    reopens the job and sends nothing again; run once more, the command learns that the file is there."""
    from paramedic.ship.client import SiteAddress, TlsShipper
    from paramedic.ship.file_ship import resumable_job_id

    data = traced.read_bytes()
    encoded = codec.encode(data)
    payload = encoded.data
    job = resumable_job_id("resumed.clog2", "trace-metadata", data)
    first = TlsShipper(SiteAddress.parse(site.url), keys / "compute-a", "trace-metadata",
                       {"out": "resumed.clog2"}, b"", streams=1, timeout=20, job_id=job)  # fmt: skip
    first.start()
    first.send({"offset": 0, "size": len(data), "mode": encoded.mode}, payload)
    with first.shared.cond:
        assert first.shared.cond.wait_for(lambda: not first.shared.pending or first.shared.failure, 20)
    assert first.shared.failure is None
    first.close()  # no finish, no cancel: as if killed
    assert not (site.root / "resumed.clog2").exists()

    record = site.root.parent / "resumed.json"
    proc = ship(site, keys, traced, "resumed.clog2", "--record", str(record))
    assert "identical" in proc.stderr
    assert (site.root / "resumed.clog2").read_bytes() == data
    section = json.loads(record.read_text())["ship"]
    assert section["wire_bytes"] < len(payload)  # the acknowledged metadata was not sent again

    proc = ship(site, keys, traced, "resumed.clog2", "--record", str(record))
    assert "already at" in proc.stderr
    assert json.loads(record.read_text())["ship"]["already_at_site"] is True
    other = traced.with_name("other.clog2")
    other.write_bytes(precision.reduce(data, 1000))
    proc = ship(site, keys, other, "resumed.clog2", check=False)  # another file: still never replaced
    assert proc.returncode == 8 and "already there" in proc.stderr


def test_a_trace_ships_through_the_signed_inbox(tmp_path: Path, keys: Path, traced: Path) -> None:
    """`serve --inbox --keys` without a replica and `paramedic ship --site file://`: the trace's metadata
    crosses the shared directory signed, the site writes the identical file, the inbox is left empty; the
    same command at once again (a job directory of the same name, which the site once ignored as the
    finished one: exit 8, 1 run in 4) exits 0 too."""
    inbox, root = tmp_path / "inbox", tmp_path / "root"
    root.mkdir()
    server = StorageSite(None, root, keys / "server", tmp_path / "serve.log", 1, inbox=inbox)
    server.start()  # the site makes the inbox as it starts
    try:
        for name in ("inbox", "inbox"):
            record = tmp_path / "inbox.json"
            paramedic("ship", str(traced), "-out", f"via/{name}.clog2", "--site", f"file://{inbox}",
                      "--keys", str(keys / "compute-a"), "--ship-timeout", "60", "--record", str(record))  # fmt: skip
            assert (root / f"via/{name}.clog2").read_bytes() == traced.read_bytes()
            section = json.loads(record.read_text())["ship"]
            assert section["mode"] == "metadata" and section["codec"] == "trace-metadata"
            assert list(inbox.iterdir()) == []
        assert "signed jobs only" in server.log()
        stopped_runs_resume(inbox, root, keys, traced)
    finally:
        server.stop()


def test_auto_ships_compressed_when_the_site_cannot_hold_the_regeneration(
    tmp_path: Path, keys: Path, traced: Path
) -> None:
    """Through the inbox `auto` picks metadata (no link to measure). A site whose --trace-memory cannot hold
    this trace's regeneration refuses it; `auto` then ships the file compressed (exit 0, the identical
    file, the refusal in the record), while `--ship metadata` ends with the site's one line (exit 8)."""
    inbox, root = tmp_path / "inbox", tmp_path / "root"
    root.mkdir()
    assert 10 * traced.stat().st_size > 2**20
    server = StorageSite(
        None, root, keys / "server", tmp_path / "serve.log", 1, ("--trace-memory", "1M"), inbox
    )
    server.start()
    try:
        common = ("--site", f"file://{inbox}", "--keys", str(keys / "compute-a"), "--ship-timeout", "60")
        proc = paramedic("ship", str(traced), "-out", "m.clog2", *common, "--ship", "metadata", check=False)
        assert proc.returncode == 8 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "serve --trace-memory): ship it compressed" in proc.stderr
        assert not (root / "m.clog2").exists()
        record = tmp_path / "auto.json"
        paramedic("ship", str(traced), "-out", "a.clog2", *common, "--ship", "auto", "--record", str(record))
        assert (root / "a.clog2").read_bytes() == traced.read_bytes()
        section = json.loads(record.read_text())["ship"]
        assert section["mode"] == "compressed" and section["codec"] == "compressed"
        assert "over this storage site's memory" in section["auto_decision"]["metadata_refused"]
        assert list(inbox.iterdir()) == []
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def stopped_runs_resume(inbox: Path, root: Path, keys: Path, traced: Path) -> None:
    """A `paramedic ship` through the inbox stopped (1) just after it made its job's directory, (2) after
    the site answered but before it read the answer: the same command again exits 0 with the identical
    file at the site (it failed with exit 8 "File exists" before), and (2) learns from the site's signed
    done.json that the file is already there, sending nothing; the inbox is left empty."""
    import hashlib

    from paramedic.ship.file_ship import resumable_job_id
    from paramedic.ship.inbox_client import InboxShipper
    from paramedic.ship.trace_codec import TraceMetadataCodec
    from paramedic.ship.transport import SiteAddress

    data = traced.read_bytes()
    (inbox / resumable_job_id("stopped/a.clog2", "trace-metadata", data)).mkdir()  # (1)
    paramedic("ship", str(traced), "-out", "stopped/a.clog2", "--site", f"file://{inbox}",
              "--keys", str(keys / "compute-a"), "--ship-timeout", "60")  # fmt: skip
    assert (root / "stopped/a.clog2").read_bytes() == data and list(inbox.iterdir()) == []

    job = resumable_job_id("stopped/b.clog2", "trace-metadata", data)  # (2): the client's own code, to
    shipper = InboxShipper(SiteAddress.parse(f"file://{inbox}"), "trace-metadata",  # the answer
                           {"out": "stopped/b.clog2"}, b"", 60, keys / "compute-a", job_id=job)  # fmt: skip
    shipper._remove = lambda: shipper.stopping.set()  # type: ignore[method-assign]  # stopped before this
    shipper.start()
    shipper.send(*TraceMetadataCodec().encode((0, data)))
    shipper.finish({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    assert (inbox / job / "done.json").is_file()
    record = inbox.parent / "stopped.json"
    proc = paramedic("ship", str(traced), "-out", "stopped/b.clog2", "--site", f"file://{inbox}",
                     "--keys", str(keys / "compute-a"), "--ship-timeout", "60", "--record", str(record))  # fmt: skip
    assert "already at" in proc.stderr
    assert json.loads(record.read_text())["ship"]["already_at_site"] is True
    assert (root / "stopped/b.clog2").read_bytes() == data and list(inbox.iterdir()) == []


def test_a_layout_the_columns_do_not_rebuild_ships_checked(
    tmp_path: Path, keys: Path, site, traced: Path
) -> None:
    """A CLOG2 file another writer made differently (an ENDBLOCK whose time is not the next record's):
    the metadata sent unchecked does not rebuild it, the site refuses the regenerated file (its SHA-256),
    the compute site's check then finds the layout and ships the general codec's metadata in a new job;
    the site's file is identical, and nothing else is left there."""
    data = bytearray(traced.read_bytes())
    pre = clog2.parse_preamble(bytes(data), len(data))
    nblocks = (pre.commtable_fptr - clog2.PREAMBLE_SIZE) // pre.block_size
    assert nblocks >= 2
    rectypes = np.frombuffer(
        bytes(data), ">i4", count=nblocks * pre.block_size // 4, offset=clog2.PREAMBLE_SIZE
    )
    walked = clog2._walk_blocks(rectypes[5::2], nblocks, pre.block_size // 8, 1 << 28)
    assert walked is not None
    at = clog2.PREAMBLE_SIZE + 8 * int(walked[1][0])  # block 0's ENDBLOCK
    data[at : at + 8] = np.asarray([123.0], ">f8").tobytes()
    odd = tmp_path / "odd.clog2"
    odd.write_bytes(bytes(data))
    unchecked = codec.encode(bytes(data), check=False)
    assert unchecked.mode != "general" and codec.checked(unchecked, bytes(data)).mode == "general"

    record = tmp_path / "odd.json"
    ship(site, keys, odd, "odd.clog2", "--record", str(record))
    assert (site.root / "odd.clog2").read_bytes() == bytes(data)
    assert json.loads(record.read_text())["ship"]["mode"] == "metadata"
    assert sorted(p.name for p in site.root.iterdir()) == [".paramedic-state", "odd.clog2"]
    proc = ship(site, keys, odd, "odd.clog2")  # run again: the file is there, shipped by the second job
    assert "already at" in proc.stderr

    # a damaged trace: refused in one line (exit 3) though the site's job was opened while encoding; the
    # job is cancelled, nothing is written
    broken = tmp_path / "broken.clog2"
    broken.write_bytes(bytes(data[: len(data) // 2]))
    proc = ship(site, keys, broken, "broken.clog2", check=False)
    assert proc.returncode == 3 and proc.stderr.startswith("paramedic: error:")
    assert len(proc.stderr.splitlines()) == 1
    assert sorted(p.name for p in site.root.iterdir()) == [".paramedic-state", "odd.clog2"]


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of random_comm over 24,000 steps (about 10 MB: three units of trace.units.UNIT_BYTES)."""
    return trace_random_comm(tmp_path_factory.mktemp("large") / "large.clog2", steps=24000)


def test_a_large_trace_ships_in_units_each_regenerated_as_it_arrives(
    tmp_path: Path, keys: Path, site, large: Path
) -> None:
    """A trace of more than two units ships as metadata unit by unit (each range of whole blocks its own
    chunk, encoded while the one before is sent) over real TLS; the site regenerates each range, checks it,
    and the whole file's SHA-256: its file is identical to the local trace. `auto` through the signed inbox
    (no link to measure: metadata) ships the same units, and leaves the inbox empty."""
    from paramedic.trace import units

    data = large.read_bytes()
    cut = units.cut(data)
    assert cut is not None and len(cut) == 3
    inbox, root = tmp_path / "inbox", tmp_path / "inbox-root"
    root.mkdir()
    server = StorageSite(None, root, keys / "server", tmp_path / "inbox.log", 1, inbox=inbox)
    server.start()
    try:
        for mode, url, at in (("metadata", site.url, site.root), ("auto", f"file://{inbox}", root)):
            record = tmp_path / f"{mode}.json"
            proc = paramedic("ship", str(large), "-out", f"{mode}.clog2", "--site", url, "--keys",
                             str(keys / "compute-a"), "--ship", mode, "--ship-timeout", "60",
                             "--record", str(record))  # fmt: skip
            assert "identical" in proc.stderr
            assert (at / f"{mode}.clog2").read_bytes() == data
            section = json.loads(record.read_text())["ship"]
            assert section["mode"] == "metadata" and section["codec"] == "trace-metadata"
            assert section["chunks"] == len(cut) and section["chunks_resent"] == 0
            assert section["shipped_payload_bytes"] * 8 < len(data)
        assert list(inbox.iterdir()) == []
    finally:
        server.stop()
    assert sorted(p.name for p in site.root.iterdir()) == [".paramedic-state", "metadata.clog2"]
    assert sorted(p.name for p in root.iterdir()) == [".paramedic-state", "auto.clog2"]


def test_a_hostile_unit_is_refused_and_nothing_is_written(keys: Path, site, large: Path) -> None:
    """Units whose metadata is sound but whose header puts a range's end record's time wrong (the unit's
    own digest is kept: the site's regenerated range then differs from it) and, in a second job, a unit sent
    for another unit's place: the site fails the job with one line, and writes nothing."""
    import hashlib

    from paramedic.ship.client import SiteAddress, TlsShipper
    from paramedic.ship.trace_codec import TraceMetadataCodec
    from paramedic.ship.transport import SiteError

    data = large.read_bytes()
    made = TraceMetadataCodec()
    cut = made.units(data)
    assert cut is not None
    chunks = [made.encode_unit(u) for u in cut]
    wrong_time = [dict(h) for h, _ in chunks]
    wrong_time[1] = {**wrong_time[1], "unit": {**wrong_time[1]["unit"], "end_time": "00" * 8}}
    misplaced = [dict(h) for h, _ in chunks]
    misplaced[1], misplaced[2] = {**misplaced[1], "offset": misplaced[2]["offset"]}, misplaced[1]
    for name, headers, refusal in (
        ("wrong-time.clog2", wrong_time, "range's SHA-256 differs"),
        ("misplaced.clog2", misplaced, "trace chunk"),
    ):
        shipper = TlsShipper(SiteAddress.parse(site.url), keys / "compute-a", "trace-metadata",
                             {"out": name}, b"", streams=2, timeout=20)  # fmt: skip
        shipper.start()
        for header, (_, payload) in zip(headers, chunks, strict=True):
            shipper.send(header, payload)
        with pytest.raises(SiteError, match=refusal) as failed:
            shipper.finish({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        assert "\n" not in str(failed.value)
        shipper.close()
        assert not (site.root / name).exists()
    assert [p.name for p in site.root.iterdir()] == [".paramedic-state"]
    assert "Traceback" not in site.log()
