"""The predictor (`paramedic simulate`): the job's own scheduler objects driven in virtual time.

A pilot run's record (paramedic.report.record) holds every task's BLAST+ seconds with its query and
database residues. From it the predictor builds a cost model and runs a job of any size: a plan for N
queries made by the engine's own `make_plan` (query lengths sampled from the record), the engine's own
Master, or a Supermaster with PartitionMasters (paramedic.engine.core.hierarchy), handed fake results with no
hits (the merge then costs nothing here; its measured cost is charged in virtual time instead).

Virtual time, per task:
- a fragment search costs BLAST+'s start-up plus a rate sampled from the record's searches (seconds per
  query residue per database residue) times its query residues and its fragment's residues; a report
  piece costs start-up plus, per query, the per-query cost of a record piece sampled with the query's
  length; with query segmentation a piece is a search of the whole database, costed as a search;
- every master is one server: each message it handles (a result in, a task out, a segment request or
  answer) costs it `message_seconds`, a search result also the record's merge seconds per query and the
  unpickling of its merge keys (KEY_SECONDS each; the record's merged hits per query give their number), and
  with the `master` output strategy a report piece the record's write seconds per byte on rank 0 (the
  supermaster when there are partitions); messages wait while their master is busy;
- a task reaches its worker `latency_seconds` after its master sends it (ranks wait by probing);
- the job's fixed cost (start, commit, stopping the ranks) is the pilot's wall less its busiest worker;
- for a database described by its size (`--database-profile nr`, `--db-bytes 364G --db-volumes 176`), its
  start-up (paramedic.engine.predict.startup): rank 0's resolution of -db and, in a first job, its digest of every
  byte, before any worker searches; each rank's first use of a volume (its files opened; with `--stage`
  the node's copy and the rank's digest of it), charged to the task that uses it.

Efficiency is the BLAST+ work (every task's seconds) over (ranks x wall), every rank counted: rank 0,
partition masters and workers.

Here the run (`simulate`, `predict`); the settings in paramedic.engine.predict.settings, the cost model and
the output strategies' costs in paramedic.engine.predict.costs, the masters' virtual-time costs in
paramedic.engine.predict.servers, the answer in paramedic.engine.predict.prediction.
"""

import json
import random
import sys
import time

from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import batch_residues, query_batches
from paramedic.blast.programs import PROGRAMS
from paramedic.db.fasta import read_fasta
from paramedic.engine.core.hierarchy import PartitionMaster, SegmentMaster, Supermaster, partitions
from paramedic.engine.core.master import Master, Sink
from paramedic.engine.core.plan import make_plan
from paramedic.engine.core.scheduler import Plan, Scheduler
from paramedic.engine.predict.costs import OUTPUT_COSTS, CostModel, QuerySample, TaskCosts, equal_parts
from paramedic.engine.predict.prediction import Prediction, Role
from paramedic.engine.predict.servers import MasterCosts, RankZeroCosts, Shared, VirtualSink
from paramedic.engine.predict.settings import SimulateSettings
from paramedic.engine.predict.startup import Startup
from paramedic.engine.predict.virtual import ForwardSink, VirtualNetwork
from paramedic.errors import InputError, UsageError
from paramedic.report.progress import Progress
from paramedic.report.record import RankStats, RunRecord


def simulate(settings: SimulateSettings) -> Prediction:
    """Predict the job: load the record, build the plan, run the scheduler objects in virtual time."""
    try:
        record = RunRecord.load(settings.record)
    except FileNotFoundError:
        raise InputError(f"--record {settings.record}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InputError(f"--record {settings.record}: not a run record: {exc}") from None
    return predict(CostModel.from_record(record), settings)


def predict(
    model: CostModel, settings: SimulateSettings, scheduler: type[Scheduler] = Scheduler
) -> Prediction:
    """The job of `settings` in virtual time; `scheduler`: the scheduling policy (a subclass of the
    engine's, docs/CONTRIBUTING.md "Add a scheduler policy")."""
    started = time.perf_counter()
    rng = random.Random(settings.seed)
    lengths, picks = _workload(model, settings, rng)
    shape = settings.database
    if shape is not None and not shape.dbtype:  # given by size: the pilot's program's molecule
        shape = shape.typed(PROGRAMS[model.program].db_type)
    if shape is None:
        fragment_residues = model.database(settings.fragments, settings.database_scale)
    else:  # searched in place: fragments as paramedic.db.blastdb.fragment_ranges cuts it, or as asked
        if PROGRAMS[model.program].db_type != shape.dbtype:
            kind = {"prot": "protein", "nucl": "nucleotide"}[shape.dbtype]
            raise UsageError(
                f"{shape.name} is a {kind} database, and the pilot ran {model.program}: record a pilot with "
                "a program that searches it"
            )
        fragment_residues = equal_parts(shape.residues, settings.fragments or shape.fragments())
    blast_residues = batch_residues(model.program, BlastOptions())
    plan = make_plan(
        program=model.program,
        query_lengths=lengths,
        fragment_residues=fragment_residues,
        workers=settings.workers,
        hitlist_size=500,
        startup_seconds=model.startup,
        stitchable=model.stitchable,
        batch=settings.batch or model.batch,
        piece_queries=model.piece_queries,
        query_segmentation=model.strategy == "queries",
        keep_alignments=model.keep_alignments,
        blast_batches=query_batches(lengths, blast_residues) if blast_residues else (),
    )
    output = OUTPUT_COSTS[settings.output_strategy]
    tasks = TaskCosts(model, plan, lengths, picks, fragment_residues, rng)
    # the ranks: rank 0 (the only master, or the supermaster over partitions of a master and workers),
    # each master's loop the runner's own (paramedic.engine.core.runner) on one virtual clock
    ranks = settings.workers + 1
    groups, supermaster = _partition_groups(settings, plan, ranks)
    searching = sum(len(group) - 1 for group in groups)  # the ranks running BLAST+
    tasks.shared = max(1.0, searching / settings.cores) if settings.cores else 1.0
    tasks.shared /= settings.core_speed
    costs = Shared(model, output, plan, settings.message_seconds, settings.latency_seconds, searching)
    startup = None
    if shape is not None:
        startup = Startup(
            shape,
            settings.rates,
            settings.first_job,
            settings.stage,
            settings.node_ranks,
            plan.n_fragments,
            nodes=-(-ranks // settings.node_ranks),
        )
        costs.startup, costs.volumes = startup, range(shape.volumes)
    network = VirtualNetwork()
    zero = RankZeroCosts(costs) if supermaster is not None else None
    links, masters = _masters(model, settings, plan, scheduler, groups, network, costs, tasks, zero)
    segments = None
    if supermaster is not None and zero is not None:
        rank0 = VirtualSink(plan, lambda index: None)  # its cost is charged as the piece arrives
        segments = SegmentMaster(supermaster, rank0, Progress(0, quiet=True), RankStats(0, "supermaster"))
        network.join(segments, zero)
    network.run()
    if not (segments.finished if segments is not None else masters[0].finished):
        raise UsageError("internal: the simulated job stalled (the scheduler handed out no task)")
    end = max(network.now, *(link.free for link in links), zero.free if zero is not None else 0.0)
    if output.round_bytes is not None and costs.unwritten:
        costs.write_round(end)
    before = startup.rank0_seconds if startup is not None else 0.0  # every rank waits for rank 0
    wall = before + max(end, costs.round_until) + model.fixed_seconds
    spent: dict[str, float] = {}
    if startup is not None:
        spent["start: rank 0 resolves -db, stamps"] = ranks * (
            startup.resolve_seconds + startup.stamp_seconds
        )
        spent["start: verification"] = ranks * startup.verify_seconds
        spent["start: volume opens"] = startup.open_seconds
        spent["start: staging"] = startup.copy_seconds + startup.stage_digest_seconds
    spent.update(costs.spent)
    spent["fixed (pilot's start, commit, stop)"] = ranks * model.fixed_seconds
    roles = _roles(zero, links, searching, costs)
    next(iter(roles.values())).busy += before  # rank 0 starts the job
    return Prediction(
        settings=settings,
        queries=len(lengths),
        wall_seconds=wall,
        work_seconds=costs.work,
        ranks=ranks,
        partitions=len(groups) if supermaster is not None else 0,
        plan_batches=len(plan.batches),
        plan_pieces=len(plan.pieces),
        fragments=plan.n_fragments,
        tasks=costs.tasks,
        roles=roles,
        fixed_seconds=model.fixed_seconds,
        scheduler_seconds=network.loop_seconds,
        simulate_seconds=time.perf_counter() - started,
        last_segment_seconds=zero.last_segment if zero is not None else None,
        output_rounds=costs.rounds,
        startup=startup,
        spent=spent,
    )


def _workload(
    model: CostModel, settings: SimulateSettings, rng: random.Random
) -> tuple[list[int], list[QuerySample]]:
    """The job's query lengths (its query file's, or the pilot's sampled) and a pilot query sampled for
    each, whose costs it takes."""
    n = settings.queries
    lengths: list[int] = []
    if settings.query_file is not None:
        program = PROGRAMS[model.program]
        lengths = [len(r.sequence) for r in read_fasta(settings.query_file, program.query_type)]
        n = len(lengths)
    assert n is not None
    picks = [model.queries[rng.randrange(len(model.queries))] for _ in range(n)]
    if settings.query_file is None:
        lengths = [q.length for q in picks]
    return lengths, picks


def _partition_groups(
    settings: SimulateSettings, plan: Plan, ranks: int
) -> tuple[list[list[int]], Supermaster | None]:
    """The ranks of each master (the first of each group; one group without partitions), and the
    supermaster over the partitions."""
    if settings.partition_size is None:
        return [list(range(ranks))], None
    try:
        groups = partitions(ranks, settings.partition_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        return groups, Supermaster(plan)
    except ValueError:
        raise UsageError(
            "--partition-size: the pilot's -outfmt is written in one piece (not stitched), which "
            "cannot be cut into query segments"
        ) from None


def _masters(
    model: CostModel,
    settings: SimulateSettings,
    plan: Plan,
    scheduler: type[Scheduler],
    groups: list[list[int]],
    network: VirtualNetwork,
    costs: Shared,
    tasks: TaskCosts,
    zero: RankZeroCosts | None,
) -> tuple[list[MasterCosts], list[Master]]:
    """Each group's master, as the engine builds it, joined to the network with its workers' costs."""
    partitioned = zero is not None
    links: list[MasterCosts] = []
    masters: list[Master] = []
    for group in groups:
        link = MasterCosts(costs, len(group) - 1, tasks.result, tasks.cost, zero, group)
        policy = scheduler(
            plan,
            keep_alignments=model.keep_alignments,
            alignments_stored=model.alignments_stored,
            assigned=set() if partitioned else None,
            replica_group=settings.replica_group_size,
        )
        sink: Sink = ForwardSink(link) if partitioned else VirtualSink(plan, link.piece_written)
        master = Master(policy, sink, Progress(0, quiet=True), RankStats(group[0], "master"))
        if partitioned:
            link.partition = PartitionMaster(master, len(group) - 1)
        network.join(master, link)
        links.append(link)
        masters.append(master)
    return links, masters


def _roles(
    zero: RankZeroCosts | None, links: list[MasterCosts], searching: int, costs: Shared
) -> dict[str, Role]:
    """Each kind of rank's count and busy seconds."""
    roles: dict[str, Role] = {}
    if zero is not None:
        roles["supermaster"] = Role(1, zero.busy)
        roles["partition masters"] = Role(len(links), sum(link.busy for link in links))
    else:
        roles["master"] = Role(1, links[0].busy)
    roles["workers"] = Role(searching, costs.worker_busy)
    return roles


def run_simulate(settings: SimulateSettings, as_json: bool) -> int:
    """`paramedic simulate`: the prediction on standard output, as text or JSON."""
    prediction = simulate(settings)
    if as_json:
        print(json.dumps(prediction.as_dict(), indent=2))
    else:
        print(prediction.summary())
    sys.stdout.flush()
    return 0
