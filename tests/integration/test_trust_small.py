"""Issue 23, item 18 (the small ones) at the storage site: a real in-process `SiteServer`, real TLS, real
files (the fixtures of test_site_faults)."""

from __future__ import annotations

import pytest

from paramedic.ship.client import SiteError
from paramedic.site.store import Quota
from tests.integration.test_site_faults import _ship_ranges, make_site, world  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def test_an_ended_job_leaves_no_decoded_markers_and_a_failed_one_no_empty_directories(make_site) -> None:  # noqa: F811
    site = make_site(quota=Quota(job_bytes=10_000))
    assert _ship_ranges(site, "kept/ok.bin", [1000, 1000])["bytes"] == 2000
    with pytest.raises(SiteError, match=r"per-job quota"):
        _ship_ranges(site, "made/for/it/big.bin", [3000, 3000])
    assert sorted(p.name for p in site.root.iterdir() if not p.name.startswith(".")) == ["kept"]
    state = site.root / ".paramedic-state"
    left = sorted(
        str(p.relative_to(state)) for p in state.rglob("*") if p.parent.name in ("decoded", "chunks")
    )
    assert left == []
    for job in site.server.store.jobs.values():
        assert not (job.directory / "decoded").exists()


def test_a_restart_failure_names_its_reason() -> None:
    from paramedic.site.store import _describe

    assert _describe(MemoryError()) == "MemoryError" and _describe(ValueError()) == "ValueError"
    assert _describe(ValueError("bad setup")) == "bad setup"
