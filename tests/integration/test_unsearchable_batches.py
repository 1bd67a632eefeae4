"""A BLAST+ query batch made only of queries BLAST+ cannot search (issue 23): a protein of 60 X.

BLAST+ sets such a batch up, warns ("Could not calculate ungapped Karlin-Altschul parameters") and skips
its preliminary stage: there was no preliminary record for it, and `--strategy fragments` (and auto)
exited 5 "preliminary hit list could not be read". The shim now writes a skipped record
(blast/native/prelim.c), a piece aligning given lists passes over the batch, and reports written from
archives fall back to a search when BLAST+ warned of a query (XML and tabular-with-comments say it in
the report). Every strategy must give BLAST+'s own bytes: real BLAST+, real ranks, real files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import paramedic
from tests.support.databases import Databases

pytestmark = pytest.mark.integration

STRATEGIES = {
    "fragments-once": ("--strategy", "fragments", "--traceback", "once"),
    "fragments-per-fragment": ("--strategy", "fragments", "--traceback", "per-fragment"),
    "queries": ("--strategy", "queries"),
    "default": (),
}
ALL_X = "X" * 60


@pytest.fixture(scope="module")
def work(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("unsearchable")
    databases.place(base, 200, fragments=4)
    real = databases.queries(base / "real.fasta", 2).read_text()
    first, second = (">" + r.lstrip(">").rstrip() + "\n" for r in real.split("\n>"))
    (base / "alone.fasta").write_text(f">allx\n{ALL_X}\n")
    (base / "among.fasta").write_text(f"{first}>allx one\n{ALL_X}\n{second}>allx two\n{ALL_X}\n")
    return base


# "among": BATCH_SIZE=1 makes every query a BLAST+ batch of its own: an all-X batch between normal ones,
# followed by a batch of as many queries (a piece handed its lists must not give it the skipped one's).
CASES = {"alone": {}, "among": {"BATCH_SIZE": "1"}}


# The formats that differed (7: "# 0 hits found"; 5: the warning in the query's message) and the pairwise
# one, where the engine merges and writes; the queries strategy runs BLAST+ whole (one format suffices).
FORMATS = {"among": ("0", "5", "7"), "alone": ("7",)}
RUNS = [(c, s) for c in CASES for s in STRATEGIES if (c, s) != ("alone", "queries")]


@pytest.mark.parametrize(("case", "strategy"), RUNS, ids=[f"{c}-{s}" for c, s in RUNS])
def test_a_batch_blast_cannot_search_gives_blasts_bytes(work: Path, case: str, strategy: str) -> None:
    env = CASES[case]
    for outfmt in FORMATS[case] if strategy != "queries" else ("5",):
        blast = subprocess.run(
            ["blastp", "-query", f"{case}.fasta", "-db", "db/uni", "-outfmt", outfmt],
            cwd=work, capture_output=True, check=True, env={**os.environ, **env},
        )  # fmt: skip
        out = work / f"{case}-{strategy}-{outfmt}.out"
        record = out.with_suffix(".json")
        proc = paramedic("search", "blastp", "-query", f"{case}.fasta", "-db", "db/uni", "-outfmt", outfmt,
                         "-out", out.name, "--np", "2", "--quiet", "--record", record.name,
                         *STRATEGIES[strategy], cwd=work, env=env)  # fmt: skip
        assert out.read_bytes() == blast.stdout, f"outfmt {outfmt}: {proc.stderr}"
        warning = b"Could not calculate ungapped Karlin-Altschul parameters"  # on stderr as BLAST+ says it
        assert (warning in blast.stderr) == (warning.decode() in proc.stderr), (outfmt, proc.stderr)
        assert "Traceback" not in proc.stderr
        if case == "among" and strategy == "fragments-once":
            tasks = [rank["tasks"] for rank in json.loads(record.read_text())["ranks_stats"]]
            assert sum(t["injected"] for t in tasks) >= 1  # pieces were handed their lists


def test_the_shim_checks_ignore_a_users_batch_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-installation checks model BLAST+'s own batches; a BATCH_SIZE in the user's
    environment made the first search after an installation exit 5 (the shim refused), or cached "no"
    for pieces handed their lists. Run here uncached (a fresh cache directory)."""
    from paramedic.blast.prelim_check import _injection_check, check_shim
    from paramedic.blast.tools import require_tool

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("BATCH_SIZE", "1")
    check_shim.__wrapped__()
    assert _injection_check("blastp", require_tool("blastp"))
    assert _injection_check("blastn", require_tool("blastn"))
