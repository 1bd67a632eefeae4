import dataclasses

import pytest

from paramedic.blast.hits import Hit
from paramedic.engine.core.plan import fragment_groups, make_plan, one_search_per_worker, search_units
from paramedic.engine.core.plan import grouped as group
from paramedic.engine.core.scheduler import PieceTask, Plan, Scheduler, SearchTask
from tests.unit.fragments import searched


def plan(n_queries=6, batch=3, fragments=3, group=2):
    batches = tuple(range(s, min(n_queries, s + batch)) for s in range(0, n_queries, batch))
    pieces = tuple(range(s, min(n_queries, s + group)) for s in range(0, n_queries, group))
    return Plan(batches, fragments, pieces, hitlist_size=2)


def fake_hits(task: SearchTask, p: Plan) -> list[list[Hit]]:
    # query q hits subject 10*q + fragment with an e-value that prefers lower fragments
    return [[Hit(10.0 ** -(10 - task.fragment), 50, 10 * q + task.fragment)] for q in p.batches[task.batch]]


def drive(s: Scheduler, workers: int) -> list[tuple[int, object]]:
    """Run the scheduler to completion in virtual time, workers taking turns."""
    log = []
    while not s.finished:
        progressed = False
        for w in range(workers):
            task = s.next_task(w)
            if task is None:
                continue
            progressed = True
            log.append((w, task))
            if isinstance(task, SearchTask):
                s.search_done(task, searched(fake_hits(task, s.plan)))
            else:
                s.piece_done(task)
        assert progressed, "scheduler stalled"
    return log


def test_every_search_task_once_and_every_piece_regenerated():
    p = plan()
    log = drive(Scheduler(p), workers=2)
    searches = [t for _, t in log if isinstance(t, SearchTask)]
    assert sorted((t.batch, t.fragment) for t in searches) == [(b, f) for b in range(2) for f in range(3)]
    pieces = sorted(t.piece for _, t in log if isinstance(t, PieceTask))
    assert pieces == [0, 1, 2]


def test_merge_keeps_hits_in_blast_order_when_no_hit_list_fills():
    p = plan()
    s = Scheduler(dataclasses.replace(p, hitlist_size=5))
    drive(s, workers=1)
    # fragment 0 has the best e-value (1e-10), then 1 (1e-9), then 2
    assert s.metadata(4) == [40, 41, 42]
    assert s.searched_again == 0


def test_a_filled_hit_list_sends_the_query_to_be_searched_again_against_its_preliminary_list():
    s = Scheduler(plan())  # hitlist 2, three fragments with one hit each: the list fills
    log = drive(s, workers=1)
    assert s.metadata(4) == [40, 41, 42]  # the whole preliminary list, not the top 2
    assert s.searched_again == 6
    assert all(t.alignments is None for _, t in log if isinstance(t, PieceTask))


def test_regeneration_preferred_once_a_batch_is_merged():
    p = plan(n_queries=6, batch=2, fragments=1, group=2)
    s = Scheduler(p)
    first = s.next_task(0)
    s.search_done(first, searched(fake_hits(first, p)))
    assert len(p.batches) == 3  # batches 1 and 2 still have searches: not the tail
    assert isinstance(s.next_task(0), PieceTask)


def test_in_the_tail_the_last_batchs_searches_go_before_ready_pieces():
    """Two batches on two workers (issue 21's 20 queries): when batch 0 is merged while batch 1 still
    has searches to hand out, those go first; the pieces of both batches then run side by side."""
    p = plan(n_queries=4, batch=2, fragments=3, group=2)
    s = Scheduler(p)
    batch0 = [s.next_task(w) for w in (1, 2, 3)]  # one fragment each (a worker prefers its own)
    assert all(isinstance(t, SearchTask) and t.batch == 0 for t in batch0)
    for t in batch0:
        s.search_done(t, searched(fake_hits(t, p)))
    tail = [s.next_task(w) for w in (1, 2, 3)]
    assert [t.batch for t in tail if isinstance(t, SearchTask)] == [1, 1, 1]
    piece = s.next_task(4)  # no search left to hand out: the ready piece
    assert isinstance(piece, PieceTask) and piece.piece == 0


def test_affinity_prefers_cached_fragment():
    p = plan(n_queries=9, batch=3, fragments=2, group=3)
    s = Scheduler(p, window=3)
    a = s.next_task(0)
    b = s.next_task(1)
    assert {a.fragment, b.fragment} == {0, 1}
    s.search_done(a, searched(fake_hits(a, p)))
    again = s.next_task(0)
    assert isinstance(again, SearchTask) and again.fragment == a.fragment


def test_preload_skips_search():
    p = plan()
    s = Scheduler(p)
    s.preload([[1], [2], [], [3], [4], [5]])
    tasks = [s.next_task(0) for _ in range(3)]
    assert all(isinstance(t, PieceTask) for t in tasks)
    assert tasks[0].subjects == ((1,), (2,))


def test_wrong_hit_count_is_an_error():
    p = plan()
    s = Scheduler(p)
    t = s.next_task(0)
    with pytest.raises(ValueError):
        s.search_done(t, searched([]))


def test_kept_alignments_follow_the_merged_order_into_regeneration_tasks():
    p = dataclasses.replace(plan(n_queries=2, batch=2, fragments=2, group=2), hitlist_size=5)
    s = Scheduler(p, keep_alignments=True)
    for _ in range(2):
        task = s.next_task(0)
        assert isinstance(task, SearchTask)
        s.search_done(
            task,
            searched([[Hit(10.0 ** -(5 + task.fragment), 50, 10 * q + task.fragment, b"aln %d/%d" % (q, task.fragment))]
             for q in range(2)]),
        )  # fmt: skip
    regen = s.next_task(0)
    assert isinstance(regen, PieceTask)
    assert regen.subjects == ((1, 0), (11, 10))
    assert regen.alignments == ((b"aln 0/1", b"aln 0/0"), (b"aln 1/1", b"aln 1/0"))


def test_stored_alignments_stay_out_of_the_tasks_and_a_piece_searched_again_is_not_rendered():
    # query 0 fills its hit list (2 hits at hitlist 2): searched again, so piece 0 is not rendered;
    # query 2 does not: piece 1 is written from the alignments the store holds
    p = plan(n_queries=4, batch=4, fragments=2, group=2)
    s = Scheduler(p, keep_alignments=True, alignments_stored=True)
    for _ in range(2):
        task = s.next_task(0)
        assert isinstance(task, SearchTask)
        hits = [
            [Hit(1e-9, 50, 10 * q + task.fragment)] if q == 0 or task.fragment == 0 else [] for q in range(4)
        ]
        s.search_done(task, searched(hits))
    pieces = sorted((s.next_task(0), s.next_task(0)), key=lambda t: t.piece)
    assert [(t.piece, t.stored, t.renderable, t.alignments) for t in pieces] == [
        (0, None, False, None),
        (1, ((20,), (30,)), True, None),
    ]
    assert s.searched_again == 1 and s._alignments == {}


def test_alignments_are_not_kept_unless_asked():
    s = Scheduler(plan())
    drive(s, workers=1)
    assert s._alignments == {}


def test_plan_for_archive_reports_uses_large_shrinking_batches_and_half_batch_groups():
    from paramedic.engine.core.plan import make_plan

    common = dict(program="blastp", query_lengths=[300] * 500, fragment_residues=[2_000_000] * 4, workers=2,
                  hitlist_size=500, startup_seconds=0.04, stitchable=True)  # fmt: skip
    by_search = make_plan(**common)
    rendered = make_plan(**common, keep_alignments=True)
    sizes = [len(b) for b in rendered.batches]
    assert sizes[:4] == [167, 167, 55, 55] and max(sizes[4:]) < 40  # 2/3 of the rest a round; a sliver joins
    halves = [half for b in rendered.batches for half in (b[: (len(b) + 1) // 2], b[(len(b) + 1) // 2 :])]
    assert rendered.pieces == tuple(h for h in halves if len(h))
    assert len(by_search.batches) > len(rendered.batches) and len(by_search.pieces[0]) == 10
    fives = make_plan(**common, keep_alignments=True, piece_queries=5)
    assert len(fives.pieces) == sum(-(-len(b) // 5) for b in fives.batches)  # groups never span batches


def _makespan(pieces, lengths, workers, per_run=0.05, per_residue=4e-4):
    """Greedy list scheduling, as the master hands out pieces: finish time of the busiest worker."""
    busy = [0.0] * workers
    for piece in pieces:
        busy[busy.index(min(busy))] += per_run + per_residue * sum(lengths[q] for q in piece)
    return max(busy), sum(busy) / workers


def test_query_segmentation_pieces_shrink_so_workers_finish_together():
    import random

    from paramedic.engine.core.plan import make_plan, smallest_piece_residues

    rng = random.Random(7)
    lengths = [int(rng.lognormvariate(5.8, 0.7)) + 20 for _ in range(500)]  # like mmseqs2 QUERY.fasta
    common = dict(program="blastp", query_lengths=lengths, fragment_residues=[9_000_000], workers=2,
                  hitlist_size=500, startup_seconds=0.04, stitchable=True, query_segmentation=True)  # fmt: skip
    plan = make_plan(**common)
    sizes = [sum(lengths[q] for q in piece) for piece in plan.pieces]
    assert plan.query_segmentation and plan.pieces == plan.batches
    assert max(sizes) in sizes[:2] and min(sizes[:2]) > 10 * sizes[-1]  # the first round holds the largest
    smallest = smallest_piece_residues("blastp", 9_000_000, 0.04)
    assert all(size >= smallest / 2 for size in sizes)
    assert len(plan.pieces) < 30  # few BLAST+ runs
    longest, mean = _makespan(plan.pieces, lengths, 2)
    assert longest < 1.01 * mean
    # equal pieces of 25 queries leave one worker idle at the end
    equal = make_plan(**common, batch=25).pieces
    assert _makespan(equal, lengths, 2)[0] > longest


def test_blastn_tasks_pay_a_database_scan_so_many_queries_make_few_tasks():
    """blastn scans the whole database in every run (plan.SCAN): 500 queries against 306 Mbp in 8 tasks
    cost 8.07 s of CPU against 5.65 s in 2 (bench/scan_cost.py). The plan makes one task per worker for
    them, and leaves 20 queries, whose share costs less than its scan, in one piece."""
    from paramedic.engine.core.plan import make_plan

    def pieces(n: int, workers: int = 2) -> tuple[range, ...]:
        return make_plan(program="blastn", query_lengths=[2000] * n, fragment_residues=[38_000_000] * 8,
                         workers=workers, hitlist_size=500, startup_seconds=0.05, stitchable=True,
                         query_segmentation=True).pieces  # fmt: skip

    assert [len(p) for p in pieces(500)] == [250, 250]
    assert [len(p) for p in pieces(500, workers=4)] == [125] * 4
    assert pieces(20) == (range(0, 20),)
    # without the scan (blastp: its work is per query), the same queries are cut finer, as before
    blastp = make_plan(program="blastp", query_lengths=[400] * 500, fragment_residues=[9_000_000], workers=2,
                       hitlist_size=500, startup_seconds=0.05, stitchable=True, query_segmentation=True)  # fmt: skip
    assert len(blastp.pieces) > 4


def test_query_segmentation_keeps_unstitchable_formats_in_one_piece():
    from paramedic.engine.core.plan import make_plan

    plan = make_plan(program="blastp", query_lengths=[300] * 50, fragment_residues=[9_000_000], workers=2,
                     hitlist_size=500, startup_seconds=0.04, stitchable=False, query_segmentation=True)  # fmt: skip
    assert plan.pieces == (range(0, 50),)


def test_batches_and_pieces_start_where_blast_starts_a_batch():
    from paramedic.blast.prelim import query_batches
    from paramedic.engine.core.plan import make_plan

    lengths = [((i * 7919) % 900) + 50 for i in range(400)]
    blast_batches = query_batches(lengths, 10000)
    starts = {b.start for b in blast_batches}
    common = dict(program="blastp", query_lengths=lengths, fragment_residues=[2_000_000] * 4, workers=2,
                  hitlist_size=500, startup_seconds=0.04, stitchable=True)  # fmt: skip
    for extra in (
        {},
        {"keep_alignments": True},
        {"query_segmentation": True},
        {"batch": 7, "piece_queries": 3},
    ):
        plan = make_plan(**common, **extra, blast_batches=blast_batches)
        assert {b.start for b in plan.batches} <= starts, extra
        assert {p.start for p in plan.pieces} <= starts, extra
        batch_starts = {b.start for b in plan.batches}
        for piece in plan.pieces:  # a piece never spans two search batches
            assert not any(piece.start < s < piece.stop for s in batch_starts), extra
        if "query_segmentation" not in extra:  # (query segmentation cuts whole batches: next test)
            unaligned = make_plan(**common, **extra)
            assert len(plan.batches) <= len(unaligned.batches) and len(plan.pieces) <= len(unaligned.pieces)


def test_query_segmentation_shrinks_whole_blast_batches_down_to_one():
    """Pieces of whole BLAST+ batches, shrinking by half of the rest a round: the last pieces are single
    batches, so the workers end together within about one batch (moving the cuts of query-sized pieces
    to batch starts merged the small last pieces into large ones)."""
    import random

    from paramedic.blast.prelim import query_batches
    from paramedic.engine.core.plan import (
        ROUND_SHARE,
        aligned,
        decreasing_pieces,
        make_plan,
        smallest_piece_residues,
    )

    lengths = [((i * 7919) % 900) + 50 for i in range(500)]
    blast_batches = query_batches(lengths, 10000)
    plan = make_plan(program="blastp", query_lengths=lengths, fragment_residues=[9_000_000], workers=2,
                     hitlist_size=500, startup_seconds=0.04, stitchable=True, query_segmentation=True,
                     blast_batches=blast_batches)  # fmt: skip
    batches_in = [sum(1 for b in blast_batches if p.start <= b.start < p.stop) for p in plan.pieces]
    assert plan.pieces[0].start == 0 and plan.pieces[-1].stop == len(lengths)
    assert all(a.stop == b.start for a, b in zip(plan.pieces, plan.pieces[1:], strict=False))
    assert batches_in[-2:] == [1, 1] and batches_in[0] > 4
    smallest = smallest_piece_residues("blastp", 9_000_000, 0.04)
    before = aligned(decreasing_pieces(lengths, 2, smallest, ROUND_SHARE), blast_batches)
    # a query's real cost is not its length: over seeded draws of per-query noise, the new plan's
    # busiest worker ends earlier on average than the old one's (costs exactly by length favour neither)
    rng = random.Random(3)
    over = {"new": 0.0, "before": 0.0}
    for _ in range(50):
        cost = [n * rng.lognormvariate(0, 0.3) for n in lengths]
        for name, pieces in (("new", plan.pieces), ("before", before)):
            longest, mean = _makespan(pieces, cost, 2, per_residue=4e-4)
            over[name] += longest / mean - 1
    assert over["new"] < over["before"]


def test_replica_groups_keep_each_worker_on_its_share_of_the_database():
    # 4 fragments, groups of 2 workers: workers 1 and 3 hold fragments 0 and 2, workers 2 and 4 hold 1, 3
    p = plan(n_queries=8, batch=2, fragments=4, group=2)
    s = Scheduler(p, window=4, replica_group=2)
    handed = {w: [] for w in (1, 2, 3, 4)}
    for _ in range(4):
        for w in (1, 2, 3, 4):
            task = s.next_task(w)
            assert isinstance(task, SearchTask)
            handed[w].append(task.fragment)
    homes = {1: {0, 2}, 2: {1, 3}, 3: {0, 2}, 4: {1, 3}}
    assert all(set(handed[w]) <= homes[w] for w in homes), handed
    assert s.home(1) == {0, 2} and Scheduler(p).home(1) == set()
    # worker 3 after worker 1: its home (a fragment of its copy), not the next fragment no one holds
    grouped, plain = Scheduler(p, window=4, replica_group=2), Scheduler(p, window=4)
    assert [grouped.next_task(w).fragment for w in (1, 3)] == [0, 2]
    assert [plain.next_task(w).fragment for w in (1, 3)] == [0, 1]


# -- fragment groups (paramedic.engine.core.plan) ------------------------------------------------------------
@pytest.mark.parametrize(
    ("fragments", "batches", "workers", "even", "units"),
    [
        (8, 1, 2, False, 4),  # one batch: twice the workers, a slow rank's share moves to the others
        (8, 1, 2, True, 2),  # even: one search per worker and batch
        (8, 2, 2, False, 2),  # two batches: one search per worker and batch
        (8, 10, 2, False, 2),
        (8, 1, 16, False, 8),  # never more than the fragments
        (8, 1, 16, True, 8),
        (64, 3, 16, False, 16),
        (64, 1, 16, True, 16),
        (1, 1, 2, False, 1),
        (1, 1, 2, True, 1),
    ],
)
def test_search_units_keep_every_worker_busy_with_few_searches(
    fragments: int, batches: int, workers: int, even: bool, units: int
) -> None:
    assert search_units(fragments, batches, workers, even) == units


@pytest.mark.parametrize(
    ("program", "query_residues", "database_residues", "startup", "one"),
    [
        ("blastn", 34586, 306_000_000, 0.04, True),  # short megablast searches: a start is over 5%
        ("blastn", 2519, 306_000_000, 0.04, True),
        ("blastp", 621, 178_000_000, 0.04, False),  # 2.5 s searches: a start is under 5%
        ("blastp", 14749, 178_000_000, 0.04, False),
        ("blastp", 621, 178_000_000, 0.2, True),  # a slow start (a loaded machine) tips it
    ],
)
def test_one_search_per_worker_when_a_start_is_a_large_share_of_a_search(
    program: str, query_residues: int, database_residues: int, startup: float, one: bool
) -> None:
    assert one_search_per_worker(program, query_residues, database_residues, 2, startup) is one


@pytest.mark.parametrize(
    ("residues", "units", "groups"),
    [
        ([10] * 8, 2, ((0, 1, 2, 3), (4, 5, 6, 7))),
        ([10] * 8, 3, ((0, 1, 2), (3, 4), (5, 6, 7))),  # cuts nearest 26.7 and 53.3: 30, 20, 30
        # fragments a few residues short of an even eighth (makeblastdb's balance of 325 Mbp): the cut
        # nearest each share, not the first past it (which gave 3, 2, 2, 1 and 5, 3)
        ([38273608] * 2 + [38274354] * 6, 4, ((0, 1), (2, 3), (4, 5), (6, 7))),
        ([38273608] * 2 + [38274354] * 6, 2, ((0, 1, 2, 3), (4, 5, 6, 7))),
        ([9] + [10] * 7, 4, ((0, 1), (2, 3), (4, 5), (6, 7))),
        ([10] * 3, 3, ((0,), (1,), (2,))),
        ([100, 1, 1, 1], 2, ((0,), (1, 2, 3))),  # cut by residues
        ([1, 1, 1, 100], 3, ((0, 1), (2,), (3,))),  # every group gets a fragment
    ],
)
def test_fragment_groups_are_consecutive_and_even_by_residues(
    residues: list[int], units: int, groups: tuple[tuple[int, ...], ...]
) -> None:
    assert fragment_groups(residues, units) == groups


def test_grouping_follows_the_batches() -> None:
    common = dict(
        program="blastp", query_lengths=[300] * 40, fragment_residues=[10**7] * 8, workers=2, hitlist_size=500,
        startup_seconds=0.05, stitchable=True, blast_batches=[range(0, 34), range(34, 40)], traceback_once=True,
    )  # fmt: skip
    plain = make_plan(**common)  # type: ignore[arg-type]
    grouped = group(plain, [10**7] * 8, 2)
    assert plain.n_fragments == 8 and not plain.groups
    assert grouped.batches == plain.batches and grouped.pieces == plain.pieces
    assert grouped.n_fragments == search_units(8, len(plain.batches), 2) == len(grouped.groups)
    assert grouped.database_fragments == 8
    assert [f for u in range(grouped.n_fragments) for f in grouped.fragments_of(u)] == list(range(8))


@pytest.mark.parametrize("groups", [((0, 1), (3,)), ((1,), (0,)), ((0,), ()), ((0, 1),)])
def test_a_plan_refuses_groups_that_do_not_cover_the_fragments_in_order(groups: tuple) -> None:
    with pytest.raises(ValueError, match="fragment groups"):
        Plan(batches=(range(0, 1),), n_fragments=2, pieces=(range(0, 1),), hitlist_size=5, groups=groups)
