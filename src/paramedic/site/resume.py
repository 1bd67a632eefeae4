"""A restarted storage site takes up the jobs it held from their directories in the state: a done or failed
job kept as it is, an unfinished one prepared again (the replica digested again, its pieces regenerated
again if the replica was written while the site was down) and its stored chunks decoded; a directory that
cannot be read is left on disk, and said."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paramedic.db.manifest import Stamp
from paramedic.errors import ParamedicError
from paramedic.ship.registry import make_codec
from paramedic.ship.wire import ProtocolError, loads_json
from paramedic.site.admission import output_location, safe_output_path
from paramedic.site.cleanup import Cleanup
from paramedic.site.decoding import Decoding
from paramedic.site.job_files import forget_pieces, same_replica, write_replica_stamps
from paramedic.site.jobs import JOB_ID, JobTable, SiteJob, describe
from paramedic.site.replica import Replica, prepare
from paramedic.site.space import Published


class Resume:
    """The jobs of a state directory put back into a table."""

    def __init__(
        self,
        root: Path,
        root_fd: int,
        state: Path,
        replica: Replica | None,
        published: Published,
        table: JobTable,
        cleanup: Cleanup,
        decoding: Decoding,
        log: Callable[[str], Any],
    ):
        self.root = root
        self.root_fd = root_fd
        self.state = state
        self.replica = replica
        self.published = published
        self.table = table
        self.cleanup = cleanup
        self.decoding = decoding
        self.log = log

    def from_disk(self) -> None:
        """The jobs a stopped site held, taken up again from their directories in the state."""
        replica: list[tuple[Stamp, ...] | None | str] = []  # digested once, for every job resumed

        def replica_now() -> tuple[Stamp, ...] | None:
            """The replica's stamps, digested now (it may have changed while the site was down: the
            digest at a job's open does not cover a restart); ProtocolError when it differs."""
            if not replica:
                try:
                    assert self.replica is not None
                    replica.append(self.replica.verify())
                except ProtocolError as exc:
                    replica.append(str(exc))
            if isinstance(replica[0], str):
                raise ProtocolError(replica[0])
            return replica[0]

        for directory in sorted(self.state.iterdir()):
            if JOB_ID.match(directory.name) and (directory / "job.json").exists():
                self._resume(directory, replica_now)

    def _resume(self, directory: Path, replica_now: Callable[[], tuple[Stamp, ...] | None]) -> None:
        """One job's directory: its record read back (or the job left on disk, said), a failed or done job
        kept as it is, an unfinished one prepared again and its stored chunks decoded."""
        try:
            record = loads_json((directory / "job.json").read_bytes(), "job.json")
            codec = make_codec(record["codec"])
            setup = record["setup"]
            relative = setup["out"]
            out = safe_output_path(self.root, relative)
            peer = str(record["peer"])
            if ":" not in peer and peer != "inbox":  # recorded before owners had a transport prefix
                peer = f"tls:{peer}"
        except (ProtocolError, ParamedicError, OSError, ValueError, KeyError, TypeError) as exc:
            self.log(f"job {directory.name}: cannot resume ({describe(exc)}); left on disk")
            return
        location = output_location(self.root_fd, relative, directory.name)
        job = SiteJob(directory.name, directory, peer, out, codec, None, setup, location)
        job.touched = max(p.stat().st_mtime for p in (directory, *directory.rglob("*")))
        self.table.jobs[job.job_id] = job
        failed = directory / "failed.json"
        if failed.exists():
            try:
                job.failure = str(loads_json(failed.read_bytes(), "failed.json").get("message", "failed"))
            except (ProtocolError, OSError, AttributeError):
                job.failure = "failed"
            return
        if job.done() is not None:
            if relative not in self.published.outputs.get(peer, {}):  # (done under an older site)
                self.published.add(peer, relative)
            return
        try:
            job.context = prepare(
                self.replica, codec, setup, (directory / "setup.bin").read_bytes(), job.job_id
            )
            if codec.layout == "pieces" and self.replica is not None:
                job.replica_stamps = replica_now()
                if job.replica_stamps is not None and not same_replica(directory, job.replica_stamps):
                    forget_pieces(directory)  # regenerated from bytes written since: again, from now
                    write_replica_stamps(directory, job.replica_stamps)
                    self.log(
                        f"job {job.job_id}: the replica was written since its pieces were regenerated; "
                        "they are regenerated again"
                    )
        except (ProtocolError, ParamedicError, OSError, ValueError, MemoryError) as exc:
            self.cleanup.fail(job, f"cannot resume after a restart: {describe(exc)}")
            return
        with self.table.targets_lock:
            holder = self.table.targets.setdefault(relative, job.job_id)
        if holder != job.job_id:
            self.cleanup.fail(job, f"output path {relative!r}: another job is writing it now")
            return
        self._reload_chunks(job)

    def _reload_chunks(self, job: SiteJob) -> None:
        """A resumed job's stored chunks: those decoded counted, the others decoded again."""
        directory = job.directory
        for path in (directory / "decoded").glob("*.json"):
            job.decoded[int(path.stem)] = json.loads(path.read_text())
        for path in (directory / "chunks").glob("*.json"):
            job.acked.add(int(path.stem))
        job.stored_bytes = sum(
            p.stat().st_size for sub in ("chunks", "pieces") for p in (directory / sub).glob("*")
        )
        if job.codec.layout == "ranges":
            job.stored_bytes += sum(seg[1] for m in job.decoded.values() for seg in m["segments"])
        pending = len(job.acked - job.decoded.keys())
        if job.codec.ordered:
            self.decoding.unpack_in_order(job)  # replays every stored chunk, decodes the undecoded ones
        else:
            for index in sorted(job.acked - job.decoded.keys()):
                header = json.loads((directory / "chunks" / f"{index}.json").read_text())
                self.decoding.queue_decode(job, index, header, None, unpacked=False)
        self.log(f"job {job.job_id}: resumed from disk, {len(job.acked)} chunks held, {pending} to decode")
