"""The predictor's answer (`paramedic simulate`): a predicted job's wall, efficiency, busy seconds per role
and where the allocation's time goes, as text or JSON."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from paramedic.engine.predict.settings import SimulateSettings
from paramedic.engine.predict.startup import Startup


@dataclass
class Role:
    """Busy seconds of the ranks of one role."""

    ranks: int = 0
    busy: float = 0.0

    def report(self, wall: float) -> dict[str, float]:
        idle = max(0.0, self.ranks * wall - self.busy)
        return {
            "ranks": self.ranks,
            "busy_seconds": round(self.busy, 3),
            "idle_seconds": round(idle, 3),
            "idle_seconds_per_rank": round(idle / self.ranks, 3) if self.ranks else 0.0,
            "utilisation": round(self.busy / (self.ranks * wall), 4) if self.ranks and wall else 0.0,
        }


@dataclass
class Prediction:
    settings: SimulateSettings
    queries: int
    wall_seconds: float
    work_seconds: float
    ranks: int
    partitions: int
    plan_batches: int
    plan_pieces: int
    fragments: int
    tasks: int
    roles: dict[str, Role]
    fixed_seconds: float
    scheduler_seconds: float  # real CPU seconds the scheduler objects took in this simulation
    simulate_seconds: float
    last_segment_seconds: float | None = None  # virtual time the supermaster handed out its last segment
    output_rounds: int = 0  # worker-collective: the rounds, the last one included
    startup: Startup | None = None  # a described database's start-up
    spent: dict[str, float] = dataclasses.field(default_factory=dict)  # rank-seconds by what they did

    @property
    def efficiency(self) -> float:
        return self.work_seconds / (self.ranks * self.wall_seconds) if self.wall_seconds else 0.0

    def where(self) -> dict[str, dict[str, float]]:
        """Where the allocation's time goes (ranks x wall): rank-seconds and their share, by what the
        ranks did; the ranks that wait for rank 0's start count as spent on it."""
        total = self.ranks * self.wall_seconds
        spent = dict(self.spent)
        spent["idle"] = max(0.0, total - sum(spent.values()))
        return {
            name: {"rank_seconds": round(seconds, 3), "share": round(seconds / total, 4) if total else 0.0}
            for name, seconds in spent.items()
        }

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "efficiency": round(self.efficiency, 4),
            "work_seconds": round(self.work_seconds, 3),
            "queries": self.queries,
            "workers": s.workers,
            "ranks": self.ranks,
            "partition_size": s.partition_size,
            "partitions": self.partitions,
            "output_strategy": s.output_strategy,
            "output_rounds": self.output_rounds,
            "fragments": self.fragments,
            "batches": self.plan_batches,
            "pieces": self.plan_pieces,
            "tasks": self.tasks,
            "fixed_seconds": round(self.fixed_seconds, 3),
            "roles": {name: role.report(self.wall_seconds) for name, role in self.roles.items()},
            "last_segment_seconds": None
            if self.last_segment_seconds is None
            else round(self.last_segment_seconds, 3),
            "scheduler_cpu_seconds": round(self.scheduler_seconds, 3),
            "simulate_seconds": round(self.simulate_seconds, 3),
            "record": str(s.record),
            "startup": self.startup.report() if self.startup is not None else None,
            "where": self.where(),
        }

    def summary(self) -> str:
        s = self.settings
        layout = (
            f"{self.partitions} partitions of {s.partition_size} ranks" if s.partition_size else "one master"
        )
        lines = [
            f"paramedic: predicted {self.queries:,} queries on {s.workers:,} workers ({layout}, "
            f"{self.ranks:,} ranks, output: {s.output_strategy}): wall {self.wall_seconds:,.1f} s, "
            f"efficiency {100 * self.efficiency:.1f}%",
            f"  plan: {self.plan_batches:,} batches x {self.fragments} fragments, {self.plan_pieces:,} "
            f"pieces, {self.tasks:,} tasks; BLAST+ work {self.work_seconds:,.1f} s; fixed "
            f"{self.fixed_seconds:.1f} s",
        ]
        for name, role in self.roles.items():
            r = role.report(self.wall_seconds)
            lines.append(
                f"  {name}: {r['ranks']:,} ranks, idle {r['idle_seconds_per_rank']:,.2f} s per rank "
                f"({100 * (1 - r['utilisation']):.1f}% of the wall)"
            )
        if self.startup is not None:
            st, shape = self.startup, self.startup.shape
            lines.append(
                f"  start-up ({'first' if st.first_job else 'second'} job on {shape.name}: "
                f"{shape.bytes / 1e9:,.1f} GB, {shape.volumes:,} volumes, {shape.residues:,} letters"
                f"{', staged' if st.stage else ''}): rank 0 {st.rank0_seconds:,.1f} s before the first "
                f"search (resolve {st.resolve_seconds:.2f} s, verify {st.verify_seconds:,.1f} s, stamps "
                f"{st.stamp_seconds:.3f} s); opens {st.open_seconds:.2f} s and staging "
                f"{st.copy_seconds + st.stage_digest_seconds:,.1f} s over all ranks"
            )
        lines.append(
            "  where the time goes (share of ranks x wall): "
            + ", ".join(f"{name} {100 * v['share']:.1f}%" for name, v in self.where().items())
        )
        return "\n".join(lines)
