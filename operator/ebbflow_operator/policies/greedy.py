"""The greedy both objective policies allocate with: within a priority level each job gets its
minimum, then GPUs go to the job with the largest objective gain per GPU (a lazy greedy over a
heap). A job's step is one worker, or a run of workers when its utility only pays off further on:
to the next size where its busiest worker's share of the virtual nodes drops, to fill its nodes or
one or two fresh nodes, or back to its current size. A job stops growing when more GPUs no longer
help it (gain <= 0), so GPUs may stay free. Pure."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import groupby
from typing import Generic, TypeVar

from ..decision.allocator import Demand
from ..decision.model import JobKey
from .job_metrics import JobMetrics
from .packing import SlicedPacking
from .throughput import Placement

T = TypeVar("T")


# A job's utility at a placement (higher is better); the greedy maximises their sum.
Utility = Callable[[Demand, Placement], float]
# Sizes above a count where the job's utility may jump (e.g. where its per-worker load drops).
Breakpoints = Callable[[Demand, int], Iterable[int]]


@lru_cache(maxsize=65536)
def virtual_node_breakpoints(virtual_nodes: int, count: int, how_many: int = 2) -> tuple[int, ...]:
    """The next sizes above `count` at which the busiest worker's share ceil(V/K) of V virtual nodes
    drops (between them extra workers only add sync: a one-step greedy would stop on the plateau).
    Memoised: the greedy asks at every step, from few distinct (V, count)."""
    sizes: list[int] = []
    load = math.ceil(virtual_nodes / max(1, count))
    while load > 1 and len(sizes) < how_many:
        load -= 1
        size = math.ceil(virtual_nodes / load)
        if size > count and (not sizes or size > sizes[-1]):
            sizes.append(size)
    return tuple(sizes)


def _current_placement(demand: Demand, packing: SlicedPacking) -> Placement:
    """The job back at its current size on its current nodes."""
    nodes = set(demand.current_nodes)
    if packing.never_shared:  # every node's share is 1
        return Placement(len(demand.current_nodes), max(1, len(nodes)), 1.0)
    share = max((packing.share(n) for n in nodes if n), default=1.0)
    return Placement(len(demand.current_nodes), max(1, len(nodes)), share)


def _jumps(
    demand: Demand, packing: SlicedPacking, here: Placement, breakpoints: Iterable[int]
) -> dict[int, Placement]:
    """Sizes worth more than one step from the job's placement `here`, with projected placements: the
    breakpoints, the room left on the job's nodes plus none, one or two whole new nodes (sync cost
    jumps when a job first spans nodes), all on exclusive devices; and straight back to the current
    size."""
    room, per_node, spare = packing.room(demand)
    count = here.workers
    sizes = {count + room + extra * per_node for extra in range(min(2, spare) + 1)} | set(breakpoints)
    jumps: dict[int, Placement] = {}
    for size in sizes:
        beyond = size - count - room
        new = 0 if beyond <= 0 else math.ceil(beyond / per_node)
        if count + 1 < size <= demand.max and new <= spare:
            jumps[size] = Placement(size, max(1, (here.nodes if count else 0) + new), here.share)
    current = len(demand.current_nodes)
    if count + 1 < current <= demand.max:
        jumps[current] = _current_placement(demand, packing)
    return jumps


def _best_step(
    demand: Demand, packing: SlicedPacking, utility: Utility, breakpoints: Breakpoints
) -> tuple[float, int]:
    """(gain per GPU, workers to add): the best of one more worker and the `_jumps`."""
    count = packing.count(demand.key)
    if count >= demand.max:
        return 0.0, 0
    node = packing.peek(demand)
    if node is None:
        return 0.0, 0
    here = packing.placement(demand)
    now = utility(demand, here)
    gpus = max(1, demand.gpus_per_worker)
    best = ((utility(demand, packing.placement(demand, node)) - now) / gpus, 1)
    if demand.max <= count + 1:  # one worker is all it may add: no jump
        return best
    for size, placement in _jumps(demand, packing, here, breakpoints(demand, count)).items():
        jump = (utility(demand, placement) - now) / (gpus * (size - count))
        best = max(best, (jump, size - count))
    return best


def _grow(jobs: Sequence[Demand], packing: SlicedPacking, utility: Utility, breakpoints: Breakpoints) -> None:
    """Lazy greedy: pop the largest (possibly stale) gain, recompute, place if it still leads.

    A step is a function of the packing, so one worked out at the packing's current `version` (no
    worker placed since: typically a job popped again right after it grew) is not worked out again.
    """
    heap: list[tuple[float, float, JobKey, int, int, Demand]] = []  # (-gain, ..., add, version, job)
    for d in jobs:
        gain, add = _best_step(d, packing, utility, breakpoints)
        if add and gain > 0:
            heap.append((-gain, d.created, d.key, add, packing.version, d))
    heapq.heapify(heap)
    while heap:
        loss, created, key, add, version, demand = heapq.heappop(heap)
        gain = -loss
        if version != packing.version:
            gain, add = _best_step(demand, packing, utility, breakpoints)
        if not add or gain <= 0:
            continue
        if heap and -heap[0][0] > gain + 1e-12:  # stale: someone else leads now
            heapq.heappush(heap, (-gain, created, key, add, packing.version, demand))
            continue
        packing.place_up_to(demand, add)
        gain, add = _best_step(demand, packing, utility, breakpoints)
        if add and gain > 0:
            heapq.heappush(heap, (-gain, created, key, add, packing.version, demand))


def kept_in_place(demand: Demand, nodes: Sequence[str]) -> int:
    """How many of the job's running workers, most-used node first (`Demand.current_nodes`), a
    placement `nodes` keeps where they run before the first one it does not keep."""
    common = min(len(nodes), len(demand.current_nodes))
    if tuple(nodes[:common]) == demand.current_nodes[:common]:  # the usual case: placed in that order
        return common
    left = Counter(nodes)
    kept = 0
    for node in demand.current_nodes:
        if left[node] <= 0:
            break
        left[node] -= 1
        kept += 1
    return kept


def cancel_relocations(demands: Sequence[Demand], counts: dict[JobKey, int], packing: SlicedPacking) -> None:
    """Shrinks each running job whose projected placement moves running workers to other nodes
    onto the workers it keeps in place. The greedy sees every running worker as movable: when
    another job's growth takes the GPUs of one, the job's next worker lands elsewhere at the same
    count, unpriced. No worker is moved that way (a resize deletes workers from the nodes holding
    fewest of the job's, or adds them), so the job would keep its worker and the growth planned
    onto that GPU would land on another node (spread) instead. Shrunk now, the job may regrow
    next pass: its pause is the price of the other job's better placement. (Measured: this is
    what let the simulated goodput reach 0.6x static's average JCT; bench/README.md.)"""
    for demand in demands:
        count = counts.get(demand.key, 0)
        kept = kept_in_place(demand, packing.nodes_of(demand.key))
        if count > 0 and demand.min <= kept < min(count, len(demand.current_nodes)):
            packing.place_on(demand, demand.current_nodes[:kept])
            counts[demand.key] = kept


def growth_nodes(
    demands: Sequence[Demand], counts: Mapping[JobKey, int], packing: SlicedPacking, moved: Iterable[JobKey]
) -> dict[JobKey, tuple[str, ...]]:
    """Where the packing put each growing job's new workers, one node per new worker, in placement
    order (`Allocation.growth`): the jobs that keep every running worker in place and grow, except
    those `moved` (their new workers are the move's) and GPU-less ones (they need no node). The
    policy priced the growth at that placement; a worker the scheduler spread elsewhere would run
    at another speed, be measured there, and be undone by the next pass."""
    skipped = set(moved)
    growth: dict[JobKey, tuple[str, ...]] = {}
    for demand in demands:
        running, count = len(demand.current_nodes), counts.get(demand.key, 0)
        if demand.key in skipped or demand.gpus_per_worker <= 0 or count <= running:
            continue
        left = Counter(demand.current_nodes)
        new = []
        for node in packing.nodes_of(demand.key):
            if left[node] > 0:
                left[node] -= 1
            else:
                new.append(node)
        if len(new) == count - running:  # else a running worker would move: not a plain growth
            growth[demand.key] = tuple(new)
    return growth


def _memoised(utility: Utility) -> Utility:
    """`utility`, evaluated once per (job, placement) in a pass: the greedy re-ranks a job after
    every placement anywhere and mostly asks for placements it has asked for before. Sound because
    within one pass a job's utility depends only on its placement."""
    seen: dict[tuple[JobKey, int, int, float, float], float] = {}

    def cached(demand: Demand, placement: Placement) -> float:
        # A flat key: hashing it calls no Python-level `Placement.__hash__`.
        key = (demand.key, placement.workers, placement.nodes, placement.share, placement.speed)
        value = seen.get(key)
        if value is None:
            value = seen[key] = utility(demand, placement)
        return value

    return cached


def allocate_greedily(
    demands: Sequence[Demand], packing: SlicedPacking, utility: Utility, breakpoints: Breakpoints
) -> dict[JobKey, int]:
    utility = _memoised(utility)
    ordered = sorted(demands, key=lambda d: (-d.priority, d.created, d.key))
    for _, level in groupby(ordered, key=lambda d: d.priority):
        jobs = [d for d in level if d.max >= d.min]
        growing = [d for d in jobs if packing.place_min(d)]
        for cpu_only in (d for d in growing if d.gpus_per_worker <= 0):  # takes nothing from anyone
            while packing.count(cpu_only.key) < cpu_only.max:
                packing.place(cpu_only)
        _grow([d for d in growing if d.gpus_per_worker > 0], packing, utility, breakpoints)
    return {d.key: packing.count(d.key) for d in demands}


class PassJobs(Generic[T]):
    """Per-job values of one pass (a job's fitted models), worked out the first time the pass needs
    them and then remembered. Most jobs of a pass are never asked (at their max, or no node has
    room for them), and fitting every job's loss curve up front was most of the quality policy's
    time at scale. A class rather than closures: compiled (`make sim-native`), closures that capture
    each other form reference cycles, which kept every pass's models alive until the cyclic garbage
    collector found them (a quarter of a native simulation's time went to it)."""

    def __init__(self) -> None:
        self._done: dict[JobKey, T] = {}

    def job(self, demand: Demand) -> T:
        done = self._done.get(demand.key)
        if done is None:
            done = self._done[demand.key] = self._make(demand)
        return done

    def _make(self, demand: Demand) -> T:
        raise NotImplementedError


def breakpoints_of(info: Mapping[JobKey, JobMetrics]) -> Breakpoints:
    return lambda demand, count: virtual_node_breakpoints(info[demand.key].virtual_nodes, count)
