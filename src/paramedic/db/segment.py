"""Splitting a database into fragments balanced by residues, as mpiformatdb does.

Largest sequence first, each into the fragment with the fewest residues so far (the LPT rule). Inside a
fragment the sequences keep their original relative order, so ties broken by ordinal id inside BLAST+ and
in the merge agree.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def assign_fragments(lengths: Sequence[int], n_fragments: int) -> list[list[int]]:
    """Global ordinal ids per fragment, each list ascending. Every fragment gets at least one sequence."""
    if n_fragments < 1:
        raise ValueError("need at least one fragment")
    if n_fragments > len(lengths):
        raise ValueError(f"cannot make {n_fragments} fragments from {len(lengths)} sequences")
    order = sorted(range(len(lengths)), key=lambda gid: (-lengths[gid], gid))
    heap = [(0, frag) for frag in range(n_fragments)]
    members: list[list[int]] = [[] for _ in range(n_fragments)]
    for gid in order:
        residues, frag = heapq.heappop(heap)
        members[frag].append(gid)
        heapq.heappush(heap, (residues + lengths[gid], frag))
    for ids in members:
        ids.sort()
    return members
