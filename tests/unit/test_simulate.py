"""The predictor (paramedic.engine.predict.simulate) on small made-up run records: one worker takes the sum of the
task costs, more workers are never slower on balanced work, the JSON has its keys, bad records and bad
options are one line and an exit code; the engine's scheduler, indexed for large plans, decides as a
plain scan of every batch does."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import deque
from pathlib import Path

import pytest

from paramedic.cli import main
from paramedic.engine.core.master import Master, PieceResult, Result, SearchResult
from paramedic.engine.core.runner import Arrival, Transport
from paramedic.engine.core.runner import drive as runner_drive
from paramedic.engine.core.scheduler import Plan, Scheduler, SearchTask, Task
from paramedic.engine.predict.simulate import CostModel, SimulateSettings, predict
from paramedic.errors import UsageError
from paramedic.output.strategies import ROUND_BYTES
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord, TaskCost
from tests.unit.fragments import searched
from tests.unit.test_master import writer

STARTUP = 0.1
RATE = 1e-9  # seconds per query residue per fragment residue


def made_up(tmp_path: Path, wall: float = 1.0, queries: int = 20, length: int = 2000) -> Path:
    """A pilot of `queries` queries of `length` residues, 2 fragments of 10,000 residues, batches and
    pieces of 5 queries (a BLAST+ batch of 10,000 residues each): a search costs start-up + 5 x 2,000 x
    10,000 x RATE, a piece start-up +
    0.2 s per query."""
    worker = RankStats(rank=1, role="worker")
    for batch in range(queries // 5):
        for fragment in range(2):
            worker.add_task(
                TaskCost("search", batch, fragment, 5, 5 * length, 10_000, STARTUP + RATE * 5 * length * 1e4)
            )
        worker.add_task(TaskCost("piece", batch, -1, 5, 5 * length, 0, STARTUP + 5 * 0.2))
    record = RunRecord(
        program="blastp", command=["paramedic", "search", "blastp", "--batch", "5", "--regen-batch", "5"],
        database="db", manifest_sha256="ab" * 32, queries=queries, ranks=2, workers=1,
        batches=queries // 5, fragments=2, pieces=queries // 5, strategy="fragments",
        search_batch_queries=5, regen_group_queries=5, blast_startup_seconds=STARTUP, wall_seconds=wall,
        output="hits.txt", output_bytes=0, metadata_pairs=0, queries_with_hits=0, searched_again=0,
        ranks_stats=[RankStats(rank=0, role="master"), worker],
    )  # fmt: skip
    path = tmp_path / "pilot.run.json"
    record.write(path)
    return path


def settings(path: Path, queries: int, workers: int, **kw: object) -> SimulateSettings:
    return SimulateSettings(
        record=path, queries=queries, workers=workers, message_seconds=0.0, latency_seconds=0.0, **kw
    )  # type: ignore[arg-type]


def model(path: Path) -> CostModel:
    return CostModel.from_record(RunRecord.load(path))


def test_one_worker_takes_the_sum_of_the_task_costs(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    prediction = predict(model(path), settings(path, 40, 1))
    search = STARTUP + RATE * 5 * 2000 * 10_000
    piece = STARTUP + 5 * 0.2
    expected = 8 * (2 * search + piece)  # 8 batches of 5 queries, 2 fragments, a piece per batch
    assert prediction.tasks == 24
    assert prediction.work_seconds == pytest.approx(expected)
    assert prediction.wall_seconds == pytest.approx(expected)
    assert prediction.efficiency == pytest.approx(0.5)  # the master's rank counts: 2 ranks, 1 works


def test_the_pilots_fixed_cost_is_added(tmp_path: Path) -> None:
    path = made_up(tmp_path, wall=100.0)
    pilot = model(path)
    assert pilot.fixed_seconds > 90
    prediction = predict(pilot, settings(path, 40, 1))
    assert prediction.wall_seconds == pytest.approx(prediction.work_seconds + pilot.fixed_seconds)


@pytest.mark.parametrize("partition_size", [None, 4])
def test_more_workers_are_never_predicted_slower_on_balanced_work(tmp_path: Path, partition_size) -> None:
    path = made_up(tmp_path)
    walls = []
    for workers in (4, 8, 16, 32):
        s = SimulateSettings(record=path, queries=400, workers=workers, partition_size=partition_size)
        walls.append(predict(model(path), s).wall_seconds)
    assert walls == sorted(walls, reverse=True) and walls[-1] < walls[0] / 4


def test_partitions_do_all_the_work_and_rank0_is_busier_writing(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    one = predict(model(path), SimulateSettings(record=path, queries=200, workers=12))
    parts = predict(model(path), SimulateSettings(record=path, queries=200, workers=12, partition_size=4))
    assert parts.tasks == one.tasks and parts.work_seconds == pytest.approx(one.work_seconds)
    assert parts.partitions == 3 and set(parts.roles) == {"supermaster", "partition masters", "workers"}
    assert parts.roles["workers"].ranks == 9 and one.roles["workers"].ranks == 12


def test_collective_rounds_wait_for_every_worker(tmp_path: Path) -> None:
    """worker-collective: a round once ROUND_BYTES are placed, after the last task in flight; with 10
    rounds' worth of output, 10 rounds (the last one at the end) and a longer wall than workers writing
    on their own; with little output, one round at the end."""
    path = made_up(tmp_path)
    pilot = dataclasses.replace(model(path), output_per_query=ROUND_BYTES / 20, write_per_byte=2e-8)
    alone = predict(pilot, settings(path, 200, 8, output_strategy="worker-individual"))
    rounds = predict(pilot, settings(path, 200, 8, output_strategy="worker-collective"))
    assert rounds.output_rounds == 10 and alone.output_rounds == 0
    assert rounds.work_seconds == pytest.approx(alone.work_seconds)
    assert rounds.wall_seconds > alone.wall_seconds
    little = dataclasses.replace(pilot, output_per_query=1000)
    assert predict(little, settings(path, 200, 8, output_strategy="worker-collective")).output_rounds == 1


def test_json_gives_wall_and_efficiency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = made_up(tmp_path)
    assert main(["simulate", "--record", str(path), "--queries", "100", "--workers", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"wall_seconds", "efficiency", "work_seconds", "roles", "ranks"} <= set(out)
    assert 0 < out["efficiency"] <= 1 and out["ranks"] == 9
    assert main(["simulate", "--record", str(path), "--queries", "100", "--workers", "8"]) == 0
    assert "efficiency" in capsys.readouterr().out


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], code: int, words: str) -> None:
    assert main(["simulate", *argv]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_bad_records_and_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = made_up(tmp_path)
    args = ["--queries", "10", "--workers", "2"]
    _one_line(capsys, ["--record", str(tmp_path / "none.json"), *args], 3, "no such file")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**json.loads(path.read_text()), "version": 1}))
    _one_line(capsys, ["--record", str(old), *args], 3, "run record version 1")
    bare = tmp_path / "bare.json"
    data = json.loads(path.read_text())
    for rank in data["ranks_stats"]:
        rank["task_costs"] = []
    bare.write_text(json.dumps(data))
    _one_line(capsys, ["--record", str(bare), *args], 3, "no per-task costs")
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{")
    _one_line(capsys, ["--record", str(garbled), *args], 3, "not a run record")
    _one_line(capsys, ["--record", str(path), "--queries", "0", "--workers", "2"], 2, "--queries")
    _one_line(capsys, ["--record", str(path), *args, "--partition-size", "8"], 2, "fewer than one partition")
    _one_line(capsys, ["--record", str(path), *args, "--output-strategy", "carrier-pigeon"], 2, "invalid")
    with pytest.raises(UsageError):
        SimulateSettings(record=path, queries=1, workers=1, database_scale=float("nan"))


# -- the engine's plan and scheduler, indexed, decide as a plain scan does -----------------------------
def random_plan(rng: random.Random) -> Plan:
    n = rng.randint(1, 60)
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    pieces = tuple(range(a, b) for a, b in zip([0, *cuts], [*cuts, n], strict=True))
    # batches: unions of consecutive pieces, or sometimes arbitrary cuts (pieces crossing them)
    if rng.random() < 0.8:
        ends = sorted(rng.sample([p.stop for p in pieces[:-1]], rng.randint(0, len(pieces) - 1)))
    else:
        ends = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    batches = tuple(range(a, b) for a, b in zip([0, *ends], [*ends, n], strict=True))
    return Plan(batches, rng.randint(1, 8), pieces, hitlist_size=5)


def test_the_plan_finds_the_pieces_a_scan_finds() -> None:
    """Plan.batch_pieces bisects; a scan of every piece is the reference."""
    rng = random.Random(7)
    for _ in range(300):
        plan = random_plan(rng)
        for batch in range(len(plan.batches)):
            queries = plan.batches[batch]
            inside = [
                i for i, p in enumerate(plan.pieces) if p.start >= queries.start and p.stop <= queries.stop
            ]
            crossing = not inside or sum(len(plan.pieces[i]) for i in inside) != len(queries)
            try:
                got: range | None = plan.batch_pieces(batch)
            except ValueError:
                got = None
            assert got == (None if crossing else range(inside[0], inside[-1] + 1))


class ScanningScheduler(Scheduler):
    """The reference: the same policy, found by scanning every batch of the plan and every worker's
    cache on every call (what the engine did before it kept its open batches and holders counted)."""

    def next_task(self, worker: int) -> Task | None:
        pending = [
            b for b in range(len(self.plan.batches))
            if self._pending[b] and (self.assigned is None or b in self.assigned)
        ]  # fmt: skip
        tail = pending == [len(self.plan.batches) - 1] and self.assigned is None and self.stage_copies is None
        if self._ready and not tail:
            return self._ready.popleft()
        open_batches = pending[: self.window]
        if not open_batches:
            return self._ready.popleft() if self._ready else None
        held = self.cache.setdefault(worker, set())
        others = set().union(*(f for w, f in self.cache.items() if w != worker))
        home = self.home(worker)
        for prefer in (
            lambda f: f in held,
            lambda f: f in home,
            lambda f: f not in others,
            lambda f: True,
        ):
            for batch in open_batches:
                fragments = sorted(f for f in self._pending[batch] if prefer(f))
                if fragments:
                    choice = SearchTask(batch, fragments[0])
                    self._pending[batch].discard(choice.fragment)
                    held.add(choice.fragment)
                    return choice
        raise AssertionError("an open batch with nothing pending")


class RandomOrder(Transport[Task, Result]):
    """Workers whose results come back in a random order, asked for in a random order, with a
    partition's segments given one by one at random moments; keeps every task sent."""

    def __init__(self, scheduler: Scheduler, rng: random.Random, workers: int, segments: list[int] | None):
        self.scheduler = scheduler
        self.rng = rng
        self.count = workers
        self.segments = segments
        self.running: list[tuple[int, Task]] = []
        self.sent: list[tuple[int, Task]] = []

    def ready(self) -> range:
        return range(1, self.count + 1)

    @property
    def workers(self) -> int:
        return self.count

    def between(self, idle: deque[int]) -> bool:
        if self.segments and (self.rng.random() < 0.3 or not self.running):
            self.scheduler.assign(self.segments.pop(0))
        self.rng.shuffle(idle)
        return False

    @property
    def may_stall(self) -> bool:
        return not self.segments

    def send(self, worker: int, task: Task) -> None:
        self.sent.append((worker, task))
        self.running.append((worker, task))

    def receive(self) -> Arrival[Result] | None:
        if not self.running:
            return None  # every worker waits for the next segment
        worker, task = self.running.pop(self.rng.randrange(len(self.running)))
        if isinstance(task, SearchTask):
            hits = [[] for _ in self.scheduler.plan.batches[task.batch]]
            return Arrival(worker, SearchResult(task, searched(hits)))
        return Arrival(worker, PieceResult(task, b"", 0.0))


def drive(scheduler: Scheduler, rng: random.Random, workers: int, segments: list[int] | None) -> list:
    """The engine's runner loop over `RandomOrder`; returns every task handed out, to whom."""
    master = Master(scheduler, writer(scheduler.plan)[0], Progress(0, quiet=True), RankStats(0, "m"))
    transport = RandomOrder(scheduler, rng, workers, segments)
    runner_drive(master, transport)
    return transport.sent


@pytest.mark.parametrize("replica_group", [None, 2])
@pytest.mark.parametrize("partitioned", [False, True])
def test_the_scheduler_hands_out_what_a_scan_does(partitioned: bool, replica_group) -> None:
    for seed in range(150):
        plan = random_plan(random.Random(seed))
        try:
            for batch in range(len(plan.batches)):
                plan.batch_pieces(batch)
        except ValueError:
            continue
        workers = random.Random(-seed).randint(1, 8)
        segments = list(range(len(plan.batches))) if partitioned else None
        assigned = set() if partitioned else None
        engine = drive(
            Scheduler(plan, assigned=assigned, replica_group=replica_group),
            random.Random(seed),
            workers,
            segments and [*segments],
        )
        scanning = drive(
            ScanningScheduler(
                plan, assigned=None if assigned is None else set(), replica_group=replica_group
            ),
            random.Random(seed),
            workers,
            segments and [*segments],
        )
        assert engine == scanning, seed


def test_the_jobs_own_queries_give_their_lengths(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    fasta = tmp_path / "q.fasta"
    fasta.write_text("".join(f">q{i}\n{'MKLVW' * 800}\n" for i in range(10)))  # twice the pilot's length
    s = SimulateSettings(record=path, queries=None, workers=1, query_file=fasta, message_seconds=0.0)
    prediction = predict(model(path), s)
    assert prediction.queries == 10
    # 10 queries of 4,000 residues on 2 fragments, their reports at the pilot's 0.2 s per query
    searches = 2 * prediction.plan_batches * STARTUP + 2 * RATE * 10 * 4000 * 10_000
    assert prediction.work_seconds == pytest.approx(searches + prediction.plan_pieces * STARTUP + 10 * 0.2)
    with pytest.raises(UsageError, match="one of them"):
        SimulateSettings(record=path, queries=10, workers=1, query_file=fasta)
    with pytest.raises(UsageError, match="one of them"):
        SimulateSettings(record=path, queries=None, workers=1)
