"""A receiver added by following docs/CONTRIBUTING.md "Add a transport" (its storage-site module): `--memory
NAME` records what `paramedic serve` gave it in `STARTED[NAME]` and whether it was stopped. A fake for unit
tests of the seam (`site.receivers`); a real receiver takes jobs into the site's store (`site.inbox`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paramedic.site.receivers import Receiver, SiteContext, register_receiver

STARTED: dict[str, dict[str, Any]] = {}  # name -> {"site": SiteContext, "stopped": bool}
FAIL = "fail"  # the name whose start fails


class MemoryListener:
    def __init__(self, name: str, site: SiteContext):
        if name == FAIL:
            raise OSError(f"memory receiver {name}: cannot start")
        self.record: dict[str, Any] = {"site": site, "stopped": False}
        STARTED[name] = self.record

    def stop(self) -> None:
        self.record["stopped"] = True


def _describe(name: str, keys: Path | None) -> str:
    return f"memory receiver {name}"


MEMORY = register_receiver(
    Receiver(
        name="memory",
        metavar="NAME",
        help="take jobs from the memory transport NAME (a test's)",
        parse=str,
        describe=_describe,
        start=MemoryListener,
    )
)
