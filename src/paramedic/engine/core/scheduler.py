"""The master's decisions, as a pure state machine: events in, tasks out. No MPI, no BLAST+.

Work is a grid of search tasks (query batch x fragment) followed, per batch, by regeneration tasks
(a group of the batch's queries, searched again against a mask of their merged subjects). Keeping the
scheduler free of I/O lets tests and simulators drive it in virtual time at any scale.

Policy for an idle worker:
1. a ready regeneration task first (output flows early and merged hits are freed), except in the tail:
   once the only searches left are the last batch's, they go first. Its pieces wait for them, so they
   are the job's critical path; the ready pieces then run beside the last batch's (measured: with two
   batches of 12 and 8 queries on 2 workers, piece-first left one worker idle for 5.3 s of 57.7 s,
   bench/RESULTS.md "where the time goes");
2. otherwise a search task from the earliest open batches (a window of `window` batches, so batches
   complete in order and regeneration overlaps the search), preferring a fragment the worker already
   has cached, then one staged on its node (--stage), then its replica group's share, then a fragment
   no other worker holds, then any.

With --stage a task whose fragment is not staged on the worker's node copies it there from shared
storage (paramedic.db.stage). At most `stage_copies` such copies are in flight at once (mpiBLAST's
--concurrent): once they are, a worker gets only fragments staged or being copied on its node, or waits.
A finished search means its fragment is staged on that node. A fragment staged on some nodes when the
job starts (an earlier run's) is theirs: a worker elsewhere waits rather than copy it, unless its node
starts with less than half its fair share (workers x fragments / all workers) staged, as on nodes new to
the job. A first run stages nothing before it starts, so its balance is as without the rule.
"""

from __future__ import annotations

import bisect
import functools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from paramedic.blast.hits import FragmentSearch, Hit, PrelimList
from paramedic.engine.core.merge import merge_query, whole_subjects


@dataclass(frozen=True)
class SearchTask:
    batch: int
    fragment: int


@dataclass(frozen=True)
class PieceTask:
    """One piece of the report: a run of consecutive queries whose report BLAST+ writes in one run. The
    unit of output (the writer orders pieces), of shipping (metadata ships per piece) and of the journal.

    With `subjects`, against a mask of the merged subjects (regeneration); with `subjects=None`, against
    the whole database (query segmentation: the search and the report in one run).
    """

    piece: int  # position of this piece in the output
    first_query: int  # global query index of the first query
    n_queries: int
    subjects: tuple[tuple[int, ...], ...] | None  # merged global subject ids per query, in BLAST order
    # With `keep_alignments`: per query, per merged subject, the search's own alignments (archive text),
    # from which the report is written without searching again (paramedic.blast.render).
    alignments: tuple[tuple[bytes, ...], ...] | None = None
    # Or the same alignments left in the search store by the workers that found them
    # (paramedic.engine.rank.store): per query, the merged hits' subject ids, in merged order (`subjects` may
    # be the whole preliminary list); the worker writing the piece reads their alignments there.
    stored: tuple[tuple[int, ...], ...] | None = None

    @property
    def renderable(self) -> bool:
        """The report is written from the search's alignments, not by searching again."""
        return self.alignments is not None or self.stored is not None


Task = SearchTask | PieceTask


@dataclass(frozen=True)
class Plan:
    """The shape of the job, fixed before it starts."""

    batches: tuple[range, ...]  # query index ranges, consecutive, covering all queries
    n_fragments: int
    pieces: tuple[range, ...]  # query index ranges of the regeneration pieces, consecutive
    hitlist_size: int
    # each piece searched against the whole database (--strategy queries): no merge, no regeneration
    query_segmentation: bool = False
    search_filled_again: bool = True  # a filled hit list is searched again (paramedic.engine.core.merge)
    # fragment searches stop after BLAST+'s preliminary stage; every piece is written by one search
    # against its queries' whole preliminary lists, the only traceback (docs/DESIGN.md, "Traceback once")
    traceback_once: bool = False
    # The database's fragments each search covers: the "fragments" of the tasks are then these groups
    # of consecutive fragments, searched in one BLAST+ run each (docs/DESIGN.md, "Fragment groups");
    # empty: one fragment per search
    groups: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        _check_cover(self.batches, "batches")
        _check_cover(self.pieces, "pieces")
        if (self.batches[0].start, self.batches[-1].stop) != (self.pieces[0].start, self.pieces[-1].stop):
            raise ValueError("batches and pieces must cover the same queries")
        if self.n_fragments < 1:
            raise ValueError("need at least one fragment")
        if self.groups and (
            len(self.groups) != self.n_fragments
            or [f for g in self.groups for f in g] != list(range(sum(len(g) for g in self.groups)))
            or not all(self.groups)
        ):
            raise ValueError("fragment groups must be consecutive, non-empty, and one per search")

    def fragments_of(self, unit: int) -> tuple[int, ...]:
        """The database's fragments that search `unit` (a task's `fragment`) covers."""
        return self.groups[unit] if self.groups else (unit,)

    @property
    def database_fragments(self) -> int:
        """How many fragments the database has (more than `n_fragments` when they are grouped)."""
        return sum(len(g) for g in self.groups) if self.groups else self.n_fragments

    def batch_pieces(self, batch: int) -> range:
        """Indices of the pieces that lie in search batch `batch` (ValueError when a piece crosses its
        edge: a job whose report is one piece, unstitchable, cannot be cut into query segments)."""
        pieces = self.overlapping(batch)
        if (self.pieces[pieces.start].start, self.pieces[pieces.stop - 1].stop) != (
            self.batches[batch].start,
            self.batches[batch].stop,
        ):
            raise ValueError(f"batch {batch}'s pieces cross its edges")
        return pieces

    def overlapping(self, batch: int) -> range:
        """Indices of the pieces that hold any of batch `batch`'s queries (found by bisection: a master
        asks for every batch it merges, and a plan may have tens of thousands)."""
        queries = self.batches[batch]
        first = bisect.bisect_right(self._piece_starts, queries.start) - 1
        last = bisect.bisect_left(self._piece_starts, queries.stop)
        return range(first, last)

    @functools.cached_property
    def _piece_starts(self) -> list[int]:
        return [p.start for p in self.pieces]

    @property
    def first_query(self) -> int:
        """Global index of the plan's first query: 0 for a whole job, more for a part of one."""
        return self.batches[0].start

    @property
    def n_queries(self) -> int:
        return self.batches[-1].stop - self.first_query


def _check_cover(ranges: tuple[range, ...], what: str) -> None:
    if (
        not ranges
        or ranges[0].start < 0
        or any(a.stop != b.start for a, b in zip(ranges, ranges[1:], strict=False))
    ):
        raise ValueError(f"{what} must be consecutive ranges of query indices")
    if any(len(r) == 0 for r in ranges):
        raise ValueError(f"{what} must not be empty")


@dataclass
class Scheduler:
    plan: Plan
    window: int = 2
    hold_pieces: bool = False  # released pieces wait in `released` instead of becoming tasks (shipping)
    keep_alignments: bool = False  # pieces are written from the searches' alignments where exact
    alignments_stored: bool = False  # ... which stay in the search store (else they travel with the task)
    # The batches this scheduler works on (None: all). A partition master's starts with none and is given
    # query segments one by one (`assign`, paramedic.engine.core.hierarchy).
    assigned: set[int] | None = None
    # Workers per copy of the database (--replica-group-size): worker w (numbered from 1) is at home with
    # the fragments f where f % group == (w - 1) % group, the share of the copy it holds. None: any.
    replica_group: int | None = None
    # --stage: worker -> its node's name; node -> fragments staged there (reported at start, and each
    # finished search); the bound on copies in flight (None: unbounded). No nodes: no staging.
    nodes: dict[int, str] | None = None
    staged: dict[str, set[int]] = field(default_factory=dict)
    stage_copies: int | None = None
    _copying: set[tuple[str, int]] = field(init=False)  # (node, fragment) copies in flight
    _theirs: dict[str, set[int]] = field(init=False)  # node -> fragments staged elsewhere at start, not here
    _handed: dict[SearchTask, str] = field(init=False)  # search handed out -> the node it went to
    _pending: list[set[int]] = field(init=False)  # per batch: fragments not yet handed out
    # the batches this scheduler may hand searches of (assigned, fragments pending), in order: an idle
    # worker's choice looks at the first `window` of them, not at every batch of the plan
    _open: list[int] = field(init=False)
    _holders: dict[int, int] = field(init=False)  # fragment -> workers that hold it (in `cache`)
    _waiting: list[int] = field(init=False)  # per batch: fragment results still missing
    _hits: dict[int, list[list[list[Hit]]]] = field(init=False)  # batch -> per query -> per fragment hits
    _prelim: dict[int, list[list[PrelimList | None]]] = field(init=False)  # the same for prelim lists
    _inexact: set[int] = field(init=False)  # queries whose report must be written by searching again
    _merged: dict[int, list[int]] = field(init=False)  # global query -> merged subject ids
    # global query -> its merged hits, whose alignments write its report, until its piece is released
    _alignments: dict[int, tuple[Hit, ...]] = field(init=False)
    _ready: deque[PieceTask] = field(init=False)
    _unreleased: set[int] = field(init=False)  # pieces not yet made ready
    _done_pieces: set[int] = field(init=False)
    cache: dict[int, set[int]] = field(init=False)  # worker -> fragments it holds
    released: list[PieceTask] = field(init=False)  # held pieces, ready to be shipped as metadata

    def __post_init__(self) -> None:
        nf = self.plan.n_fragments
        # a partition master's scheduler touches only its own batches: their sets are made when first
        # asked for (256 partitions x 11,872 batches x 64 fragments would hold 7 GB)
        self._pending = _Pending(len(self.plan.batches), nf)
        self._waiting = [nf] * len(self.plan.batches)
        self._holders = {}
        self._hits = {}
        self._prelim = {}
        self._inexact = set()
        self._merged = {}
        self._alignments = {}
        self._ready = deque()
        self._done_pieces = set()
        # pieces of batches not assigned here are never merged here: never released here
        self._unreleased = (
            set(range(len(self.plan.pieces)))
            if self.assigned is None
            else {i for b in self.assigned for i in self.plan.overlapping(b)}
        )
        self._open = list(range(len(self.plan.batches))) if self.assigned is None else sorted(self.assigned)
        self.cache = {}
        self.released = []
        self._copying = set()
        self._handed = {}
        self._theirs = _left_to_others(self.nodes, self.staged, self.plan.n_fragments)
        if self.stage_copies is not None and self.stage_copies < 1:
            raise ValueError("stage_copies must be at least 1")
        if self.plan.query_segmentation:
            self._pending = _Pending(len(self.plan.batches), 0)
            self._waiting = [0] * len(self.plan.batches)
            self._unreleased.clear()
            self._open = []
            batches = range(len(self.plan.batches)) if self.assigned is None else sorted(self.assigned)
            for batch in batches:
                self._ready_whole(batch)

    def home(self, worker: int) -> set[int]:
        """The fragments `worker` holds in its replica group's copy of the database (--replica-group-size)."""
        if self.replica_group is None:
            return set()
        position = (worker - 1) % self.replica_group
        return {f for f in range(self.plan.n_fragments) if f % self.replica_group == position}

    def _ready_whole(self, batch: int) -> None:
        """Query segmentation: the batch's pieces are tasks at once (searched and written in one run)."""
        for i in self.plan.batch_pieces(batch):
            if i not in self._done_pieces:
                piece = self.plan.pieces[i]
                self._ready.append(PieceTask(i, piece.start, len(piece), None))

    def assign(self, batch: int) -> None:
        """Add a query segment (a search batch and its pieces) to the work of this scheduler."""
        if self.assigned is None or batch in self.assigned:
            raise ValueError(f"batch {batch} is assigned already")
        self.assigned.add(batch)
        if self.plan.query_segmentation:
            self._ready_whole(batch)
            return
        self._unreleased.update(i for i in self.plan.overlapping(batch) if i not in self._done_pieces)
        if self._pending[batch]:
            bisect.insort(self._open, batch)

    @property
    def open_tasks(self) -> int:
        """Tasks that could be handed out now or once earlier batches merge (a partition master asks for
        its next segment when these fall below its workers)."""
        return len(self._ready) + sum(len(self._pending[b]) for b in self._open)

    @property
    def idle(self) -> bool:
        """Every piece of every assigned batch is done (a partition master's work so far)."""
        if self.assigned is None:
            return self.finished
        return all(i in self._done_pieces for b in self.assigned for i in self.plan.batch_pieces(b))

    def preload(self, merged: list[list[int]]) -> None:
        """Start from known metadata (a saved search): no search tasks, only regeneration."""
        if len(merged) != self.plan.n_queries:
            raise ValueError(f"metadata has {len(merged)} queries, the job {self.plan.n_queries}")
        self._merged = dict(enumerate(merged, start=self.plan.first_query))
        self._pending = _Pending(len(self.plan.batches), 0)
        self._waiting = [0] * len(self.plan.batches)
        self._open = []
        self._release_pieces(self._unreleased)

    def restore_search(self, task: SearchTask, result: FragmentSearch) -> None:
        """A search finished by an earlier run of the job (paramedic.engine.rank.journal): not handed out again."""
        if task.fragment not in self._pending[task.batch]:
            raise ValueError(f"search {task} is not pending")
        self._take(task)
        self.search_done(task, result)

    def mark_piece_done(self, index: int) -> None:
        """A piece whose report was written otherwise (by an earlier run of the job, or as the --ship
        auto probe): it is done, whether released yet or not."""
        self._ready = deque(t for t in self._ready if t.piece != index)
        self.released = [t for t in self.released if t.piece != index]
        self._unreleased.discard(index)
        self._done_pieces.add(index)

    # -- events -------------------------------------------------------------------------------------
    def next_task(self, worker: int) -> Task | None:
        """The task for an idle worker, or None when nothing can be handed out right now."""
        if self._ready and not self._in_tail():
            return self._ready.popleft()
        open_batches = self._open[: self.window]
        if not open_batches:
            return self._ready.popleft() if self._ready else None
        node = self.nodes.get(worker) if self.nodes is not None else None
        on_node = self.staged.get(node, set()) if node is not None else set()
        copying = {f for n, f in self._copying if n == node}
        bounded = (
            node is not None and self.stage_copies is not None and len(self._copying) >= self.stage_copies
        )
        if bounded and not any((on_node | copying) & self._pending[b] for b in open_batches):
            return None  # every copy allowed is in flight and nothing is staged here: wait (cheaply)
        theirs = self._theirs.get(node, set()) if node is not None else set()
        held = self.cache.setdefault(worker, set())
        held_by_others = {f for f, n in self._holders.items() if n > (f in held)}
        choice = None
        home = self.home(worker)
        for prefer in self.preferences(held, on_node, home, held_by_others):
            for batch in open_batches:
                fragments = sorted(
                    f
                    for f in self._pending[batch]
                    if prefer(f) and (not bounded or f in on_node or f in copying) and f not in theirs
                )
                if fragments:
                    choice = SearchTask(batch, fragments[0])
                    break
            if choice:
                break
        if choice is None:  # what is pending is staged on other nodes: their workers take it
            return None
        self._take(choice)
        if choice.fragment not in held:
            held.add(choice.fragment)
            self._holders[choice.fragment] = self._holders.get(choice.fragment, 0) + 1
        if node is not None:
            self._handed[choice] = node
            if choice.fragment not in on_node:
                self._copying.add((node, choice.fragment))
        return choice

    def preferences(
        self, held: set[int], on_node: set[int], home: set[int], held_by_others: set[int]
    ) -> tuple[Callable[[int], bool], ...]:
        """The scheduling policy: an idle worker's search is the first pending fragment (of the open
        batches, in order) that the first preference accepts, else the second's, and so on; the last must
        accept any fragment. Here cache affinity: what the worker holds, what is staged on its node, its
        share of a replica group, what no other worker holds. A policy is a subclass that overrides this
        (docs/CONTRIBUTING.md "Add a scheduler policy")."""
        return (
            lambda f: f in held,
            lambda f: f in on_node,
            lambda f: f in home,
            lambda f: f not in held_by_others,
            lambda f: True,
        )

    def _in_tail(self) -> bool:
        """Only the last batch has searches left to hand out (and no segment can still be assigned, no
        staging bound can make a search wait): those searches go before ready pieces."""
        return (
            len(self._open) == 1
            and self.assigned is None
            and self.stage_copies is None
            and self._open[0] == len(self.plan.batches) - 1
        )

    def _take(self, task: SearchTask) -> None:
        """A search is handed out (or was done by an earlier run): no longer pending."""
        pending = self._pending[task.batch]
        pending.discard(task.fragment)
        if not pending and task.batch in self._open:
            self._open.remove(task.batch)

    @property
    def per_worker(self) -> bool:
        """Whether `next_task` may give one idle worker nothing and another a task (--stage: the bound
        on copies in flight leaves a worker only what is staged on its node)."""
        return self.nodes is not None and (self.stage_copies is not None or any(self._theirs.values()))

    @property
    def copies_in_flight(self) -> int:
        """Fragments being copied to a node's --stage cache now (one per node and fragment)."""
        return len(self._copying)

    def search_done(self, task: SearchTask, result: FragmentSearch) -> None:
        """Record one fragment's hits for a batch; when the batch is complete, merge it."""
        batch = self.plan.batches[task.batch]
        if len(result.hits) != len(batch) or len(result.prelim) != len(batch):
            raise ValueError(
                f"search of batch {task.batch} returned {len(result.hits)} queries, expected {len(batch)}"
            )
        node = self._handed.pop(task, None)
        if node is not None:  # its fragment is staged on that node now (or was searched in place)
            self.staged.setdefault(node, set()).add(task.fragment)
            self._copying.discard((node, task.fragment))
        per_query = self._hits.setdefault(task.batch, [[] for _ in batch])
        per_query_prelim = self._prelim.setdefault(task.batch, [[] for _ in batch])
        for q, (query_hits, prelim) in enumerate(zip(result.hits, result.prelim, strict=True)):
            per_query[q].append(query_hits)
            per_query_prelim[q].append(prelim)
        self._waiting[task.batch] -= 1
        if self._waiting[task.batch] == 0:
            hits, prelims = self._hits.pop(task.batch), self._prelim.pop(task.batch)
            for q, fragments, lists in zip(batch, hits, prelims, strict=True):
                if self.plan.traceback_once:
                    self._merged[q] = whole_subjects(lists)
                    continue
                merged = merge_query(fragments, lists, self.plan.hitlist_size, self.plan.search_filled_again)
                self._merged[q] = merged.subjects
                if not merged.exact:
                    self._inexact.add(q)
                elif self.keep_alignments:
                    self._alignments[q] = tuple(merged.hits)
            self._release_pieces(self.plan.overlapping(task.batch))

    def piece_done(self, task: PieceTask) -> None:
        self._done_pieces.add(task.piece)

    def take_released(self) -> list[PieceTask]:
        """Held pieces whose queries are all merged, in piece order; they count as done from now on."""
        taken = sorted(self.released, key=lambda t: t.piece)
        self.released = []
        for task in taken:
            self._done_pieces.add(task.piece)
        return taken

    def stop_holding(self) -> None:
        """From now on released pieces become regeneration tasks again (held ones first)."""
        self.hold_pieces = False
        self._ready.extendleft(reversed(sorted(self.released, key=lambda t: t.piece)))
        self.released = []

    # -- state --------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return len(self._done_pieces) == len(self.plan.pieces)

    def metadata(self, query: int) -> list[int] | None:
        """Subject ids a regeneration of a query searches against (None with query segmentation, which
        merges nothing): its merged hits, or its whole preliminary list (paramedic.engine.core.merge)."""
        return self._merged.get(query)

    @property
    def searched_again(self) -> int:
        """Queries whose report had to be written by searching again against their preliminary list."""
        return len(self._inexact)

    def _release_pieces(self, candidates: Iterable[int]) -> None:
        """A piece becomes ready as soon as all its queries are merged (the writer restores order); the
        `candidates` are the pieces a merge may have completed."""
        for index in sorted(i for i in candidates if i in self._unreleased):
            piece = self.plan.pieces[index]
            if all(q in self._merged for q in piece):
                subjects = tuple(tuple(self._merged[q]) for q in piece)
                kept = [self._alignments.pop(q, None) for q in piece]
                alignments = stored = None
                if all(hits is not None for hits in kept):
                    hits = [h for h in kept if h is not None]
                    if self.alignments_stored:
                        stored = tuple(tuple(h.gid for h in q) for q in hits)
                    else:
                        alignments = tuple(tuple(h.alignment for h in q) for q in hits)
                # else a query must be searched again: the whole piece is (BLAST+'s own batches)
                task = PieceTask(index, piece.start, len(piece), subjects, alignments, stored)
                (self.released if self.hold_pieces else self._ready).append(task)
                self._unreleased.discard(index)


def _left_to_others(
    nodes: dict[int, str] | None, staged: dict[str, set[int]], fragments: int
) -> dict[str, set[int]]:
    """Per node of the job's workers: the fragments staged at the start on other nodes of the job only,
    which its workers leave to those nodes (none for a node holding less than half its fair share)."""
    if not nodes:
        return {}
    workers: dict[str, int] = {}
    for node in nodes.values():
        workers[node] = workers.get(node, 0) + 1
    total = sum(workers.values())
    anywhere = set().union(*(staged.get(n, set()) for n in workers))
    return {
        node: set()
        if 2 * len(staged.get(node, set())) * total < fragments * count
        else anywhere - staged.get(node, set())
        for node, count in workers.items()
    }


class _Pending(list):  # type: ignore[type-arg]
    """Per batch, the fragments not yet handed out; a batch's set is made when first asked for."""

    def __init__(self, batches: int, fragments: int):
        super().__init__([None] * batches)
        self.fragments = fragments

    def __getitem__(self, batch):  # type: ignore[no-untyped-def, override]
        found = list.__getitem__(self, batch)
        if found is None:
            found = set(range(self.fragments))
            list.__setitem__(self, batch, found)
        return found
