"""The storage site's answers to the wire protocol's requests about jobs, for every transport that carries
`ship.wire`'s frames: the TLS listener (`site.server`) and any receiver of a frames transport
(`site.receivers`: its `SiteContext.requests`).

One request in, one reply out: `hello` and `ping` (the link), `open` (a job, under the transport's owner
name), and the requests about an open job of that owner's (`chunk`, `keepalive`, `cancel`, `status`,
`finish`). A refusal is a reply too (`{"op": "error", "fatal": true}`, its message bounded so that it fits
in a frame); nothing a request holds escapes as an exception. The answers are the ones `ship.client`
expects, so a new frames transport reuses its request loop rather than writing the protocol again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from paramedic.ship.wire import MAX_PAYLOAD_BYTES, ProtocolError, field_int, field_str
from paramedic.site.jobs import JobFailed, SiteJob
from paramedic.site.store import JobStore

PROTOCOL_VERSION = 1
MAX_MESSAGE_CHARS = 1000

Reply = dict[str, Any] | tuple[dict[str, Any], bytes]  # a header, or a header and its payload
R = TypeVar("R", dict[str, Any], Reply)


class JobRequests:
    """The requests about jobs, answered from the site's one `JobStore`."""

    def __init__(self, store: JobStore, log: Callable[[str], None], manifest_sha256: str | None):
        self.store = store
        self.log = log
        self.manifest_sha256 = manifest_sha256  # the replica's, said in `hello` (None: no replica)

    def answer(self, owner: str, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        """The reply to one request of `owner` (e.g. "tls:<certificate CN>"), a refusal included."""
        return answer_or_refuse(owner, header, lambda: self.handle(owner, header, payload), self.log)

    def handle(self, owner: str, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        """A request to its handler: the link's own (hello, ping, open), or one about an open job of
        `owner`'s (`_JOB_OPS`), whose job is looked up first. Refusals raise (`answer` turns them into
        replies)."""
        op = header["op"]
        if op == "hello":
            return {
                "op": "hello",
                "version": PROTOCOL_VERSION,
                "manifest_sha256": self.manifest_sha256,
                "max_payload": MAX_PAYLOAD_BYTES,
            }
        if op == "ping":  # link measurement: the payload only tests the bandwidth
            return {"op": "pong", "bytes": len(payload)}
        if op == "open":
            return self._open(owner, header, payload)
        job = self.store.get(owner, field_str(header, "job", 32))
        handler = _JOB_OPS.get(op)
        if handler is None:  # not all of it: the reply must fit in a frame
            raise ProtocolError(f"unknown request {op[:40]!r}")
        return handler(self, job, header, payload)

    def _open(self, owner: str, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        has_setup = header.get("with_setup") is True
        job = self.store.open(owner, header, payload if has_setup else None)
        if job is None:
            return {"op": "need_setup"}
        if job.failure is not None:  # a stream reconnecting to a job that failed: it ends, with why
            raise JobFailed(job.failure)
        with job.lock:
            acked = sorted(job.acked)
        return {"op": "opened", "acked": acked}

    def _chunk(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        index = field_int(header, "index", 0)
        if self.store.put_chunk(job, header, payload):
            return {"op": "ack", "index": index}
        self.log(f"job {job.job_id}: chunk {index} failed its SHA-256 check; asking again")
        return {"op": "nack", "index": index, "reason": "sha256 mismatch"}

    def _keepalive(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        """A live compute site between chunks (the job does not expire)."""
        if job.failure is not None:  # said now, not at finish: the search stops at once
            raise JobFailed(job.failure)
        return {"op": "alive"}

    def _cancel(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        self.store.cancel(job)
        return {"op": "cancelled"}

    def _status(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        """A search run again after a kill: did its earlier job finish?"""
        done = job.settled()
        if done is not None:  # the output it published: the asking run checks it is its own
            return {"op": "done", **done, "out": job.setup_header.get("out")}
        return {"op": "status", "state": "failed" if job.failure is not None else "open"}

    def _finish(self, job: SiteJob, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        done = self.store.finish(job, header)
        if done is None:  # progress, so that a waiting client can tell a busy site from a stuck one
            return {"op": "pending", "decoded": len(job.decoded), "running": job.running}
        return {"op": "done", **done}


# The requests about an open job, each answered by the method of the same name
_JOB_OPS: dict[str, Callable[[JobRequests, SiteJob, dict[str, Any], bytes], dict[str, Any]]] = {
    "chunk": JobRequests._chunk,
    "keepalive": JobRequests._keepalive,
    "cancel": JobRequests._cancel,
    "status": JobRequests._status,
    "finish": JobRequests._finish,
}


def answer_or_refuse(
    peer: str, header: dict[str, Any], handle: Callable[[], R], log: Callable[[str], None]
) -> R | dict[str, Any]:
    """`handle()`'s reply to one request of `peer`, or a refusal whose message is bounded (it may quote
    the request, and a reply must fit in a frame: 20,000 non-ASCII characters are 120 KB as JSON)."""
    op = str(header.get("op"))[:40]
    try:
        return handle()
    except JobFailed as exc:
        return {"op": "error", "message": bounded(exc), "fatal": True}
    except ProtocolError as exc:
        log(f"{peer}: refused request {op!r}: {bounded(exc)}")
        return {"op": "error", "message": bounded(exc), "fatal": True}
    except OSError as exc:  # e.g. the disk is full: the job cannot go on here
        log(f"{peer}: request {op!r} failed: {bounded(exc)}")
        return {"op": "error", "message": f"storage site I/O error: {bounded(exc)}", "fatal": True}
    except Exception as exc:  # a bug: one line in the log, a clear error for the client
        log(f"{peer}: request {op!r} failed: internal error: {bounded(repr(exc))}")
        return {"op": "error", "message": "storage site internal error", "fatal": True}


def bounded(message: object) -> str:
    text = str(message)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."
