"""The goodput policy (Pollux): maximise the harmonic mean of the jobs' speedups over fair share,
each job at its best batch where it may change it. Pure: demands, free GPUs, metrics -> counts,
batches and moves (`GoodputPolicy.decide`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..decision.allocator import (
    Allocation,
    Demand,
    PriorityFairShare,
)
from ..decision.model import JobKey
from .greedy import (
    PassJobs,
    allocate_greedily,
    breakpoints_of,
    cancel_relocations,
    growth_nodes,
)
from .job_metrics import DEFAULT_RESCALE_PAUSE_S, NO_WORKERS_PENALTY, JobMetrics, metrics_of
from .packing import NodeDevices, SlicedPacking
from .throughput import JobModel, Placement

# A job's best goodput at a placement (`JobModel.best`'s first element).
PlacementValues = Callable[[Placement], float]


@lru_cache(maxsize=8192)
def _goodputs(model: JobModel) -> PlacementValues:
    """`model.best(placement)[0]`, remembered across passes for as long as the job's model is the
    same (its measurements unchanged: `fit_cached` gives an equal model). A pass asks every running
    job about the same few placements as the pass before (at 10,000 jobs, thousands of evaluations
    a pass), and the goodput at a placement depends on the model alone."""
    seen: dict[tuple[int, int, float, float], float] = {}

    def goodput(placement: Placement) -> float:
        key = (placement.workers, placement.nodes, placement.share, placement.speed)
        value = seen.get(key)
        if value is None:
            value = seen[key] = model.best(placement)[0]
        return value

    return goodput


def _typical_node(
    eligible: frozenset[str], free: Mapping[str, int], devices: Mapping[str, NodeDevices]
) -> int:
    sizes = [devices[n].physical if n in devices else free.get(n, 0) for n in eligible]
    return max([s for s in sizes if s > 0], default=1)


@dataclass(frozen=True)
class GoodputPolicy:
    """Pollux: maximise the harmonic mean (power mean, p = -1) of speedups over fair share.

    A job's speedup at a placement is its goodput there over its goodput at its max-min fair share
    (packed on as few nodes as possible, no time-slicing), each at the best batch for that placement
    when the job may change its batch (`JobModel.best`; B0 otherwise); maximising the harmonic mean
    is minimising the sum of 1/speedup. Any size other than the job's current one is discounted by
    Pollux's restart factor (age - rescales * pause) / (age + pause), age = now - created, so a
    resize must buy more than its measured pause; a job not yet running pays nothing. A change of
    batch alone is not discounted: the trainers switch at a step boundary without re-forming.
    After the counts, a job left spread over several nodes, or on one node with no room to grow,
    moves onto one node when that pays the same factor (`_consolidate`; `Allocation.moves`).
    """

    metrics: Mapping[JobKey, JobMetrics] = field(default_factory=dict)
    devices: Mapping[str, NodeDevices] = field(default_factory=dict)
    now: float = 0.0
    name: str = field(default="goodput")

    def allocate(self, demands: Sequence[Demand], free: Mapping[str, int]) -> dict[JobKey, int]:
        return self.decide(demands, free).counts

    def decide(self, demands: Sequence[Demand], free: Mapping[str, int]) -> Allocation:
        """The counts `allocate` returns and, for every job that may change its batch
        (`JobMetrics.max_batch`) and got workers, the B chosen for the placement the pass projected
        (B0 while its noise scale is unknown; the B it runs at while that is within
        `BATCH_SWITCH_GAIN` of the best), the moves, and where growing jobs' new workers go."""
        fair = PriorityFairShare().allocate(demands, free)
        info = metrics_of(demands, self.metrics)
        # Jobs share their eligible sets (the simulator's are one), so each set's node size is
        # worked out once per pass, not once per job over every node.
        typical: dict[frozenset[str], int] = {}
        for d in demands:
            if d.eligible not in typical:
                typical[d.eligible] = _typical_node(d.eligible, free, self.devices)
        objective = _GoodputObjective(self, info, fair, typical)
        packing = SlicedPacking(free, self.devices)
        packing.hold(demands)
        counts = allocate_greedily(demands, packing, objective.utility, breakpoints_of(info))
        cancel_relocations(demands, counts, packing)
        moves = self._consolidate(demands, counts, packing, objective.speedup)
        growth = growth_nodes(demands, counts, packing, moves)
        batches = {
            d.key: objective.job(d)[0].batch_to_run(packing.placement(d), info[d.key].current_batch)
            for d in demands
            if info[d.key].max_batch is not None and counts[d.key] > 0
        }
        return Allocation(counts, batches, moves, growth)

    def _consolidate(
        self,
        demands: Sequence[Demand],
        counts: dict[JobKey, int],
        packing: SlicedPacking,
        speedup: Callable[[Demand, Placement], float],
    ) -> dict[JobKey, tuple[str, ...]]:
        """Jobs the allocation left at their size move onto one node when that pays (spread over
        several nodes, or on one with no room left to grow while another node has it): on the node
        (`single_nodes`) and at the size in [min, max] it holds them at
        that gives the best speedup, discounted by the restart factor (a placement change restarts
        the job as a resize does; Pollux counts it the same way), beating their speedup where they
        are. The size may differ from the current one (e.g. 11 workers on 5 nodes -> 8 on one), and
        at least one new worker starts on the node (a plain shrink is the greedy's). Oldest first,
        each move taken in the packing (and `counts`) before the next job looks. Returns the node
        once per new worker there, per job moved."""
        moves: dict[JobKey, tuple[str, ...]] = {}
        for demand in sorted(demands, key=lambda d: (-d.priority, d.created, d.key)):
            workers = counts.get(demand.key, 0)
            if workers <= 0 or workers != len(demand.current_nodes):
                continue  # resized this pass (a resize places anew), or not running
            options = packing.single_nodes(demand)
            if not options:
                continue
            now = speedup(demand, packing.placement(demand))
            factor = self._restart_factor(demand)
            best: tuple[float, int, str, int] | None = None  # (speedup, -new workers, node, size)
            for node, mine, room in options:
                speed = packing.speed(node)
                for size in range(max(1, demand.min, mine + 1), min(room, demand.max) + 1):
                    candidate = (
                        speedup(demand, Placement(size, 1, 1.0, speed)) * factor,
                        mine - size,
                        node,
                        size,
                    )
                    best = candidate if best is None or candidate[:2] > best[:2] else best
            if best is not None and best[0] > now:
                _, new, node, size = best
                packing.move(demand, node, size)
                counts[demand.key] = size
                moves[demand.key] = (node,) * -new
        return moves

    def _baseline(self, demand: Demand, goodputs: PlacementValues, fair: int, typical_node: int) -> float:
        workers = fair if fair > 0 else max(1, demand.min)
        nodes = math.ceil(workers * max(1, demand.gpus_per_worker) / typical_node)
        return max(goodputs(Placement(workers, max(1, nodes))), 1e-12)

    def _restart_factor(self, demand: Demand) -> float:
        if not demand.current_nodes:
            return 1.0
        metrics = self.metrics.get(demand.key)
        pause = metrics.rescale_pause_s if metrics else DEFAULT_RESCALE_PAUSE_S
        rescales = metrics.rescales if metrics else 0
        age = max(0.0, self.now - demand.created)
        return max(1e-6, (age - rescales * pause) / (age + pause))


class _GoodputObjective(PassJobs[tuple[JobModel, float, PlacementValues, float]]):
    """One pass's goodput objective: per job (model, baseline goodput at its fair share, goodput at
    a placement, restart factor), and the speedup and utility `GoodputPolicy` describes."""

    def __init__(
        self,
        policy: GoodputPolicy,
        info: Mapping[JobKey, JobMetrics],
        fair: Mapping[JobKey, int],
        typical: Mapping[frozenset[str], int],
    ) -> None:
        super().__init__()
        self.policy, self.info, self.fair, self.typical = policy, info, fair, typical

    def _make(self, demand: Demand) -> tuple[JobModel, float, PlacementValues, float]:
        model = self.info[demand.key].model()
        goodputs = _goodputs(model)
        fair, typical = self.fair[demand.key], self.typical[demand.eligible]
        baseline = self.policy._baseline(demand, goodputs, fair, typical)
        return model, baseline, goodputs, self.policy._restart_factor(demand)

    def speedup(self, demand: Demand, placement: Placement) -> float:
        _, baseline, goodputs, _ = self.job(demand)
        return goodputs(placement) / baseline

    def utility(self, demand: Demand, placement: Placement) -> float:
        """-1 / speedup, the speedup discounted by the restart factor at any size but the current."""
        if placement.workers <= 0:
            return -NO_WORKERS_PENALTY
        _, baseline, goodputs, factor = self.job(demand)
        gain = goodputs(placement) / baseline
        if placement.workers != len(demand.current_nodes):
            gain *= factor
        return -1.0 / gain if gain > 0 else -NO_WORKERS_PENALTY
