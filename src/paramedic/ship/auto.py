"""`--ship auto`: measure the link, estimate the costs, choose by the ParaMEDIC rule.

Ship metadata when   D - x > B * (f(x) + g(x))
  D     bytes that shipping the output would send (here zstd-compressed: the best data-shipping mode)
  x     bytes of metadata
  B     link bandwidth, bytes per second (measured against the storage site)
  f(x)  seconds to make the metadata at the compute site
  g(x)  seconds to regenerate the output from the metadata at the storage site
i.e. when the transfer time saved exceeds the computation added. D, x, f and g are estimated from the
first regeneration piece, regenerated here once (its output is used if data shipping wins) and scaled
to the job's query count. Every input and the decision go into the run record.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import zstandard

from paramedic.ship.client import SiteError, open_tls, tls_refusal
from paramedic.ship.tls import client_context
from paramedic.ship.transport import Link, SiteAddress, scheme_named
from paramedic.ship.wire import ProtocolError, recv_frame, send_frame

PINGS = 5
SMALL_PROBE = 64 * 1024
LARGE_PROBE = 1024 * 1024
PROBE_SECONDS = 0.25  # what the second probe may take
QUICK_PROBE_SECONDS = 0.04

# The two `--ship` choices the ParaMEDIC rule weighs: the metadata (the storage site writes the output)
# against the output itself, compressed (the generic codec).
METADATA = "metadata"
COMPRESSED = "compressed"


def measure_link(
    address: SiteAddress, keys: Path | None, budget_bytes: int | None = None
) -> tuple[Link | None, str | None]:
    """Round trip and bandwidth to the site (None: its scheme has no link to measure, as an inbox), and
    the site's manifest checksum (None: it does not say), as the site's scheme plugin measures them."""
    return scheme_named(address.scheme, f"--site {address}").measure_link(address, keys, budget_bytes)


def measure_tls_link(
    address: SiteAddress, keys: Path, budget_bytes: int | None = None
) -> tuple[Link, str | None]:
    """Round trip and bandwidth to a `paramedic serve` site, and its replica's manifest checksum.
    `budget_bytes`: at most about this many bytes of probes (deciding about a small file, the probes
    must not cost what sending it would): below 4 small probes' worth, the first probe alone."""
    context = client_context(keys)
    try:
        with open_tls(address, context) as tls:
            hello = _ask(tls, {"op": "hello"})
            rtt = min(_timed(tls, b"") for _ in range(PINGS))
            probe = SMALL_PROBE
            seconds = _timed(tls, os.urandom(probe))
            bandwidth = probe / max(seconds - rtt, 1e-6)
            if seconds - rtt < PROBE_SECONDS and (budget_bytes is None or budget_bytes >= 4 * probe):
                # not a slow link: a second probe sized to take about PROBE_SECONDS (a 1 MiB one took 0.84 s
                # at 10 Mbit/s, more than the file it was deciding about). The first transfer of a connection
                # can stall on TCP's delayed acknowledgement (40 ms on Linux, whatever the rate), so the
                # small probe is timed again first; one that still crosses within QUICK_PROBE_SECONDS may
                # have gone in a burst, and the second probe is then LARGE_PROBE.
                seconds = min(seconds, _timed(tls, os.urandom(probe)))
                bandwidth = probe / max(seconds - rtt, 1e-6)
                quick = seconds - rtt < QUICK_PROBE_SECONDS
                large = (
                    LARGE_PROBE if quick else int(min(LARGE_PROBE, max(2 * probe, bandwidth * PROBE_SECONDS)))
                )
                if budget_bytes is not None:
                    large = max(min(large, budget_bytes - 2 * probe), 2 * probe)
                more = _timed(tls, os.urandom(large))
                bandwidth = large / max(more - rtt, 1e-6)
                if more > 2 * seconds:
                    # from the difference of the two when it is clear of the first's noise: it cancels what
                    # both pay alike (the request, a link's burst allowance)
                    bandwidth = (large - probe) / (more - seconds)
                probe = large
    except (OSError, ProtocolError) as exc:
        raise tls_refusal(address, exc) or SiteError(f"cannot measure the link to {address}: {exc}") from exc
    return Link(round(rtt, 6), round(bandwidth, 1), probe), hello.get("manifest_sha256")


def _ask(tls: Any, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
    send_frame(tls, header, payload)
    reply, _ = recv_frame(tls)
    if reply.get("op") == "error":
        raise SiteError(f"storage site: {reply.get('message')}")
    return reply


def _timed(tls: Any, payload: bytes) -> float:
    start = time.perf_counter()
    _ask(tls, {"op": "ping"}, payload)
    return time.perf_counter() - start


def ship_metadata(D: float, x: float, B: float, f: float, g: float) -> bool:  # noqa: N803 (the paper's names)
    """The ParaMEDIC rule: metadata wins when the transfer time saved exceeds the computation added."""
    return D - x > B * (f + g)


def decide(
    link: Link | None,
    n_queries: int,
    probe_queries: int,
    probe_output: bytes,
    probe_regen_seconds: float,
    probe_metadata_bytes: int,
    probe_encode_seconds: float,
    subset: tuple[int, float] = (0, 0.0),
) -> tuple[str, dict[str, Any]]:
    """The mode (METADATA or COMPRESSED) and the record of why. `subset`: the bytes and seconds of a
    restricted search's subset, which the metadata carries once (paramedic.ship.subset_wire)."""
    scale = n_queries / probe_queries
    start = time.perf_counter()
    compressed = len(zstandard.ZstdCompressor(level=3).compress(probe_output))
    compress_seconds = time.perf_counter() - start
    estimates = {
        "D_output_bytes": round(len(probe_output) * scale),
        "D_compressed_bytes": round(compressed * scale),
        "x_metadata_bytes": round(probe_metadata_bytes * scale) + subset[0],
        "f_seconds": round(probe_encode_seconds * scale + subset[1], 4),
        "g_seconds": round(probe_regen_seconds * scale, 3),
        "compress_seconds": round(compress_seconds * scale, 3),
        "probe_queries": probe_queries,
        "queries": n_queries,
    }
    if subset[0]:
        estimates["x_subset_bytes"] = subset[0]
    if link is None:
        mode = METADATA
        reason = (
            "the transport has no link to measure (e.g. a shared directory); metadata is the least to write"
        )
    else:
        D = estimates["D_compressed_bytes"]  # noqa: N806
        x = estimates["x_metadata_bytes"]
        B = link.bandwidth_bytes_per_second  # noqa: N806
        f, g = estimates["f_seconds"], estimates["g_seconds"]
        metadata = ship_metadata(D, x, B, f, g)
        mode = METADATA if metadata else COMPRESSED
        reason = (
            f"D - x = {D - x:,.0f} bytes {'>' if metadata else '<='} B * (f + g) = {B * (f + g):,.0f} bytes"
        )
    return mode, {"mode": mode, "reason": reason, "link": asdict(link) if link else None, **estimates}
