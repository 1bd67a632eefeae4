"""The conformance matrix's slice (tests/conformance): every program's defaults through the engine,
a capped blastn at 16 fragments, tblastn's ties in a text report, -culling_limit refused by the engine
and honoured by the default, and the saturating protein set. `make conformance` runs the whole matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from paramedic.blast.prelim import INJECTABLE
from tests.conformance.__main__ import build_sets
from tests.conformance.matrix import Cell, Judge, cells

pytestmark = pytest.mark.integration

SLICE = list(cells(full=False))


@pytest.fixture(scope="module")
def judge(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Judge:
    root = tmp_path_factory.mktemp("conformance")
    (root / "runs").mkdir()
    return Judge(build_sets(root, full=False), root / "runs")


@pytest.mark.parametrize(
    "cell",
    SLICE,
    ids=lambda c: (
        f"{c.program}-{c.label()}-{c.outfmt}-x{c.fragments}-{c.strategy}-{c.traceback}-{c.runner}"
        + ("-grouped" if c.groups == "auto" else "")
    ),
)
def test_cell(judge: Judge, cell: Cell) -> None:
    verdict = judge.judge(cell)
    expected = "refused" if "-culling_limit" in cell.options and cell.strategy == "fragments" else "identical"
    assert verdict.result == expected, verdict.detail
    if cell.traceback == "once" and cell.program in INJECTABLE:
        # the pieces aligned the fragment searches' lists as given (no scan): the path this cell tests
        assert "piece batches aligned as given" in verdict.detail, verdict.detail
    if cell.groups == "auto" and cell.strategy == "fragments":
        # consecutive fragments were searched together: fewer searches per batch than fragments
        assert f"{cell.fragments} fragments in " in verdict.detail, verdict.detail
