"""The applications ParaMEDIC serves, found by name: the framework's plugins (framework paper, section 4).

An application says what it produces, which codec carries its metadata, which `--ship` modes it offers
and what a storage site needs to regenerate its output. BLAST regenerates reports from the site's replica
of the database; traces regenerate from the metadata alone. The CLI (`search --ship` and `paramedic ship`
alike), the storage site and the automatic choice take their choices from here: `Application.codec_for`
is the one place a `--ship` mode becomes a codec ("metadata": the application's own codec; the others:
the generic codecs of ship.codecs, which know nothing of the application). A third application is one
module with its codec (`@register_codec`), imported below, and one `register_app(Application(...))`
(docs/CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import paramedic.ship.blast_codec  # noqa: F401  (registers BlastMetadataCodec)
import paramedic.ship.trace_codec  # noqa: F401  (registers TraceMetadataCodec)
from paramedic.ship.codecs import CODECS, Codec
from paramedic.ship.plugins import Registry

METADATA = "metadata"  # the `--ship` mode of an application's own codec


@dataclass(frozen=True)
class Application:
    name: str
    summary: str
    command: str  # the `paramedic` command that produces its output
    metadata_codec: str  # the codec (ship.codecs.CODECS) that ships it as metadata
    ship_modes: tuple[str, ...]  # what `--ship` may choose for it (`auto` chooses among them)
    needs_replica: bool  # a storage site must hold a replica of the database to regenerate it
    recognises: Callable[[bytes], bool] | None = None  # from a file's first KiB: is it this one's output?

    def codec_class(self, mode: str) -> type[Codec]:
        """The codec that carries this application's output for the `--ship` choice `mode`."""
        if mode not in self.ship_modes:
            raise ValueError(f"{self.name} does not ship {mode!r} (it ships {', '.join(self.ship_modes)})")
        if mode == METADATA:
            return CODECS[self.metadata_codec]
        for cls in CODECS.values():
            if cls.ship_mode == mode:  # the generic codecs (ship.codecs): the output itself
                return cls
        raise ValueError(f"no codec ships {mode!r}")

    def codec_for(self, mode: str) -> Codec:
        """A new codec for the `--ship` choice `mode`."""
        return self.codec_class(mode)()


APPS: Registry[Application] = Registry("application")


def register_app(app: Application) -> Application:
    if app.metadata_codec not in CODECS:
        raise ValueError(f"application {app.name}: no codec {app.metadata_codec!r}")
    for mode in app.ship_modes:  # every mode it offers has a codec: refused at import, not at a user's run
        app.codec_class(mode)
    return APPS.add(app.name, app)


def app_named(name: str) -> Application:
    return APPS.named(name)


def codec_needs_replica(codec_name: str) -> bool:
    """Whether the storage site needs a database replica to decode this codec's payloads."""
    return any(a.needs_replica and a.metadata_codec == codec_name for a in APPS.values())


def app_for_file(head: bytes) -> Application | None:
    """The application whose output a file is, from its first bytes (None: not one we know)."""
    for app in APPS.values():
        if app.recognises is not None and app.recognises(head):
            return app
    return None


# `paramedic search --ship`: BLAST (its choices in this order in the CLI's help and messages)
SEARCH = register_app(
    Application(
        name="blast",
        summary="BLAST+ reports, regenerated from the subject ids of each query's hits",
        command="search",
        metadata_codec="blast-metadata",
        ship_modes=("direct", "compressed", METADATA),
        needs_replica=True,
    )
)
register_app(
    Application(
        name="trace",
        summary="MPI communication traces (CLOG2), regenerated from their first period and differences",
        command="trace",
        metadata_codec="trace-metadata",
        ship_modes=(METADATA, "compressed", "direct"),
        needs_replica=False,
        recognises=lambda head: head.startswith(b"CLOG-02."),
    )
)
