"""The tracer's PMPI library (native/clogtrace.c), built at first use against the MPI the program runs on.

A PMPI library must be compiled with the MPI implementation's own header (MPI_Comm is an int in MPICH, a
pointer in Open MPI) and linked to its libmpi. The flavour comes from `mpiexec --version`; the compiler is
the mpicc that sits next to that mpiexec (mpiexec.openmpi -> mpicc.openmpi, .venv/bin/mpiexec ->
.venv/bin/mpicc), else the flavour's Debian name. Built once per source version and flavour into the
user's cache (blast.forkserver.compiled, as the BLAST+ shims are).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from paramedic.blast.forkserver import compiled
from paramedic.errors import UsageError

NATIVE = Path(__file__).with_name("native")
SOURCE = NATIVE / "clogtrace.c"
STATES = NATIVE / "clogtrace_states.h"
MERGE = NATIVE / "clogtrace_merge.h"
FORTRAN = NATIVE / "clogtrace_fortran.h"
BIGCOUNT = NATIVE / "clogtrace_bigcount.h"
MORE = NATIVE / "clogtrace_more.h"
EXT = NATIVE / "clogtrace_ext.h"
GAPS = NATIVE / "clogtrace_gaps.h"
FORTRAN_MORE = NATIVE / "clogtrace_fortran_more.h"
EXT_C = NATIVE / "clogtrace_ext_c.h"
F08 = NATIVE / "clogtrace_f08.h"
AUDIT = NATIVE / "clogaudit.c"
FALLBACK_COMPILERS = {"openmpi": "mpicc.openmpi", "mpich": "mpicc.mpich"}


def flavour(mpiexec: str) -> str:
    """'openmpi' or 'mpich', from the launcher's --version."""
    try:
        proc = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run {mpiexec} --version: {exc}") from exc
    text = proc.stdout + proc.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text.upper():
        return "mpich"
    raise UsageError(f"{mpiexec}: neither Open MPI's nor MPICH's mpiexec (paramedic trace knows those two)")


def mpicc_for(mpiexec: str, kind: str) -> str:
    """The MPI C compiler wrapper that matches the launcher."""
    path = Path(mpiexec)
    name = path.name
    prefix = next((p for p in ("mpiexec", "mpirun", "orterun") if name.startswith(p)), "")
    suffix = name[len(prefix) :]  # mpiexec.openmpi -> .openmpi
    candidate = path.with_name("mpicc" + suffix)
    if os.access(candidate, os.X_OK):
        return str(candidate)
    fallback = shutil.which(FALLBACK_COMPILERS[kind])
    if fallback is None:
        raise UsageError(
            f"no MPI C compiler for {mpiexec} ({kind}): install its development package "
            "(`make mpi-trace` installs Open MPI's)"
        )
    return fallback


def variant(kind: str, compiler: str) -> str:
    """The cache's name for a build: the flavour and which MPI's compiler built it. Two MPIs of one flavour
    (the mpich wheel's and Debian's MPICH) each get their own library: one built against the other's
    libmpi loaded both into the ranks (a Debian MPICH program exited 127 on a symbol of the wheel's)."""
    where = os.path.realpath(shutil.which(compiler) or compiler)
    return f"{kind}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def library(mpiexec: str) -> tuple[Path, str]:
    """The tracer library for this launcher's MPI, and the flavour."""
    if not Path(mpiexec).name.startswith(("mpiexec", "mpirun", "orterun")):
        raise UsageError(
            f"{mpiexec}: the command after -- must start with Open MPI's or MPICH's launcher (mpiexec, mpirun)"
        )
    resolved = shutil.which(mpiexec)
    if resolved is None:
        raise UsageError(f"{mpiexec}: no such launcher")
    kind = flavour(resolved)
    compiler = mpicc_for(resolved, kind)
    lib = compiled(
        SOURCE,
        compiler=compiler,
        flags=(f"-I{NATIVE}", "-pthread", "-lm", "-ldl"),
        depends=(STATES, MERGE, FORTRAN, BIGCOUNT, MORE, EXT, GAPS, FORTRAN_MORE, EXT_C, F08),
        variant=variant(kind, compiler),
    )
    if lib is None:
        raise UsageError(f"cannot build the tracer library with {compiler}")
    return lib, kind


def audit_library() -> Path:
    """The rtld-audit library (native/clogaudit.c) that sends MPI calls bound around the tracer (dlsym on
    the MPI library's handle, RTLD_DEEPBIND) to its wrappers; MPI-independent, built with the C compiler."""
    lib = compiled(AUDIT, flags=(), variant="audit")
    if lib is None:
        raise UsageError("cannot build the tracer's audit library with the system C compiler (cc)")
    return lib
