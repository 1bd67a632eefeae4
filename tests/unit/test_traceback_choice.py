"""Big databases, few queries: the two rules `auto` follows there, as pure functions of sizes.

- `--strategy auto` leaves query segmentation when its tasks (cut only where BLAST+ starts a query
  batch) would load one worker more than QUERIES_BALANCE_LIMIT times an even share;
- `--traceback auto` stops fragment searches after the preliminary stage when the largest piece's
  preliminary lists are at most TRACEBACK_ONCE_SHARE of the database, and never when metadata is asked.
"""

from __future__ import annotations

import pytest

from paramedic.blast.options import BlastOptions
from paramedic.blast.prelim import query_batches
from paramedic.engine.core.plan import make_plan
from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.core.strategy import QUERIES_BALANCE_LIMIT, WorkerMemory, decide, query_balance
from paramedic.engine.job.job import TRACEBACK_ONCE_SHARE, choose_traceback
from paramedic.errors import UsageError

GiB = 1 << 30
PLENTY = WorkerMemory(12 * GiB, 24 * GiB, 2, "2 cores")


def settings(**kwargs: object) -> SearchSettings:
    return SearchSettings(program="blastp", blast_args=[], **kwargs)  # type: ignore[arg-type]


def test_balance_of_two_tasks_of_unequal_size() -> None:
    b = query_balance([10_529, 7_015], workers=2)
    assert (b.tasks, b.busiest, b.total) == (2, 10_529, 17_544)
    assert b.ratio == pytest.approx(10_529 * 2 / 17_544)
    assert "2 tasks for 2 workers" in b.describe() and "1.20x an even share" in b.describe()


def test_balance_places_longest_first_on_the_least_loaded() -> None:
    # 5 | 4 | 4+3 | 5+3 | 4+3+3: greedy, as the master hands tasks to whoever is idle (9+9 exists)
    assert query_balance([5, 4, 3, 3, 3], workers=2).busiest == 10
    assert query_balance([1] * 100, workers=4).ratio == 1.0
    assert query_balance([7], workers=2).ratio == 2.0  # one task: one worker searches, one waits


def test_few_batches_take_fragments_though_the_database_fits() -> None:
    few = query_balance([10_000, 7_000], workers=2)
    c = decide("auto", database_bytes=1 << 20, fragment_bytes=[1 << 18] * 4, memory=PLENTY, balance=few)
    assert c.strategy == "fragments" and "busiest worker would search 1.18x" in c.reason


def test_many_batches_keep_queries_when_the_database_fits() -> None:
    many = query_balance([1_000] * 50, workers=2)
    assert many.ratio <= QUERIES_BALANCE_LIMIT
    c = decide("auto", database_bytes=1 << 20, fragment_bytes=[1 << 18] * 4, memory=PLENTY, balance=many)
    assert c.strategy == "queries"


def test_balance_never_overrides_an_asked_strategy_or_exactness() -> None:
    one = query_balance([7], workers=2)
    asked = decide("queries", database_bytes=1, fragment_bytes=[1], memory=PLENTY, balance=one)
    assert asked.strategy == "queries"
    inexact = decide(
        "auto", database_bytes=1, fragment_bytes=[1], memory=PLENTY, balance=one, inexact="cannot cull"
    )
    assert inexact.strategy == "queries"


def test_balance_from_the_query_segmentation_plan_follows_blast_batches() -> None:
    """The figures auto weighs are the plan's own: 20 queries of BLAST+'s two batches make two tasks."""
    lengths = [877] * 20
    batches = query_batches(lengths, 10_000)
    plan = make_plan(
        "blastp", lengths, [1_000_000] * 8, 2, 500, 0.05, True, query_segmentation=True,
        blast_batches=batches,
    )  # fmt: skip
    assert [len(p) for p in plan.pieces] == [len(b) for b in batches] == [12, 8]
    balance = query_balance([sum(lengths[q] for q in p) for p in plan.pieces], 2)
    assert balance.ratio == pytest.approx(1.2)


BIG = 420_000  # sequences: 12 queries x 1,050 = 3% of it
OPTIONS = BlastOptions({})


@pytest.mark.parametrize(
    ("nseq", "once"),
    [(BIG, True), (12 * 1050 * 10, True), (12 * 1050 * 10 - 1, False), (20_000, False)],
)
def test_traceback_once_at_most_a_tenth_of_the_database(nseq: int, once: bool) -> None:
    lengths = [877] * 20
    chosen, reason = choose_traceback(
        settings(), "blastp", OPTIONS, lengths, query_batches(lengths, 10_000), nseq, metadata=False
    )
    assert TRACEBACK_ONCE_SHARE == 0.1
    assert chosen is once
    assert f"12 queries x 1,050 subjects) are {12 * 1050 / nseq:.1%} of the database's {nseq:,}" in reason


def test_traceback_auto_keeps_per_fragment_for_metadata_and_tblastx() -> None:
    lengths = [300]
    assert choose_traceback(settings(), "blastp", OPTIONS, lengths, [range(1)], BIG, metadata=True) == (
        False,
        "metadata is asked (shipped, saved or used): the merged hits, which fragments align",
    )
    assert not choose_traceback(settings(), "tblastx", OPTIONS, lengths, [range(1)], BIG, False)[0]


def test_traceback_asked_is_kept_and_said() -> None:
    once = choose_traceback(settings(traceback="once"), "blastp", OPTIONS, [3], [range(1)], 10, True)
    assert once == (True, "--traceback once was asked")
    per = choose_traceback(settings(traceback="per-fragment"), "blastp", OPTIONS, [3], [], BIG, False)
    assert per == (False, "--traceback per-fragment was asked")


def test_traceback_settings_refuse_nonsense() -> None:
    with pytest.raises(UsageError, match="choose auto, once, per-fragment"):
        settings(traceback="twice")
    with pytest.raises(UsageError, match="--strategy queries searches no fragments"):
        settings(traceback="once", strategy="queries")
