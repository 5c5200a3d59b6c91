"""Cluster-wide allocation: how many workers each job gets. Pure: demands and free GPUs in, counts out.

A policy decides the order in which jobs receive workers; `Packing` checks that every granted
worker fits on a node the job may use (whole pods, `gpus_per_worker` GPUs on one node), keeping
workers on the nodes they already run on so an allocation does not shuffle running pods. A job
whose minimum does not fit gets 0 and waits.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import ItemsView, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import groupby
from typing import Protocol

from .model import JobKey


@dataclass(frozen=True)
class Demand:
    """One job's request to the allocator."""

    key: JobKey
    min: int
    max: int  # already capped by a pending-timeout hold
    gpus_per_worker: int
    eligible: frozenset[str]  # nodes the job may use
    priority: int = 0
    created: float = 0.0
    # Nodes of the job's running workers, one entry per worker, most-used node first (`most_used_first`):
    # a shrinking job keeps the first ones, so it keeps its workers together.
    current_nodes: tuple[str, ...] = ()


def most_used_first(nodes: Sequence[str]) -> tuple[str, ...]:
    """One entry per worker, the nodes holding most of the job's workers first (then by name): the
    order in which a job keeps its workers when it shrinks, so that it leaves the nodes where it
    has fewest and its remaining workers span as few nodes as they can."""
    counts = Counter(nodes)
    return tuple(sorted(nodes, key=lambda node: (-counts[node], node)))


# What a packing's preferences look at on a node besides its name: (free GPUs, GPUs that would
# still get a device of their own, spot, relative speed of its GPU type, whether a free GPU there
# is one no running worker holds: see `SlicedPacking.hold`).
NodeClass = tuple[int, int, bool, float, bool]


class NodeIndex:
    """Nodes grouped by `NodeClass`, each group's names kept sorted. A cluster has few classes and
    many nodes, so the best node for a worker is found by ranking the classes and taking a group's
    first acceptable name instead of scanning every node per worker (at 10,000 jobs on 512 nodes
    the scans were most of a simulation's time)."""

    def __init__(self) -> None:
        self._class: dict[str, NodeClass] = {}
        self._groups: dict[NodeClass, list[str]] = {}
        self._by_exclusive: Counter[int] = Counter()

    def put(self, node: str, cls: NodeClass) -> None:
        """Files `node` under `cls`, out of its old group."""
        old = self._class.get(node)
        if old == cls:
            return
        if old is not None:
            group = self._groups[old]
            del group[bisect_left(group, node)]
            if not group:
                del self._groups[old]
            self._by_exclusive[old[1]] -= 1
        self._class[node] = cls
        members = self._groups.get(cls)
        if members is None:
            self._groups[cls] = [node]
        else:
            insort(members, node)
        self._by_exclusive[cls[1]] += 1

    def by_exclusive(self) -> Mapping[int, int]:
        """How many nodes have each count of GPUs that would get a device of their own."""
        return self._by_exclusive

    def class_of(self, node: str) -> NodeClass | None:
        return self._class.get(node)

    def groups(self) -> ItemsView[NodeClass, list[str]]:
        """Every non-empty class with its nodes in name order (not to be modified)."""
        return self._groups.items()


def first_acceptable(names: list[str], eligible: frozenset[str], mine: Set[str] = frozenset()) -> str | None:
    """The first of `names` the job may use and does not run on yet."""
    for name in names:
        if name in eligible and name not in mine:
            return name
    return None


class Packing:
    """Simulated placement of workers on nodes; policies grow jobs one worker at a time through it."""

    def __init__(self, free: Mapping[str, int]) -> None:
        self.free = dict(free)
        self._sticky: dict[JobKey, list[str]] = {}
        self._placed: dict[JobKey, list[str]] = {}
        self._index = NodeIndex()
        self.version = 0  # changes whenever a worker is placed or withdrawn
        for node in self.free:  # a subclass sets what its `_class_of` reads before this runs
            self._index.put(node, self._class_of(node))

    def _class_of(self, node: str) -> NodeClass:
        """Without device information every free GPU is exclusive, on-demand, of speed 1 and held
        by no running worker."""
        free = self.free[node]
        return free, free, False, 1.0, True

    def _take(self, node: str, gpus: int) -> None:
        """`gpus` fewer free on `node` (negative: given back); keeps the index current."""
        self.free[node] -= gpus
        self._index.put(node, self._class_of(node))
        self.version += 1

    def count(self, key: JobKey) -> int:
        return len(self._placed.get(key, ()))

    def nodes_of(self, key: JobKey) -> list[str]:
        """The nodes of the job's placed workers, in placement order ('' for a GPU-less worker)."""
        return list(self._placed.get(key, ()))

    def place(self, demand: Demand) -> bool:
        """Places one more worker of `demand`: on a node it already runs on, else best fit."""
        need = demand.gpus_per_worker
        placed = self._placed.setdefault(demand.key, [])
        if need <= 0:
            placed.append("")
            return True
        sticky = self._sticky_nodes(demand)
        while sticky:
            node = sticky.pop(0)
            if node in demand.eligible and self.free.get(node, 0) >= need:
                self._take(node, need)
                placed.append(node)
                return True
        best = self._best_fit(need, demand.eligible)
        if best is None:
            return False
        self._take(best, need)
        placed.append(best)
        return True

    def place_up_to(self, demand: Demand, workers: int) -> int:
        """Places up to `workers` more workers of `demand`, exactly as that many `place` calls would
        (stopping at the first that fails), and returns how many it placed. A run of the job's
        running workers on one node goes back in one step: most of a pass at 10,000 jobs is putting
        running workers back where they are, one index update each."""
        placed = 0
        while placed < workers:
            run = self._sticky_run(demand, workers - placed)
            if run == 0 and not self.place(demand):
                break
            placed += run or 1
        return placed

    def _sticky_run(self, demand: Demand, most: int) -> int:
        """Places up to `most` workers on the node the job's next `place` would choose when that is
        one of its running nodes, as many as that node's run of entries and free GPUs allow (each
        `place` would take that node again); 0 when the next worker would go elsewhere."""
        need = demand.gpus_per_worker
        sticky = self._sticky.get(demand.key, demand.current_nodes)
        for first, node in enumerate(sticky):
            if node in demand.eligible and self.free.get(node, 0) >= need > 0:
                run = 1
                while first + run < len(sticky) and sticky[first + run] == node:
                    run += 1
                taken = min(run, most, self.free[node] // need)
                del self._sticky_nodes(demand)[: first + taken]
                self._placed_on(demand, node, taken)
                self._take(node, need * taken)
                self._placed.setdefault(demand.key, []).extend([node] * taken)
                return taken
        return 0

    def _placed_on(self, demand: Demand, node: str, workers: int = 1) -> None:
        """Hook: `workers` workers of `demand` are being placed on `node` (a subclass's bookkeeping),
        called just before their GPUs are taken, so that a change of the node's class it makes
        lands in the index with that one update."""

    def _sticky_nodes(self, demand: Demand) -> list[str]:
        """The job's running nodes not yet given back a worker (copied on first use only: a
        `setdefault` would copy them at every placement)."""
        sticky = self._sticky.get(demand.key)
        if sticky is None:
            sticky = self._sticky[demand.key] = list(demand.current_nodes)
        return sticky

    def _best_fit(self, need: int, eligible: frozenset[str]) -> str | None:
        """The eligible node with the fewest free GPUs that still holds `need` (best fit keeps big
        holes whole), the first by name among equals."""
        best: tuple[int, str] | None = None
        for (free, *_), names in self._index.groups():
            if free < need or (best is not None and free > best[0]):
                continue
            name = first_acceptable(names, eligible)
            if name is not None and (best is None or (free, name) < best):
                best = (free, name)
        return best[1] if best is not None else None

    def withdraw(self, demand: Demand) -> None:
        """Takes back every worker placed for `demand` (its minimum did not fit)."""
        for node in self._placed.pop(demand.key, []):
            if node:
                self._take(node, -demand.gpus_per_worker)
        self._sticky.pop(demand.key, None)

    def place_min(self, demand: Demand) -> bool:
        """All of the job's minimum, or nothing."""
        if self.place_up_to(demand, demand.min) < demand.min:
            self.withdraw(demand)
            return False
        return True


@dataclass(frozen=True)
class Allocation:
    """Every job's worker count, for jobs whose spec lets it change the global batch chosen, and for
    jobs spread over several nodes that should run on one, that node once per new worker to start
    there (the job's workers on other nodes leave; its count says how many it has in all). The
    objective policies also say where each growing job's new workers go (`growth`, one node per new
    worker): they priced the growth at that placement, so the operator pins the workers there."""

    counts: dict[JobKey, int]
    global_batch: dict[JobKey, int] = field(default_factory=dict)
    moves: dict[JobKey, tuple[str, ...]] = field(default_factory=dict)
    growth: dict[JobKey, tuple[str, ...]] = field(default_factory=dict)


def growth_in_room(
    allocation: Allocation, demands: Sequence[Demand], room: Mapping[str, int]
) -> dict[JobKey, tuple[str, ...]]:
    """The growths (`Allocation.growth`) that fit in `room`, the GPUs per node no worker holds now,
    taken in the allocation's order (priority, then oldest). A worker pinned to GPUs another job's
    leaving worker still holds would wait for it (or for ever, if the planner's victims are not the
    ones the packing gave back), so a growth that does not fit whole is left to the scheduler."""
    left = dict(room)
    fitting: dict[JobKey, tuple[str, ...]] = {}
    for demand in sorted(demands, key=lambda d: (-d.priority, d.created, d.key)):
        nodes = allocation.growth.get(demand.key, ())
        wanted = Counter(nodes)
        if nodes and all(left.get(node, 0) >= n * demand.gpus_per_worker for node, n in wanted.items()):
            for node, n in wanted.items():
                left[node] -= n * demand.gpus_per_worker
            fitting[demand.key] = nodes
    return fitting


class Policy(Protocol):
    """Decides every job's worker count from the demands and the free GPUs per node (`allocate`);
    `decide` adds what else the policy chooses (batches, moves), none for most."""

    def allocate(self, demands: Sequence[Demand], free: Mapping[str, int]) -> dict[JobKey, int]: ...

    def decide(self, demands: Sequence[Demand], free: Mapping[str, int]) -> Allocation: ...


@dataclass(frozen=True)
class PriorityFairShare:
    """Priority first (a higher level is served up to its max first), then max-min fair share.

    Within one priority level every job first gets its minimum (oldest first; a job whose minimum
    does not fit gets 0), then workers go one at a time to the job with the fewest, so the
    smallest allocation is as large as possible. Ties go to a job that already runs that worker,
    then to the older job: when shares come out uneven the jobs keep the sizes they have, so a
    lost node shrinks the jobs that lost workers instead of shrinking others to regrow these.
    """

    name: str = field(default="priority-fair")

    def decide(self, demands: Sequence[Demand], free: Mapping[str, int]) -> Allocation:
        return Allocation(self.allocate(demands, free))

    def allocate(self, demands: Sequence[Demand], free: Mapping[str, int]) -> dict[JobKey, int]:
        packing = Packing(free)
        ordered = sorted(demands, key=lambda d: (-d.priority, d.created, d.key))
        for _, level in groupby(ordered, key=lambda d: d.priority):
            jobs = [d for d in level if d.max >= d.min]
            growing = [d for d in jobs if packing.place_min(d)]
            heap = [_next_worker(packing.count(d.key), d) for d in growing if packing.count(d.key) < d.max]
            heapq.heapify(heap)
            while heap:
                count, _, _, _, demand = heapq.heappop(heap)
                if packing.place(demand) and count + 1 < demand.max:
                    heapq.heappush(heap, _next_worker(count + 1, demand))
        return {d.key: packing.count(d.key) for d in demands}


def _next_worker(count: int, demand: Demand) -> tuple[int, bool, float, JobKey, Demand]:
    """A job's place in the fair-share queue for its worker number `count + 1`: fewest workers
    first, then the jobs already running that many (False sorts first), then the oldest."""
    return count, count >= len(demand.current_nodes), demand.created, demand.key, demand
