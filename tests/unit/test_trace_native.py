"""trace/native.py: which tracer library a launcher gets."""

from __future__ import annotations

from pathlib import Path

from paramedic.trace import native


def test_two_mpis_of_one_flavour_get_two_libraries(tmp_path: Path) -> None:
    """The mpich wheel's mpicc and Debian's mpicc.mpich both build 'mpich' libraries: one name for both
    had a Debian MPICH program run with the wheel's libmpi loaded beside its own (exit 127)."""
    wheel, debian = tmp_path / "venv/bin/mpicc", tmp_path / "usr/bin/mpicc.mpich"
    for path in (wheel, debian):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
    link = tmp_path / "mpicc"
    link.symlink_to(debian)
    assert native.variant("mpich", str(wheel)) != native.variant("mpich", str(debian))
    assert native.variant("mpich", str(link)) == native.variant("mpich", str(debian))  # one MPI, one library
    assert native.variant("mpich", str(wheel)).startswith("mpich-")
