"""An install outside the tree (issue 45, item 1): the sdist and the wheel built from it carry the 14 C
sources of blast/native and trace/native, and an installed paramedic compiles them at first use into the
user's cache (never into site-packages), so that it runs a `--strategy fragments` search identical to
BLAST+ and a traced MPI run. Before, the wheel held no C source: the installed paramedic refused the
fragments strategy ("no C compiler to build the preliminary-list shim") and could not build the tracer.

How the fresh environment gets its dependencies: `python -m venv --without-pip` outside the tree, and a
.pth file that appends the project's .venv site-packages to its path, for the dependencies only. The
alternative, `pip install WHEEL` with its dependencies from PyPI, downloads and unpacks about 100 MB
(numpy, plotly, cryptography, mpi4py and the mpich wheel) on every run, needs the network beyond what
`make setup` needs, and took minutes. A path in a .pth file is not a site directory, so the .pth files
in that directory are not read: the .venv's editable install (`__editable__.paramedic-0.1.0.pth`, which
puts the clone's src/ on the path) does not reach the fresh environment, and the paramedic it imports is
the wheel's (checked). The wheel is installed with pip's `--python`, as `pip install` in that environment
would, console script included. The mpich wheel's mpiexec is a dependency's program: it is on PATH after
the fresh environment's bin/, as a `module load` would put an MPI there.

The builds (sdist, then the wheel from it) are isolated as any pip build is: they fetch setuptools as
`make setup` does. The compiled shims go to a cache of the test's own (XDG_CACHE_HOME), so they are built
from the installed sources, not found from an earlier build of the clone's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from paramedic.trace import clog2
from tests.conftest import BIN, blast
from tests.integration.test_trace import OMPI_ENV, RANDOM_COMM, need
from tests.support.databases import Databases

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NATIVE = sorted(
    p.relative_to(ROOT / "src").as_posix()
    for d in ("blast", "trace")
    for p in (ROOT / "src/paramedic" / d / "native").iterdir()
    if p.suffix in (".c", ".h")
)
SOURCES = ("pyproject.toml", "LICENSE")


def copy_tree(dest: Path) -> Path:
    """The files a build reads, copied: a build in the clone would leave build/ and egg-info in it."""
    dest.mkdir(parents=True)
    for name in SOURCES:
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    )
    return dest


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def build(tree: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (`pip wheel SDIST --no-deps`), as pip does from PyPI."""
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(tree)])
    (sdist,) = dist.glob("paramedic-*.tar.gz")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(sdist)])
    (wheel,) = dist.glob("paramedic-*.whl")
    return sdist, wheel


def members(archive: Path) -> set[str]:
    """The archive's paths below src/ (an sdist's) or its root (a wheel's)."""
    import tarfile
    import zipfile

    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            return set(zf.namelist())
    with tarfile.open(archive) as tf:
        return {n.split("/src/", 1)[1] for n in tf.getnames() if "/src/" in n}


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A virtual environment outside the tree with the wheel installed and the .venv's dependencies."""
    run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    purelib = Path(
        run(
            [str(where / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    (purelib / "paramedic-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(where / "bin/python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    return where


def environment(venv: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["XDG_CACHE_HOME"] = str(cache)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("install")
    sdist, wheel = build(copy_tree(base / "tree"), base / "dist")
    assert len(NATIVE) >= 14  # forkserver.c, prelim.c and the tracer's 12 files, at least
    for archive in (sdist, wheel):
        missing = [n for n in NATIVE if n not in members(archive)]
        assert not missing, f"{archive.name} lacks {missing}"
    assert "paramedic-0.1.0.dist-info/licenses/LICENSE" in members(wheel)
    venv = fresh_venv(base / "venv", wheel)
    return venv, environment(venv, base / "cache")


def test_the_install_imports_its_own_copy(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    where = run(
        [str(venv / "bin/python"), "-c", "import paramedic; print(paramedic.__file__)"], env=env, cwd=venv
    )
    assert where.stdout.startswith(str(venv)), where.stdout
    proc = run([str(venv / "bin/paramedic"), "--version"], env=env, cwd=venv)
    assert proc.stdout.startswith("paramedic 0.1.0 (BLAST+ 2.")


def compiled_in(env: dict[str, str]) -> list[str]:
    return sorted(p.name for p in (Path(env["XDG_CACHE_HOME"]) / "paramedic/native").glob("*.so"))


def test_fragments_search_equals_blastp(
    installed: tuple[Path, dict[str, str]], databases: Databases, tmp_path: Path
) -> None:
    venv, env = installed
    databases.place(tmp_path, 2000, fragments=4)
    queries = databases.queries(tmp_path / "q.fasta", 8)
    (tmp_path / "ref").mkdir()
    blast(
        "makeblastdb",
        "-in",
        "../db.fasta",
        "-dbtype",
        "prot",
        "-parse_seqids",
        "-out",
        "uni",
        cwd=tmp_path / "ref",
    )
    blast(
        "blastp",
        "-query",
        str(queries),
        "-db",
        "uni",
        "-outfmt",
        "6",
        "-out",
        "expected.6",
        cwd=tmp_path / "ref",
    )
    out = tmp_path / "hits.6"
    run(
        [str(venv / "bin/paramedic"), "search", "blastp", "-query", str(queries), "-db", "db/uni", "-outfmt", "6",
         "-out", str(out), "--np", "2", "--strategy", "fragments", "--quiet"],
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.read_bytes() == (tmp_path / "ref/expected.6").read_bytes() != b""
    record = json.loads(out.with_name("hits.6.run.json").read_text())
    assert record["strategy"] == "fragments"
    assert any(n.startswith("prelim-") for n in compiled_in(env)), compiled_in(env)
    assert not list(venv.rglob("*.so")), "compiled into the installed package"


def test_traced_mpi_run(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    need("mpicc.openmpi", "mpiexec.openmpi")
    venv, env = installed
    program = tmp_path / "random_comm"
    run(["mpicc.openmpi", "-O2", "-o", str(program), str(RANDOM_COMM)])
    out = tmp_path / "run.clog2"
    proc = run(
        [str(venv / "bin/paramedic"), "trace", "-out", str(out), "--", "mpiexec.openmpi", "-n", "2", str(program), "50", "11"],
        env={**env, **OMPI_ENV}, cwd=tmp_path,
    )  # fmt: skip
    assert "trace written" in proc.stderr
    trace = clog2.read(out.read_bytes())
    assert {int(r) for r in trace.records.head[:, 1]} == {0, 1}  # both ranks' records, merged
    assert any(n.startswith("clogtrace-openmpi-") for n in compiled_in(env)), compiled_in(env)
    assert not list(venv.rglob("*.so")), "compiled into the installed package"
