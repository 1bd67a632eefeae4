"""Output strategies as pure bookkeeping (paramedic.output.strategies): offsets as a prefix sum in piece
order whatever order the sizes arrive in, the orders each strategy makes; and stitching a piece alone
(paramedic.output.stitch.stitch_alone) gives the ordered Stitcher's bytes."""

from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path

import pytest

from paramedic.output import strategies
from paramedic.output.stitch import AgreementCheck, Stitcher, stitch_alone
from paramedic.output.strategies import (
    MASTER,
    Merge,
    Send,
    Write,
    output_strategy,
    output_strategy_names,
)


def test_registry_lists_master_first() -> None:
    assert output_strategy_names() == (MASTER, "worker-individual", "worker-collective", "worker-merge")
    assert not output_strategy(MASTER).workers_write


def test_a_strategy_in_a_module_of_its_own_is_one_line_in_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/CONTRIBUTING.md "Add an output strategy": the module imports strategies (so strategies cannot
    import it at its top: import-linter refuses the cycle); its line in PLUGINS has it imported, and so
    registered, when the choices are first asked for."""
    (tmp_path / "pairs_strategy.py").write_text(
        textwrap.dedent(
            """
            from paramedic.output.strategies import OutputStrategy, register_output_strategy

            @register_output_strategy
            class Pairs(OutputStrategy):
                name = "worker-pairs"
                help = "a test's strategy"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(strategies, "OUTPUT_STRATEGIES", dict(strategies.OUTPUT_STRATEGIES))
    monkeypatch.setattr(strategies, "PLUGINS", ("pairs_strategy",))
    try:
        assert "pairs_strategy" not in sys.modules
        assert output_strategy_names()[-1] == "worker-pairs"
        assert output_strategy("worker-pairs").__module__ == "pairs_strategy"
    finally:
        sys.modules.pop("pairs_strategy", None)


@pytest.mark.parametrize("seed", range(5))
def test_offsets_are_the_prefix_sum_whatever_the_arrival_order(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(0, 50) for _ in range(20)]
    plan = output_strategy("worker-individual")(len(sizes))
    order = list(range(len(sizes)))
    rng.shuffle(order)
    writes: dict[int, Write] = {}
    for piece in order:
        plan.held(piece, sizes[piece], holder=1 + piece % 3)
        for rank, orders in plan.take().items():
            for o in orders:
                assert isinstance(o, Write) and rank == 1 + o.piece % 3
                writes[o.piece] = o
        # a piece is placed exactly when every earlier piece's size is known
        assert set(writes) == set(range(plan.next))
    assert plan.complete and plan.total == sum(sizes)
    assert [writes[i].offset for i in range(len(sizes))] == [sum(sizes[:i]) for i in range(len(sizes))]


def test_a_piece_reported_twice_is_refused() -> None:
    plan = output_strategy("worker-individual")(2)
    plan.held(0, 5, 1)
    with pytest.raises(ValueError):
        plan.held(0, 5, 2)


def test_merge_segments_are_bounded_and_written_by_the_largest_holder(monkeypatch) -> None:
    monkeypatch.setenv("PARAMEDIC_OUTPUT_BUFFER", "100")
    plan = output_strategy("worker-merge")(5)
    for piece, (size, holder) in enumerate([(30, 1), (50, 2), (10, 1), (90, 3), (200, 0)]):
        plan.held(piece, size, holder)
    orders = plan.take()
    # segment 1: pieces 0-2 (90 bytes), rank 2 holds most; segment 2: piece 3 alone; rank 0's own piece
    assert orders[1] == [Send(0, 2), Send(2, 2)]
    assert orders[2] == [Merge(0, ((0, 1, 30), (1, 2, 50), (2, 1, 10)))]
    assert orders[3] == [Merge(90, ((3, 3, 90),))]
    assert orders[0] == [Write(4, 180)]


def test_collective_rounds_give_every_rank_a_share(monkeypatch) -> None:
    monkeypatch.setenv("PARAMEDIC_OUTPUT_BUFFER", "50")
    plan = output_strategy("worker-collective")(3)
    plan.held(1, 40, 2)
    assert not plan.round_due  # piece 1 is not placed before piece 0
    plan.held(0, 20, 1)
    assert plan.round_due
    shares = plan.start_round(4)
    assert shares is not None and sorted(shares) == [0, 1, 2, 3]
    assert shares[1].writes == (Write(0, 0),) and shares[2].writes == (Write(1, 20),)
    assert shares[0].writes == () and shares[3].writes == ()
    plan.held(2, 5, 3)
    last = plan.start_round(4)
    assert last is not None and last[3].writes == (Write(2, 60),) and last[3].number == 1
    assert plan.start_round(4) is None


XML_HEAD = (
    b'<?xml version="1.0"?>\n<BlastOutput>\n  <BlastOutput_query-ID>Query_1</BlastOutput_query-ID>\n'
    b"<BlastOutput_iterations>\n"
)
XML_END = b"</BlastOutput_iterations>\n</BlastOutput>\n"


def xml_piece(n: int) -> bytes:
    body = b"".join(
        b"<Iteration>\n  <Iteration_iter-num>%d</Iteration_iter-num>\n"
        b"  <Iteration_query-ID>Query_%d</Iteration_query-ID>\n</Iteration>\n" % (i, i)
        for i in range(1, n + 1)
    )
    return XML_HEAD + body + XML_END


def test_stitching_alone_gives_the_ordered_bytes() -> None:
    counts = [2, 1, 3]
    pieces = [xml_piece(n) for n in counts]
    ordered = Stitcher("5", 3)
    starts = [0, 2, 3]
    expected = b"".join(ordered.piece(i, p, starts[i], 6) for i, p in enumerate(pieces))
    check = AgreementCheck()
    alone = []
    for i in (2, 0, 1):
        out, agreement = stitch_alone("5", 3, i, pieces[i], starts[i], counts[i], 6)
        check.add(i, agreement)
        alone.append((i, out))
    assert b"".join(out for _, out in sorted(alone)) == expected


def test_pieces_that_disagree_are_refused() -> None:
    check = AgreementCheck()
    _, first = stitch_alone("5", 2, 0, xml_piece(1), 0, 1, 2)
    other = xml_piece(1).replace(b"<BlastOutput>\n", b"<BlastOutput>\n  <BlastOutput_db>x</BlastOutput_db>\n")
    _, second = stitch_alone("5", 2, 1, other, 1, 1, 2)
    check.add(0, first)
    with pytest.raises(ValueError, match="header"):
        check.add(1, second)
    with pytest.raises(ValueError, match="holds 1 queries, the plan 2"):
        stitch_alone("5", 2, 0, xml_piece(1), 0, 2, 3)
