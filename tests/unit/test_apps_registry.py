"""The application plugins come from one registry (ship.apps) built on the one registry pattern
(ship.plugins) that codecs and transports use too: `search --ship` and `paramedic ship` map a mode to a
codec in one place, importing ship.registry registers every codec (the trace codec was registered only by
whoever imported ship.apps), and a third application is one registration."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from paramedic.ship import apps, registry
from paramedic.ship.codecs import CODECS, CompressedCodec, DirectCodec
from paramedic.ship.plugins import Registry
from paramedic.ship.transport import PLUGINS, SCHEMES
from paramedic.site.receivers import RECEIVERS


def test_importing_the_registry_registers_every_codec_and_application() -> None:
    code = (
        "import paramedic.ship.registry as r, paramedic.ship.codecs as c;"
        "name = r.make_codec('trace-metadata').name;"
        "import paramedic.ship.apps as a;"
        "print(sorted(c.CODECS), sorted(a.APPS), name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['blast-metadata',", "'compressed',", "'direct',", "'trace-metadata']",
                           "['blast',", "'trace']", "trace-metadata"]  # fmt: skip


def test_search_and_file_shipping_take_their_modes_and_codecs_from_the_applications() -> None:
    assert registry.ship_modes() == apps.app_named("blast").ship_modes == ("direct", "compressed", "metadata")
    assert registry.codec_for_mode("metadata").name == "blast-metadata"
    assert registry.ships_pieces("metadata") and not registry.ships_pieces("compressed")
    assert not registry.ships_pieces("auto")
    trace = apps.app_named("trace")
    assert trace.codec_for("metadata").name == "trace-metadata"
    assert isinstance(trace.codec_for("compressed"), CompressedCodec)
    assert isinstance(trace.codec_for("direct"), DirectCodec)
    with pytest.raises(ValueError, match="does not ship"):
        trace.codec_for("auto")


def test_the_plugin_kinds_share_one_registry() -> None:
    assert all(isinstance(r, Registry) for r in (CODECS, apps.APPS, SCHEMES, RECEIVERS))
    for module in PLUGINS.values():  # schemes register when first needed (a search ships nothing)
        importlib.import_module(module)
    assert set(PLUGINS) >= {"tls", "grpcs", "file"} and set(PLUGINS) <= set(SCHEMES)
    with pytest.raises(ValueError, match="two codecs named 'direct'"):
        CODECS.add("direct", CompressedCodec)
    with pytest.raises(KeyError, match="unknown application 'nope' \\(known: blast, trace\\)"):
        apps.app_named("nope")


def test_a_third_application_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apps, "APPS", Registry[apps.Application]("application"))
    app = apps.register_app(
        apps.Application(
            name="toy", summary="toy output", command="toy", metadata_codec="compressed",
            ship_modes=("metadata", "direct"), needs_replica=False, recognises=lambda h: h.startswith(b"TOY"),
        )
    )  # fmt: skip
    assert apps.app_for_file(b"TOY 1\n") is app and apps.app_for_file(b"CLOG-02.") is None
    assert app.codec_for("metadata").name == "compressed"
    with pytest.raises(ValueError, match="no codec 'missing'"):
        apps.register_app(
            apps.Application(
                "bad", "", "bad", metadata_codec="missing", ship_modes=("metadata",), needs_replica=False
            )
        )
    with pytest.raises(ValueError, match="no codec ships 'carrier-pigeon'"):
        apps.register_app(
            apps.Application(
                "odd", "", "odd", "compressed", ship_modes=("carrier-pigeon",), needs_replica=False
            )
        )
