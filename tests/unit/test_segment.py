import pytest

from paramedic.db.segment import assign_fragments


def test_largest_first_into_smallest_fragment():
    lengths = [10, 50, 30, 40, 20]
    members = assign_fragments(lengths, 2)
    # LPT: 50->A, 40->B, 30->B(40<50), 20->A(50<70), 10->A(70=70 -> first fragment)
    assert members == [[0, 1, 4], [2, 3]]
    assert sorted(g for m in members for g in m) == list(range(5))


def test_balance_and_order_within_fragments():
    lengths = [(i * 7919) % 1000 + 1 for i in range(5000)]
    members = assign_fragments(lengths, 7)
    sizes = [sum(lengths[g] for g in m) for m in members]
    assert max(sizes) - min(sizes) <= max(lengths)
    assert all(m == sorted(m) for m in members)


def test_refuses_impossible_counts():
    with pytest.raises(ValueError):
        assign_fragments([5, 6], 3)
    with pytest.raises(ValueError):
        assign_fragments([5], 0)
