"""A storage-site job's chunks, from their arrival to their output: each stored durably before it is
acknowledged, then decoded on the I/O workers (`site.fair`, the compute sites in turn) into the partial
output at its offsets ("ranges") or into regenerated pieces ("pieces"), each piece with its SHA-256.
An `ordered` codec's chunks are unpacked in index order as the gaps fill; their decoding, the expensive
part, still runs in parallel. Whatever goes wrong in a decode fails the job, never the site."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from paramedic.blast.forkserver import bounded
from paramedic.durable import write_durably
from paramedic.errors import ParamedicError
from paramedic.ship.codecs import Segment
from paramedic.ship.wire import ProtocolError, field_int, loads_json
from paramedic.site.admission import Admission
from paramedic.site.cleanup import Cleanup
from paramedic.site.fair import FairPool
from paramedic.site.job_files import drop_job_data, stored_chunk
from paramedic.site.jobs import CLEANUP_WAIT_SECONDS, MAX_CHUNKS, JobFailed, SiteJob, describe
from paramedic.site.replica import Replica
from paramedic.site.space import Space


class Decoding:
    """Storing chunks and decoding them on a pool of I/O workers."""

    def __init__(
        self,
        pool: FairPool,
        space: Space,
        replica: Replica | None,
        regen_seconds: float,
        admission: Admission,
        cleanup: Cleanup,
    ):
        self.pool = pool
        self.space = space
        self.replica = replica
        self.regen_seconds = regen_seconds
        self.admission = admission
        self.cleanup = cleanup

    def put_chunk(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> bool:
        """Store a chunk durably and queue its decoding; False when its checksum does not match."""
        index = field_int(header, "index", 0, MAX_CHUNKS - 1)
        if job.failure is not None:
            job.cleaned.wait(CLEANUP_WAIT_SECONDS)
            raise JobFailed(job.failure)
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            return False
        with job.lock:
            if index in job.acked:
                return True
        self.admission.reserve(job, len(payload))
        chunk_header = {k: v for k, v in header.items() if k not in ("op", "job")}
        try:
            with self.space.coming(len(payload)):
                write_durably(job.directory / "chunks" / f"{index}.bin", payload)
                write_durably(job.directory / "chunks" / f"{index}.json", json.dumps(chunk_header).encode())
        except (OSError, ProtocolError) as exc:
            if job.failure is None:  # e.g. the disk is full: the job ends here, its data goes
                self.cleanup.fail(job, f"storage site cannot store chunk {index}: {describe(exc)}")
            raise JobFailed(job.failure) from None
        if job.failure is not None:  # failed while this chunk was written: its cleanup may have missed it
            drop_job_data(job.directory)
            raise JobFailed(job.failure)
        with job.lock:
            job.acked.add(index)
        if job.codec.ordered:
            self.unpack_in_order(job)
        else:  # read back from disk when its decode starts: a chunk waiting for a worker holds no memory
            self.queue_decode(job, index, chunk_header, None, unpacked=False)
        return True

    def unpack_in_order(self, job: SiteJob) -> None:
        """Unpack an ordered codec's chunks from the first not yet unpacked up to the first gap."""
        with job.unpack_lock:
            while job.failure is None and job.unpacked in job.acked:
                index = job.unpacked
                chunks = job.directory / "chunks"
                try:
                    header = loads_json((chunks / f"{index}.json").read_bytes(), "chunk header")
                    data = job.codec.unpack(header, (chunks / f"{index}.bin").read_bytes(), job.context)
                except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
                    self.cleanup.fail(job, f"chunk {index}: {describe(exc)}")
                    return
                except Exception as exc:  # a bug in a codec: the job fails, the site goes on
                    self.cleanup.fail(job, f"chunk {index}: internal error while unpacking: {exc!r}")
                    return
                job.unpacked += 1
                if index not in job.decoded:
                    self.queue_decode(job, index, header, data, unpacked=True)

    def queue_decode(
        self, job: SiteJob, index: int, header: dict[str, Any], data: Any, *, unpacked: bool
    ) -> None:
        try:  # the compute sites take the I/O workers in turn (site.fair)
            self.pool.submit(job.peer, lambda: self._decode(job, index, header, data, unpacked))
        except RuntimeError:  # the store is closing
            return

    def _decode(self, job: SiteJob, index: int, header: dict[str, Any], data: Any, unpacked: bool) -> None:
        """On an I/O worker. Whatever goes wrong fails the job, in the log and for the client: nothing may
        vanish in the pool and leave the job pending."""
        if job.failure is not None:
            return
        with job.lock:
            job.running += 1
            job.decoding[index] = time.monotonic()
        start = time.perf_counter()
        try:
            # the regeneration's bound reaches the BLAST+ fork server too: one that stops answering is
            # killed at it, not waited for by this thread for good (housekeeping fails the job meanwhile)
            with bounded(self.regen_seconds):
                if data is None:
                    data = stored_chunk(job.directory, index, header)
                if not unpacked:
                    data = job.codec.unpack(header, data, job.context)
                segments = job.codec.decode(header, data, job.context)
            size = sum(len(seg.data) for seg in segments)
            self.admission.reserve(job, size)
            with job.io_lock, self.space.coming(size):
                if job.failure is not None:
                    return
                placed = _place(job, segments)
            marker: dict[str, Any] = {"segments": placed, "seconds": time.perf_counter() - start}
            write_durably(job.directory / "decoded" / f"{index}.json", json.dumps(marker).encode())
            if job.failure is not None:  # failed meanwhile (another chunk): its cleanup may have missed this
                drop_job_data(job.directory)
                return
            with job.lock:
                job.decoded[index] = marker
                job.decode_seconds += marker["seconds"]
        except JobFailed:
            pass  # already failed (a quota), and logged
        except (ProtocolError, ParamedicError, OSError, ValueError) as exc:
            try:  # a BLAST+ that crashed on a replica changed under it: say that, not "exit -11"
                if self.replica is not None:
                    self.replica.unchanged(job.replica_stamps)
            except JobFailed as changed:
                self.cleanup.fail(job, str(changed))
            else:
                self.cleanup.fail(job, f"chunk {index}: {describe(exc)}")
        except Exception as exc:  # a bug in a codec, or in BLAST+'s handling: fail, never hang
            self.cleanup.fail(job, f"chunk {index}: internal error while decoding: {exc!r}")
        finally:
            with job.lock:
                job.running -= 1
                job.decoding.pop(index, None)


def _place(job: SiteJob, segments: list[Segment]) -> list[list[int | str]]:
    """A decoded chunk's segments written durably (under the job's io_lock): "ranges" at their offsets in
    the partial output, "pieces" each in a file of its own. Returns where they went: [position, length]
    or [piece, length, sha256]."""
    placed: list[list[int | str]] = []
    if job.codec.layout == "ranges":
        assert job.location is not None
        with job.location.open_partial(create=True) as fd:
            for seg in segments:
                os.pwrite(fd, seg.data, seg.position)
                placed.append([seg.position, len(seg.data)])
            os.fsync(fd)
    else:
        for seg in segments:
            write_durably(job.directory / "pieces" / f"{seg.position}.out", seg.data)
            placed.append([seg.position, len(seg.data), hashlib.sha256(seg.data).hexdigest()])
    return placed
