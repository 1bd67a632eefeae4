import random

from paramedic.blast.hits import Hit
from paramedic.engine.core.merge import merge_hits


def test_orders_by_evalue_then_score_then_higher_ordinal_first():
    hits = [Hit(1e-10, 50, 3), Hit(1e-20, 40, 1), Hit(1e-10, 60, 2), Hit(1e-10, 50, 7)]
    merged = merge_hits([hits[:2], hits[2:]], 10)
    assert [h.gid for h in merged] == [1, 2, 7, 3]


def test_evalues_within_relative_tolerance_tie():
    a, b = Hit(1.0000001e-5, 30, 1), Hit(1.0e-5, 30, 2)
    assert [h.gid for h in merge_hits([[a], [b]], 5)] == [2, 1]  # tie -> ordinal id descending
    c = Hit(1.01e-5, 99, 3)
    assert [h.gid for h in merge_hits([[c], [b]], 5)] == [2, 3]  # not a tie -> e-value wins over score


def test_trims_to_hitlist_size_and_is_independent_of_fragment_split():
    rng = random.Random(7)
    hits = [Hit(10 ** -rng.randint(1, 30), rng.randint(20, 90), gid) for gid in range(200)]
    whole = merge_hits([hits], 37)
    for n in (2, 3, 7):
        parts = [hits[i::n] for i in range(n)]
        assert merge_hits(parts, 37) == whole
    assert len(whole) == 37
