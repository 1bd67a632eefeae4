"""The small test databases and key sets, one way for every test: built once per session, copied to each
test that asks.

A fixture used to take N records of the real protein set, run `paramedic format` on them and often
`paramedic keys` too, each its own way (19 of them). `Databases.place` does the same once per distinct
database in the whole session and copies the result (a few MB, milliseconds) into the directory the test
owns, so that a test may damage its copy without touching another's. The input FASTA file keeps its name
(`db.fasta` by default, in the same directory as where `paramedic format` ran): BLAST+ prints the
database's title, which is that name, and the tests compare those reports with BLAST+'s own.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import paramedic, take_fasta

PROTEINS = "mmseqs2/DB.fasta"
QUERIES = "mmseqs2/QUERY.fasta"


class Databases:
    """Formatted databases and key sets, keyed by what they are made of, under one session directory."""

    def __init__(self, data_dir: Path, root: Path) -> None:
        self.data_dir = data_dir
        self.root = root
        self._built: dict[tuple[object, ...], Path] = {}

    def place(
        self,
        dest: Path,
        records: int | None,
        fragments: int,
        out: str = "db/uni",
        *,
        start: int = 0,
        fasta: str = "db.fasta",
        source: str = PROTEINS,
        dbtype: str = "prot",
        layout: str = "blastdb",
    ) -> Path:
        """Records [start, start+records) of `source` (all of it when None) as `dest/fasta`, formatted into
        `fragments` fragments at `dest/out` (relative to `dest`, as `paramedic format --out` took it);
        `layout`: "fragments" for the layout of earlier versions (a whole copy, fragment copies, a
        manifest), whose tests check that such databases keep working. Returns `dest/out`."""
        key = ("db", source, records, start, fragments, out, fasta, dbtype, layout)
        built = self._built.get(key)
        if built is None:
            built = self.root / f"db{len(self._built)}"
            built.mkdir()
            if records is None:
                shutil.copy(self.data_dir / source, built / fasta)
            else:
                take_fasta(self.data_dir / source, built / fasta, records, start)
            paramedic(
                "format", "--in", fasta, "--dbtype", dbtype, "--fragments", str(fragments), "--out", out,
                "--layout", layout, "--quiet", cwd=built,
            )  # fmt: skip
            self._built[key] = built
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, dest, dirs_exist_ok=True)
        return dest / out

    def queries(self, dest: Path, count: int, start: int = 0, source: str = QUERIES) -> Path:
        """Queries [start, start+count) of the real query set, as the file `dest`."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        return take_fasta(self.data_dir / source, dest, count, start)

    def keys(self, dest: Path, clients: Sequence[str] = ("compute-a",), server: str = "localhost") -> Path:
        """`paramedic keys --out dest` for `server` and `clients` (made once per set, then copied)."""
        key = ("keys", server, tuple(clients))
        built = self._built.get(key)
        if built is None:
            built = self.root / f"keys{len(self._built)}"
            args = [a for client in clients for a in ("--client", client)]
            paramedic("keys", "--out", str(built), "--server", server, *args)
            self._built[key] = built
        shutil.copytree(built, dest, dirs_exist_ok=True)
        return dest


@pytest.fixture(scope="session")
def databases(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Databases:
    """The session's databases and key sets (tests/support/databases.py)."""
    return Databases(data_dir, tmp_path_factory.mktemp("databases"))
