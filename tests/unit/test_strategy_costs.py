"""--strategy auto's cost model (issue 44): the choice follows the model's predictions on synthetic cost
tables, one BLAST+ run is a candidate only where its output is the job's, -mt_mode 1 only where it keeps
BLAST+'s bytes, and the run record lists every plan weighed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from paramedic.engine.core.costs import Costs, Shape, busiest_share, cheapest, mt_mode_allowed, predict
from paramedic.engine.core.settings import SearchSettings
from paramedic.engine.core.strategy import (
    QUERIES_BALANCE_LIMIT,
    StrategyChoice,
    WorkerMemory,
    blast_refusal,
    decide,
    query_balance,
    weigh,
)

MiB = 1 << 20
GiB = 1 << 30
MEMORY = WorkerMemory(8 * GiB, 16 * GiB, 2, "2 cores")

# one second of single-thread search per 10^9 residue pairs: easy to read
FLAT = Costs(
    mt0_efficiency=1.0,
    mt1_efficiency=1.0,
    engine_seconds=0.0,
    regenerate_pairwise_share=0.0,
    regenerate_tabular_share=0.0,
    merge_seconds_per_query=0.0,
    rates={"blastp": 1e-9},
    scans={},
)


def shape(**changes: object) -> Shape:
    base = Shape(
        program="blastp",
        query_residues=10_000,
        database_residues=100_000,  # 1 s of work
        cores=2,
        blast_batches=(10_000,),
        outfmt=0,
        startup_seconds=0.0,
        queries=20,
        queries_tasks=2,
        queries_balance=1.0,
        fragment_searches=4,
        pairwise=True,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def engine_choice(strategy: str = "fragments"):  # what decide's rule admitted
    sizes = {"database_bytes": 10 * MiB, "fragment_bytes": [MiB] * 4, "memory": MEMORY}
    return decide(strategy, **sizes) if strategy != "auto" else decide("auto", **sizes)  # type: ignore[arg-type]


def auto(strategy: str):
    """decide's choice of `strategy`, as asked by auto."""
    return replace(engine_choice(strategy), asked="auto", reason=f"the rule chose {strategy}")


def test_the_model_in_numbers() -> None:
    p = predict(shape(), FLAT)
    assert p["blast"].seconds == pytest.approx(0.5) and p["blast"].mt_mode == 0
    assert p["queries"].seconds == pytest.approx(0.5)
    assert p["fragments"].seconds == pytest.approx(0.5)
    costs = replace(FLAT, mt0_efficiency=0.5, engine_seconds=0.1, regenerate_pairwise_share=0.2)
    p = predict(shape(startup_seconds=0.05, queries_balance=1.5), costs)
    assert p["blast"].seconds == pytest.approx(0.05 + 1.0)  # threads at half their worth
    assert p["queries"].seconds == pytest.approx(0.1 + 0.05 + 0.75)  # one task a worker, the busiest 1.5x
    assert p["fragments"].seconds == pytest.approx(0.1 + (1.2 + 4 * 0.05) / 2)


@pytest.mark.parametrize(
    ("efficiency", "engine", "expected"),
    [(1.0, "fragments", "blast"), (0.5, "fragments", "fragments"), (0.5, "queries", "queries")],
)
def test_auto_takes_the_cheapest_candidate(efficiency: float, engine: str, expected: str) -> None:
    costs = replace(FLAT, mt0_efficiency=efficiency, engine_seconds=0.01)
    chosen = weigh(auto(engine), shape(), None, costs)
    assert chosen.strategy == expected
    assert chosen.whole_blast == (expected == "blast")
    record = chosen.record()
    plans = {p["plan"]: p for p in record["plans"]}
    assert set(plans) == {"blast", "queries", "fragments"} and record["chosen"] == expected
    candidates = {name for name, p in plans.items() if p["candidate"]}
    assert candidates == {"blast", engine}
    assert min(candidates, key=lambda n: plans[n]["predicted_seconds"]) == expected
    other = ({"queries", "fragments"} - {engine}).pop()
    assert "auto's rule for the engine's own plans chose" in plans[other]["why_not"]


def test_a_refused_blast_run_is_not_taken_however_cheap() -> None:
    chosen = weigh(auto("fragments"), shape(), "--metadata saves the merged hits", FLAT)
    assert chosen.strategy == "fragments"
    blast = next(p for p in chosen.record()["plans"] if p["plan"] == "blast")
    assert blast["candidate"] is False and blast["why_not"].startswith("--metadata")
    assert "one BLAST+ run is not a candidate: --metadata" in chosen.reason


def test_a_strategy_asked_by_name_is_not_weighed() -> None:
    asked = engine_choice("fragments")
    assert weigh(asked, shape(), None, FLAT) is asked and "plans" not in asked.record()


def test_blast_chosen_says_threads_and_mode() -> None:
    chosen = weigh(auto("fragments"), shape(cores=4, queries_balance=1.3), None, FLAT)
    assert (chosen.strategy, chosen.threads, chosen.mt_mode) == ("blast", 4, 0)
    assert "one BLAST+ run (-num_threads 4, -mt_mode 0)" in chosen.reason


def test_mt_mode_1_only_where_it_keeps_blasts_bytes_and_pays() -> None:
    many = tuple([10_000] * 20)  # 20 BLAST+ batches: split by queries, evenly
    costs = replace(FLAT, mt0_efficiency=0.8, mt1_efficiency=0.95)
    assert predict(shape(outfmt=6, blast_batches=many, query_residues=200_000), costs)["blast"].mt_mode == 1
    for outfmt in (0, 5, 7):  # a header or a footer per thread batch
        assert predict(shape(outfmt=outfmt, blast_batches=many), costs)["blast"].mt_mode == 0
    assert predict(shape(program="tblastx", outfmt=6, blast_batches=many), costs)["blast"].mt_mode == 0
    # one batch: mode 1 leaves a thread idle
    assert predict(shape(outfmt=6, blast_batches=(10_000,)), costs)["blast"].mt_mode == 0
    assert mt_mode_allowed("blastn", 10) and not mt_mode_allowed("tblastx", 6)
    assert busiest_share((3, 1, 1, 1), 2) == pytest.approx(1.0)
    assert busiest_share((5, 1), 2) == pytest.approx(5 / 3)
    assert busiest_share((), 2) == 2.0


def test_ties_go_to_the_first_candidate() -> None:
    p = predict(shape(), FLAT)
    assert cheapest(p, ["blast", "fragments"]) == "blast"
    assert cheapest(p, ["queries", "blast"]) == "queries"


def settings(**changes: object) -> SearchSettings:
    return SearchSettings(program="blastp", blast_args=["-db", "d", "-out", "o"], **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"save_metadata": Path("m.json")}, "--metadata"),
        ({"from_metadata": Path("m.json")}, "--from-metadata"),
        ({"partition_size": 2}, "--partition-size"),
        ({"replica_group_size": 2}, "--replica-group-size"),
        ({"traceback": "once"}, "--traceback once"),
        ({"fragment_groups": "off"}, "--fragment-groups off"),
        ({"batch": 5}, "--batch"),
        ({"piece_queries": 5}, "--regen-batch"),
    ],
)
def test_what_only_the_engine_does_refuses_blast(changes: dict[str, object], said: str) -> None:
    refused = blast_refusal(settings(**changes), True, None, MiB, MEMORY)
    assert refused is not None and refused.startswith(said)


def test_blast_refused_off_one_node_with_a_journal_or_without_memory(tmp_path: Path) -> None:
    assert blast_refusal(settings(), True, None, MiB, MEMORY) is None
    assert blast_refusal(settings(), False, None, MiB, MEMORY) == "the job's ranks are on several nodes"
    journal = tmp_path / ".o.journal"
    assert blast_refusal(settings(), True, journal, MiB, MEMORY) is None  # none kept
    journal.mkdir()
    assert "journal" in (blast_refusal(settings(), True, journal, MiB, MEMORY) or "")
    assert "does not fit" in (blast_refusal(settings(), True, None, 9 * GiB, MEMORY) or "")
    assert "@PG" in (blast_refusal(settings(), True, None, MiB, MEMORY, outfmt=17) or "")
    limited = replace(MEMORY, cgroup_limit=GiB)
    assert "does not fit" in (blast_refusal(settings(), True, None, GiB, limited) or "")


# -- fragments or queries: the cost model's choice too, where the rule admits both --------------------

SIZES = {"database_bytes": 10 * MiB, "fragment_bytes": [MiB] * 4}


def rule(memory: WorkerMemory = MEMORY, **given: object) -> StrategyChoice:
    return decide("auto", **SIZES, memory=memory, **given)  # type: ignore[arg-type]


def test_the_rule_admits_both_engine_plans_only_where_both_run_exactly_in_memory() -> None:
    uneven = query_balance([9, 1], 2)  # the busiest worker 1.8x an even share: the rule says fragments
    assert rule().both_engine_plans and rule().strategy == "queries"
    assert rule(balance=uneven).both_engine_plans and rule(balance=uneven).strategy == "fragments"
    small = WorkerMemory(8 * MiB, 16 * MiB, 2, "2 cores")  # the database does not fit a worker's share
    assert not rule(small).both_engine_plans
    assert not rule(WorkerMemory(None, None, 2, "2 cores")).both_engine_plans
    assert not rule(inexact="cannot split -max_target_seqs 0").both_engine_plans
    assert not rule(needs_metadata=True).both_engine_plans
    assert not decide("queries", **SIZES, memory=MEMORY).both_engine_plans  # type: ignore[arg-type]


# Synthetic cost tables: (engine start, pairwise regeneration share, BLAST+ start) x the shape's query
# balance; one BLAST+ run is refused (as off one node), so the engine plans are the candidates
TABLES = [
    (engine, regenerate, start, balance)
    for engine in (0.0, 0.2)
    for regenerate in (0.0, 0.3)
    for start in (0.0, 0.05, 0.5)
    for balance in (1.0, 1.3, 2.0)
]


@pytest.mark.parametrize(("engine", "regenerate", "start", "balance"), TABLES)
def test_fragments_or_queries_follows_the_model(
    engine: float, regenerate: float, start: float, balance: float
) -> None:
    costs = replace(FLAT, engine_seconds=engine, regenerate_pairwise_share=regenerate)
    job = shape(startup_seconds=start, queries_balance=balance, queries_tasks=2 if balance < 2 else 1)
    predicted = predict(job, costs)
    expected = min(("queries", "fragments"), key=lambda p: predicted[p].seconds)
    uneven = query_balance([9, 1], 2) if balance > QUERIES_BALANCE_LIMIT else None
    chosen = weigh(rule(balance=uneven), job, "the job's ranks are on several nodes", costs)
    if predicted["queries"].seconds == predicted["fragments"].seconds:
        expected = rule(balance=uneven).strategy  # a tie: the rule's own pick
    assert chosen.strategy == expected
    plans = {p["plan"]: p for p in chosen.record()["plans"]}
    assert (
        plans["queries"]["candidate"] and plans["fragments"]["candidate"] and not plans["blast"]["candidate"]
    )
    assert plans[expected]["predicted_seconds"] == min(
        plans["queries"]["predicted_seconds"], plans["fragments"]["predicted_seconds"]
    )


def test_the_other_engine_plan_wins_where_the_model_says_so() -> None:
    # the rule picks fragments for 2 tasks split 1.8x; the model, with no regeneration's share and
    # searches that each cost a BLAST+ start, predicts query segmentation faster
    costs = replace(FLAT, regenerate_pairwise_share=0.3)
    job = shape(queries_balance=1.05, startup_seconds=0.2)
    chosen = weigh(rule(balance=query_balance([9, 1], 2)), job, "several nodes", costs)
    assert chosen.strategy == "queries" and not chosen.whole_blast
    assert chosen.reason.startswith("the cost model predicts the queries strategy")
    assert "the rule's pick by balance" in chosen.reason
    # and the other way: a query split the model predicts 2x an even share loses to fragments
    chosen = weigh(rule(), shape(queries_balance=2.0, queries_tasks=1), "several nodes", FLAT)
    assert chosen.strategy == "fragments"


def test_without_both_the_rules_plan_stays_however_the_model_predicts() -> None:
    small = WorkerMemory(8 * MiB, 16 * MiB, 2, "2 cores")  # fragments: the database does not fit
    job = shape(startup_seconds=0.5)  # queries predicted far cheaper (one start a worker)
    assert predict(job, FLAT)["queries"].seconds < predict(job, FLAT)["fragments"].seconds
    chosen = weigh(rule(small), job, "several nodes", FLAT)
    assert chosen.strategy == "fragments"
    queries = next(p for p in chosen.record()["plans"] if p["plan"] == "queries")
    assert queries["candidate"] is False and "auto's rule" in queries["why_not"]


def test_blast_still_wins_where_it_is_cheapest_among_three() -> None:
    chosen = weigh(rule(), shape(), None, replace(FLAT, engine_seconds=0.1))
    assert chosen.strategy == "blast"
    assert {p["plan"] for p in chosen.record()["plans"] if p["candidate"]} == {
        "blast",
        "queries",
        "fragments",
    }


def test_mt_mode_1_needs_the_letters_blast_asks_for_and_pays_its_scans() -> None:
    # under 10,000 residues a thread (proteins) BLAST+ warns mode 1 does not pay: never chosen
    costs = replace(FLAT, mt0_efficiency=0.5, mt1_efficiency=1.0)
    two = (9_999, 9_999)
    assert predict(shape(outfmt=6, blast_batches=two, query_residues=19_998), costs)["blast"].mt_mode == 0
    assert predict(shape(outfmt=6, blast_batches=two, query_residues=20_000), costs)["blast"].mt_mode == 1
    # blastn: 2,500,000 bases a thread; one query of 600 bases is far under (issue 44's n1 shape chose
    # mode 1 on a scan the model divided by the threads)
    blastn = replace(costs, rates={"blastn": 2e-14}, scans={"blastn": 1.3e-9})
    one = shape(
        program="blastn", outfmt=6, blast_batches=(600,), query_residues=600, database_residues=65_000_000
    )
    assert predict(one, blastn)["blast"].mt_mode == 0
    # mode 1's scans: a thread scans the database once per batch of its own, not a share of it
    costs = replace(FLAT, scans={"blastp": 1e-6}, mt0_efficiency=1.0, mt1_efficiency=1.0)
    job = shape(outfmt=6, blast_batches=(10_000, 10_000), query_residues=20_000)
    p = predict(job, costs)
    work, scan = 1e-9 * 20_000 * 100_000, 1e-6 * 100_000
    assert p["blast"].mt_mode == 0 and p["blast"].seconds == pytest.approx((work + 2 * scan) / 2)
    costs = replace(costs, mt0_efficiency=0.5)
    assert predict(job, costs)["blast"].seconds == pytest.approx(work / 2 + scan)  # mode 1: one scan a thread
