"""A restricted search's subset (-seqidlist, -taxids, -taxidlist) as it crosses to the storage site.

The compute site resolves the restriction once (paramedic.db.subset) and ships what it resolved, not the
restriction: the site then needs none of the user's list files and none of its own taxonomy, and cannot
resolve it otherwise than the compute site did. On the wire it is the per-volume masks (one bit per
ordinal id, most significant first, each volume's padded to a byte), joined and zstd-compressed: a subset
of a few ids is a few kilobytes whatever the database's size (runs of zero bytes), every sequence a few
more; the sender's statistics ride along in the setup's header.

The storage site takes it as hostile: the compressed size is capped (MAX_SUBSET_BYTES) and must be what
the header declares; the frame must declare, before anything is inflated, exactly the size the site's own
replica gives the masks (its volumes' counts, rounded up to bytes), and inflate to that and no more; no
bit may be set past a volume's last id; and the statistics are counted again from the replica's own
volumes and must be the sender's. A problem is a ProtocolError: the job is refused in one line. The masks
a job keeps (one bit per sequence: 90 MB for nr) are a file in the job's scratch directory, mapped, not
memory held for the job's life.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any, cast

import zstandard

from paramedic.blast.run import Database, Subset
from paramedic.db.subset import subset_of_masks
from paramedic.ship.codecs import MAX_WINDOW_BYTES
from paramedic.ship.wire import ProtocolError, field_int

# The compressed masks, at most: a subset this large (half of a database of ~130 million sequences chosen
# at random) ships its output instead (paramedic.engine.job.job). The setup's payload, queries included, is
# bounded by the wire (MAX_PAYLOAD_BYTES, 32 MiB).
MAX_SUBSET_BYTES = 16 * 2**20
LEVEL = 9  # zstd level: nr-sized masks (~90 MB) compress in about a second
STATISTICS = ("nseq", "length", "shortest", "longest")


def encode_subset(subset: Subset) -> tuple[dict[str, int], bytes]:
    """The subset's header fields and its compressed masks."""
    raw = b"".join(subset.bits)
    blob = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(raw)
    header = {
        "bytes": len(blob),
        "nseq": subset.nseq,
        "length": subset.length,
        "shortest": subset.shortest,
        "longest": subset.longest,
    }
    return header, blob


def encoded_size(subset: Subset) -> int:
    """What the subset takes on the wire (compressed masks)."""
    return len(encode_subset(subset)[1])


def decode_subset(
    header: Any, payload: bytes, db: Database, spill: Path | None = None
) -> tuple[Subset, bytes]:
    """The subset a setup carries at the head of its payload, checked against the site's replica `db`,
    and the rest of the payload. ProtocolError for anything that is not a subset of `db`. With `spill`
    the masks are kept in that file (mode 0600) and mapped from it, not held in memory: a job lives for
    hours, and nr's masks are 90 MB."""
    if not isinstance(header, dict):
        raise ProtocolError("setup: subset: not an object")
    if not db.in_place:
        raise ProtocolError("setup: subset: the storage site's replica is not a database in place")
    size = _field(header, "bytes", MAX_SUBSET_BYTES)
    if size >= len(payload):
        raise ProtocolError("setup: subset: larger than the setup's payload")
    blob, rest = payload[:size], payload[size:]
    expected = sum((count + 7) // 8 for _, _, count, _ in db.spans)
    try:
        declared = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"setup: subset: not a zstd frame ({exc})") from None
    if declared != expected:  # checked before anything is inflated
        raise ProtocolError(
            f"setup: subset: declares {declared} bytes of masks, the replica's volumes take {expected}"
        )
    try:
        inflater = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompressobj()
        raw = inflater.decompress(blob)
        whole = inflater.eof and not inflater.unused_data
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"setup: subset: damaged ({exc})") from None
    if not whole or len(raw) != expected:
        raise ProtocolError("setup: subset: not one whole frame of the declared size")
    try:
        held: bytes | memoryview = raw if spill is None else _mapped(spill, raw)
    except OSError as exc:
        raise ProtocolError(
            f"setup: subset: the storage site cannot keep its masks ({exc.strerror})"
        ) from None
    del raw
    bits, at = [], 0
    for _, _, count, _ in db.spans:
        bits.append(held[at : at + (count + 7) // 8])
        at += (count + 7) // 8
    try:
        subset = subset_of_masks(db, cast("list[bytes]", bits))
    except ValueError as exc:
        raise ProtocolError(f"setup: subset: {exc}") from None
    if subset.nseq == 0:
        raise ProtocolError("setup: subset: selects no sequence")
    sent = [_field(header, name, 2**62) for name in STATISTICS]
    counted = [subset.nseq, subset.length, subset.shortest, subset.longest]
    if sent != counted:
        raise ProtocolError(
            "setup: subset: its statistics (sequences, letters, shortest, longest: "
            f"{', '.join(map(str, sent))}) are not the replica's ({', '.join(map(str, counted))})"
        )
    return subset, rest


def _field(header: dict[str, Any], name: str, high: int) -> int:
    try:
        return field_int(header, name, 1 if name == "bytes" else 0, high)
    except ProtocolError as exc:
        raise ProtocolError(f"setup: subset: {exc}") from None


def _mapped(path: Path, raw: bytes) -> memoryview:
    """`raw` written to a new private file at `path`, mapped read-only (the mapping keeps its pages when
    the job's directory is removed)."""

    def private(name: str, flags: int) -> int:
        return os.open(name, flags | os.O_CLOEXEC, 0o600)

    with open(path, "xb+", opener=private) as fh:  # read too: a mapping needs it
        fh.write(raw)
        fh.flush()
        return memoryview(mmap.mmap(fh.fileno(), len(raw), prot=mmap.PROT_READ))
