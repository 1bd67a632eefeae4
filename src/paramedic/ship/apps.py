"""The applications ParaMEDIC serves, found by name: the framework's plugins (framework paper, section 4).

An application says what it produces, which codec carries its metadata, which `--ship` modes it offers
and what a storage site needs to regenerate its output. BLAST regenerates reports from the site's replica
of the database; traces regenerate from the metadata alone. The CLI, the storage site and the automatic
choice take their choices from here. A third application is one module with its codec
(`@register_codec`, imported by `ship.registry`) and one `register_app(Application(...))` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import paramedic.ship.registry  # noqa: F401  (every codec registered)
import paramedic.ship.trace_codec  # noqa: F401  (registers TraceMetadataCodec)
from paramedic.ship.codecs import CODECS


@dataclass(frozen=True)
class Application:
    name: str
    summary: str
    command: str  # the `paramedic` command that produces its output
    metadata_codec: str  # the codec (ship.codecs.CODECS) that ships it as metadata
    ship_modes: tuple[str, ...]  # what `--ship` may choose for it (`auto` chooses among them)
    needs_replica: bool  # a storage site must hold a replica of the database to regenerate it
    recognises: Callable[[bytes], bool] | None = None  # from a file's first KiB: is it this one's output?


APPS: dict[str, Application] = {}


def register_app(app: Application) -> Application:
    if app.metadata_codec not in CODECS:
        raise ValueError(f"application {app.name}: no codec {app.metadata_codec!r}")
    APPS[app.name] = app
    return app


def app_named(name: str) -> Application:
    if name not in APPS:
        raise KeyError(f"unknown application {name!r} (known: {', '.join(APPS)})")
    return APPS[name]


def codec_needs_replica(codec_name: str) -> bool:
    """Whether the storage site needs a database replica to decode this codec's payloads."""
    return any(a.needs_replica and a.metadata_codec == codec_name for a in APPS.values())


def app_for_file(head: bytes) -> Application | None:
    """The application whose output a file is, from its first bytes (None: not one we know)."""
    for app in APPS.values():
        if app.recognises is not None and app.recognises(head):
            return app
    return None


register_app(
    Application(
        name="blast",
        summary="BLAST+ reports, regenerated from the subject ids of each query's hits",
        command="search",
        metadata_codec="blast-metadata",
        ship_modes=("metadata", "compressed", "direct"),
        needs_replica=True,
    )
)
register_app(
    Application(
        name="trace",
        summary="MPI communication traces (CLOG2), regenerated from their first period and differences",
        command="trace",
        metadata_codec="trace-metadata",
        ship_modes=("metadata", "compressed", "direct"),
        needs_replica=False,
        recognises=lambda head: head.startswith(b"CLOG-02."),
    )
)
