"""The storage site's job store on real files: ordered unpacking, restart replay, expiry of idle jobs.

No BLAST here: the codecs are the generic `direct` one and a toy ordered codec (each payload is a number,
unpacked into the running sum of the job's payloads so far), registered for the test. The BLAST codec's
ordering is tested end to end in tests/integration/test_ship.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from paramedic.ship import codecs
from paramedic.ship.codecs import Codec, Segment
from paramedic.ship.wire import ProtocolError
from paramedic.site.store import JobFailed, JobStore, Replica


class RunningSumCodec(Codec):
    """Chunk i decodes to the sum of payloads 0..i: only right if unpacked in order, once each."""

    name = "test-running-sum"
    layout = "pieces"
    ordered = True

    def encode(self, unit: Any) -> tuple[dict[str, Any], bytes]:
        raise NotImplementedError

    def prepare(self, setup: dict[str, Any], payload: bytes, site: Any) -> SimpleNamespace:
        return SimpleNamespace(sum=0, pieces=range(setup["pieces"]))

    def unpack(self, header: dict[str, Any], payload: bytes, context: SimpleNamespace) -> int:
        if payload == b"bad":
            raise ProtocolError("bad payload")
        context.sum += int(payload)
        return context.sum

    def decode(self, header: dict[str, Any], unpacked: int, context: Any) -> list[Segment]:
        return [Segment(header["index"], f"{unpacked}\n".encode())]

    def assemble(self, pieces, context, out) -> None:
        for _, data in pieces:
            out.write(data)


@pytest.fixture
def toy_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codecs.CODECS, RunningSumCodec.name, RunningSumCodec)


def make_store(tmp_path: Path, **kwargs: Any) -> JobStore:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    replica = Replica(None, "manifest", tmp_path / "work")  # type: ignore[arg-type]  # unused by these codecs
    return JobStore(root, tmp_path / "state", replica, io_workers=2, log=lambda _: None, **kwargs)


def open_job(store: JobStore, job: str, codec: str, out: str, **setup: Any):
    header = {"job": job, "codec": codec, "setup": {"out": out, **setup}}
    return store.open("compute-a", header, b"")


def put(store: JobStore, job, index: int, payload: bytes, offset: int = 0) -> None:
    """Chunk `index`; for the direct codec, `payload` goes at byte `offset` of the output."""
    header = {"op": "chunk", "job": job.job_id, "index": index, "sha256": hashlib.sha256(payload).hexdigest()}
    if job.codec.name == "direct":
        header.update(offset=offset, length=len(payload))
    assert store.put_chunk(job, header, payload)


def finish(store: JobStore, job, chunks: int, **final: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while (done := store.finish(job, {"chunks": chunks, **final})) is None:
        assert time.monotonic() < deadline, "decoding never finished"
        time.sleep(0.01)
    return done


def wait_decoded(job, index: int) -> None:
    deadline = time.monotonic() + 20
    while index not in job.decoded:
        assert time.monotonic() < deadline, f"chunk {index} never decoded"
        time.sleep(0.01)


JOB_A, JOB_B, JOB_C = ("a" * 32, "b" * 32, "c" * 32)


def test_ordered_chunks_are_unpacked_in_index_order(tmp_path: Path, toy_codec: None) -> None:
    store = make_store(tmp_path)
    job = open_job(store, JOB_A, RunningSumCodec.name, "sums.txt", pieces=4)
    for index, payload in [(3, b"1000"), (1, b"10"), (0, b"1"), (2, b"100")]:
        put(store, job, index, payload)
    finish(store, job, 4)
    assert (store.root / "sums.txt").read_text() == "1\n11\n111\n1111\n"
    store.close()


def test_restart_replays_ordered_chunks_and_decodes_only_the_rest(tmp_path: Path, toy_codec: None) -> None:
    store = make_store(tmp_path)
    job = open_job(store, JOB_A, RunningSumCodec.name, "sums.txt", pieces=4)
    put(store, job, 0, b"1")
    put(store, job, 2, b"100")  # held: chunk 1 is missing
    wait_decoded(job, 0)
    assert 2 not in job.decoded
    store.close()

    again = make_store(tmp_path)  # the restart: chunk 0 is replayed (not decoded again), 2 waits for 1
    job = again.jobs[JOB_A]
    assert job.acked == {0, 2} and job.unpacked == 1
    put(again, job, 1, b"10")
    put(again, job, 3, b"1000")
    finish(again, job, 4)
    assert (again.root / "sums.txt").read_text() == "1\n11\n111\n1111\n"
    again.close()


def test_a_bad_ordered_chunk_fails_the_job_and_later_chunks_get_the_failure(
    tmp_path: Path, toy_codec: None
) -> None:
    store = make_store(tmp_path)
    job = open_job(store, JOB_A, RunningSumCodec.name, "sums.txt", pieces=2)
    put(store, job, 0, b"bad")
    assert job.failure == "chunk 0: bad payload"
    with pytest.raises(JobFailed, match="chunk 0: bad payload"):
        put(store, job, 1, b"1")
    with pytest.raises(JobFailed, match="chunk 0: bad payload"):
        store.finish(job, {"chunks": 2})
    assert not (store.root / "sums.txt").exists()
    assert not (job.directory / "chunks").exists() and not (job.directory / "setup.bin").exists()
    store.close()


def backdate(store: JobStore, job_id: str, seconds: float) -> None:
    store.jobs[job_id].touched -= seconds


def test_idle_jobs_expire_then_their_records_go(tmp_path: Path) -> None:
    store = make_store(tmp_path, expire_seconds=3600)
    idle = open_job(store, JOB_A, "direct", "idle.bin")
    put(store, idle, 0, b"abc")
    wait_decoded(idle, 0)
    partial = idle.partial
    assert partial.exists()
    done_job = open_job(store, JOB_B, "direct", "done.bin")
    put(store, done_job, 0, b"xyz")
    assert finish(store, done_job, 1, size=3)["bytes"] == 3

    backdate(store, JOB_A, 3599)
    open_job(store, JOB_C, "direct", "c.bin")  # an open is when the store looks for idle jobs
    assert store.jobs[JOB_A].failure is None  # not idle long enough yet

    backdate(store, JOB_A, 2)
    backdate(store, JOB_B, 3601)
    open_job(store, JOB_C, "direct", "c.bin")
    assert store.jobs[JOB_A].failure == "expired: no request for 1 hours"
    assert not partial.exists() and not (idle.directory / "chunks").exists()
    with pytest.raises(JobFailed, match="expired"):
        put(store, idle, 1, b"def", offset=3)
    assert JOB_B not in store.jobs and not done_job.directory.exists()  # the record went
    assert (store.root / "done.bin").read_bytes() == b"xyz"  # the output stays, of course

    backdate(store, JOB_A, 3601)  # the expired job's record goes one period after it failed
    open_job(store, JOB_C, "direct", "c.bin")
    assert JOB_A not in store.jobs and not idle.directory.exists()
    with pytest.raises(ProtocolError, match="unknown job"):
        store.get("compute-a", JOB_A)
    store.close()


def test_idle_time_survives_a_restart(tmp_path: Path) -> None:
    store = make_store(tmp_path, expire_seconds=3600)
    job = open_job(store, JOB_A, "direct", "idle.bin")
    put(store, job, 0, b"abc")
    wait_decoded(job, 0)  # or its decoding may touch the files after they are backdated
    store.close()
    old = time.time() - 7200
    for path in (job.directory, *job.directory.rglob("*")):
        os.utime(path, (old, old))

    again = make_store(tmp_path, expire_seconds=3600)
    assert again.jobs[JOB_A].failure is None
    open_job(again, JOB_B, "direct", "b.bin")
    assert again.jobs[JOB_A].failure == "expired: no request for 1 hours"
    record = json.loads((job.directory / "failed.json").read_text())
    assert record["message"].startswith("expired")
    again.close()


def test_done_jobs_keep_no_setup_or_chunks(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    job = store.open("compute-a", {"job": JOB_A, "codec": "direct", "setup": {"out": "x.bin"}}, b"setup")
    put(store, job, 0, b"abc")
    finish(store, job, 1, size=3)
    assert sorted(p.name for p in job.directory.iterdir()) == ["done.json", "job.json"]
    store.close()


class SlowSetupCodec(RunningSumCodec):
    """A setup that takes as long as the test wants to parse (a large one), or is refused at the end."""

    name = "test-slow-setup"
    parsing = None  # threading.Event: set while a setup is being parsed
    release = None  # threading.Event: the parse ends when set

    def prepare(self, setup: dict[str, Any], payload: bytes, site: Any) -> SimpleNamespace:
        type(self).parsing.set()
        assert type(self).release.wait(20)
        if payload == b"refuse":
            raise ProtocolError("setup: refused at the end of its parse")
        return super().prepare(setup, payload, site)


@pytest.mark.parametrize("outcome", ["opened", "refused"])
def test_a_setup_is_not_parsed_inside_the_stores_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """Issue 41, item 3: a setup parsed for 39 s inside the store's lock stalled every compute site. While
    one is parsed, another compute site opens, ships and finishes a job; the one being parsed holds its
    slot and its output path meanwhile, and gives them back if it is refused."""
    import threading

    monkeypatch.setitem(codecs.CODECS, SlowSetupCodec.name, SlowSetupCodec)
    monkeypatch.setattr(SlowSetupCodec, "parsing", threading.Event())
    monkeypatch.setattr(SlowSetupCodec, "release", threading.Event())
    store = make_store(tmp_path)
    header = {"job": JOB_A, "codec": SlowSetupCodec.name, "setup": {"out": "slow.txt", "pieces": 1}}
    payload = b"0" if outcome == "opened" else b"refuse"
    result: list[Any] = []

    def slow_open() -> None:
        try:
            result.append(store.open("compute-a", header, payload))
        except ProtocolError as exc:
            result.append(exc)

    opener = threading.Thread(target=slow_open)
    opener.start()
    assert SlowSetupCodec.parsing.wait(10)
    other = store.open("compute-b", {"job": JOB_B, "codec": "direct", "setup": {"out": "b.bin"}}, b"")
    put(store, other, 0, b"abc")
    assert finish(store, other, 1, size=3)["bytes"] == 3  # while the first setup is still being parsed
    with pytest.raises(ProtocolError, match="another job is writing it now"):
        store.open("compute-b", {"job": JOB_C, "codec": "direct", "setup": {"out": "slow.txt"}}, b"")
    SlowSetupCodec.release.set()
    opener.join(10)
    if outcome == "opened":
        assert result[0] is store.jobs[JOB_A] and store.targets["slow.txt"] == JOB_A
    else:
        assert "refused at the end of its parse" in str(result[0]) and JOB_A not in store.jobs
        assert "slow.txt" not in store.targets and not store.opening
        open_job(store, JOB_C, "direct", "slow.txt")  # the output path is free again
    store.close()
