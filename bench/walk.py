"""Walk a job as a newcomer would, from `engine/runtime/roles.py:run_job`, and count what the walk passes.

Run under mpiexec (every rank runs `paramedic search` in this process, as tests/mpi does); rank 0 records
every call into paramedic's own code made while `run_job` runs (threads included) and prints:

    stops    distinct functions of paramedic called (code objects: comprehensions and lambdas too)
    named    of them, the functions a reader goes to (no comprehension, generator expression or lambda,
             which are code objects of their own under Python 3.11 and inlined from 3.12 on, PEP 709)
    rooms    distinct modules they are in
    climbs   distinct call edges into a module that is already on the stack below (a walk back up to a
             room one came from: a module used as a switching yard, or a cycle between modules)
    entries  per module, the distinct functions of other modules that call into it (the top ones)

    mpiexec -n 3 .venv/bin/python bench/walk.py DIR [engine options...]
DIR holds db/uni (a `paramedic format` database) and q.fasta; the output goes to DIR/walk.out.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

from mpi4py import MPI

import paramedic
from paramedic.cli import main

ROOT = str(Path(paramedic.__file__).parent) + "/"
ANONYMOUS = re.compile(r"<(listcomp|setcomp|dictcomp|genexpr|lambda)>$")


def module_of(frame: FrameType) -> str | None:
    path = frame.f_code.co_filename
    return path[len(ROOT) :] if path.startswith(ROOT) else None


class Walk:
    def __init__(self) -> None:
        self.active = False
        self.stops: set[tuple[str, str]] = set()
        self.climbs: set[tuple[str, str]] = set()
        self.entries: dict[str, set[str]] = defaultdict(set)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = module_of(frame)
        if module is None:
            return
        name = frame.f_code.co_qualname
        if not self.active:
            if module == "engine/runtime/roles.py" and name == "run_job":
                self.active = True
            else:
                return
        self.stops.add((module, name))
        caller = frame.f_back
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back
        if caller is None:
            return
        caller_module = module_of(caller)
        assert caller_module is not None
        if caller_module == module:
            return
        where = f"{caller_module}:{caller.f_code.co_qualname}"
        self.entries[module].add(where)
        below = caller.f_back
        while below is not None:
            if module_of(below) == module:
                self.climbs.add((where, f"{module}:{name}"))
                break
            below = below.f_back

    def summary(self) -> dict[str, Any]:
        rooms = {m for m, _ in self.stops}
        top = sorted(self.entries.items(), key=lambda kv: -len(kv[1]))[:8]
        named = [(m, n) for m, n in self.stops if not ANONYMOUS.search(n)]
        return {
            "stops": len(self.stops),
            "named": len(named),
            "rooms": len(rooms),
            "climbs": len(self.climbs),
            "entries": {m: len(c) for m, c in top},
            "callers": {m: sorted(c) for m, c in self.entries.items()},
            "stop_list": sorted(f"{m}:{n}" for m, n in self.stops),
            "climb_edges": sorted(f"{a} -> {b}" for a, b in self.climbs),
        }


def run() -> int:
    site = Path(sys.argv[1])
    walk = Walk()
    if MPI.COMM_WORLD.Get_rank() == 0:
        sys.setprofile(walk.profile)
        threading.setprofile(walk.profile)
    argv = ["search", "blastp", "-query", str(site / "q.fasta"), "-db", str(site / "db/uni"), "-outfmt", "6",
            "-out", str(site / "walk.out"), "--quiet", *sys.argv[2:]]  # fmt: skip
    code = main(argv)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(walk.summary(), indent=1))
    return code


if __name__ == "__main__":
    sys.exit(run())
