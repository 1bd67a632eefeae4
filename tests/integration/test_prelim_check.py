"""The start-up check that the preliminary-list shim reads this BLAST+ (paramedic.blast.prelim_check):
it passes on the installed BLAST+ 2.12, is cached, and refuses with one clear error when the shim's
records are not what BLAST+ 2.12 gives (here: a shim that writes nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramedic.blast import prelim, prelim_check
from paramedic.blast.options import BlastOptions
from paramedic.errors import BlastError

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    prelim.shim.cache_clear()
    prelim_check.check_shim.cache_clear()
    yield
    prelim.shim.cache_clear()
    prelim_check.check_shim.cache_clear()


def test_the_installed_blast_passes_and_is_cached(data_dir: Path, tmp_path: Path) -> None:
    prelim_check.check_shim()
    assert [p.read_bytes() for p in (tmp_path / "cache" / "paramedic" / "prelim-check").iterdir()] == [
        b"ok\n"
    ]


def test_a_shim_that_does_not_read_blast_is_refused(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = prelim.environment()
    monkeypatch.setattr(prelim_check, "environment", lambda: {**real, "PARAMEDIC_PRELIM": "0"})
    with pytest.raises(BlastError, match="use --strategy queries"):
        prelim_check.check_shim()
    assert not (tmp_path / "cache" / "paramedic" / "prelim-check").exists()


@pytest.mark.parametrize("program", ["blastp", "blastn"])
def test_aligning_given_lists_works_on_the_installed_blast_and_is_cached(
    data_dir: Path, tmp_path: Path, program: str
) -> None:
    """Each of the two checks (blastn's batches are forced by BATCH_SIZE, its HSPs have two contexts per
    query; the other programs' are BLAST+'s own) passes on the installed BLAST+ and is cached apart."""
    prelim_check.injection_works.cache_clear()
    assert prelim_check.injection_works(program)
    assert [
        p.read_bytes() for p in (tmp_path / "cache" / "paramedic" / f"inject-check-{program}").iterdir()
    ] == [b"yes\n"]
    prelim_check.injection_works.cache_clear()


@pytest.mark.parametrize("program", ["blastp", "blastn"])
def test_a_shim_that_does_not_align_given_lists_is_not_used(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """Here the search meant to align the given lists scans instead (the mode is off): the check sees no
    batch aligned as given, and pieces will scan for their lists (exact, slower), not trust the shim."""
    real = prelim.inject_environment

    def off(tool: str, options: BlastOptions) -> dict[str, str]:
        return {**real(tool, options), "PARAMEDIC_PRELIM": "0"}

    monkeypatch.setattr(prelim_check, "inject_environment", off)
    prelim_check.injection_works.cache_clear()
    assert not prelim_check.injection_works(program)
    prelim_check.injection_works.cache_clear()
