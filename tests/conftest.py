"""Shared fixtures: the real data sets (fetched by scripts/fetch-data.sh) and helpers to run the CLI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# Property tests draw the same examples in CI on every run (CI=1): a red CI names a bug, not a bad draw.
# Locally they draw afresh, to keep looking.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# The shared ground of every test (tests/support): the `databases` fixture.
pytest_plugins = ["tests.support.databases"]

DATA = Path(os.environ.get("PARAMEDIC_DATA", Path.home() / ".cache/paramedic/data"))
BIN = Path(sys.executable).parent
# The footer line of the text reports (outfmt 0-4), indented by four spaces: "    Posted date:  Nov 21, ..."
POSTED_DATE = re.compile(rb"^( *)Posted date: .*$", re.M)
TEXT_REPORTS = frozenset("01234")


def require_real_tools() -> None:
    """In CI, missing BLAST+ or data is a failure (the Makefile installs them); locally a skip."""
    missing = [t for t in ("blastp", "blastn", "makeblastdb") if shutil.which(t) is None]
    if not (DATA / ".complete").exists():
        missing.append(f"data in {DATA} (run `make data`)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")


def _variable(name: str, path: Path) -> Iterator[Path]:
    """`name` set to `path` for the session, and put back after."""
    old = os.environ.get(name)
    os.environ[name] = str(path)
    yield path
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture(scope="session", autouse=True)
def digest_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Remembered database digests (paramedic.db.trust) go to a store of the tests' own."""
    yield from _variable("PARAMEDIC_DIGESTS", tmp_path_factory.mktemp("digests"))


@pytest.fixture(scope="session", autouse=True)
def metadata_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Metadata files are sealed with the user's own key (paramedic.engine.rank.metadata): the tests use a
    key of their own, never the one in ~/.config."""
    yield from _variable("PARAMEDIC_METADATA_KEY", tmp_path_factory.mktemp("metadata-key") / "metadata.key")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    require_real_tools()
    return DATA


def paramedic(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed `paramedic` command, as a user would."""
    proc = subprocess.run(
        [str(BIN / "paramedic"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=None if env is None else {**os.environ, **env},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"paramedic {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def blast(program: str, *args: str, cwd: Path) -> None:
    subprocess.run([program, *args], cwd=cwd, check=True, capture_output=True, timeout=900)


def take_fasta(source: Path, dest: Path, count: int, start: int = 0) -> Path:
    """Write records [start, start+count) of a FASTA file."""
    records = source.read_text().split("\n>")
    chosen = records[start : start + count]
    text = "\n>".join(chosen)
    if not text.startswith(">"):
        text = ">" + text
    dest.write_text(text.rstrip("\n") + "\n")
    return dest


def without_posted_date(report: bytes, outfmt: str) -> bytes:
    """The text reports (outfmt 0-4) print the database's build time to the minute; two independently
    built databases differ there only. Other formats are returned as they are. A text report without the
    line is refused, so that a normaliser that matches nothing cannot hide behind a lucky minute."""
    if outfmt.split()[0] not in TEXT_REPORTS:
        return report
    normalised, found = POSTED_DATE.subn(rb"\1Posted date: <build time>", report)
    assert found, f"outfmt {outfmt}: no 'Posted date' line in a text report"
    return normalised
