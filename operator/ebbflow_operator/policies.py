"""Goodput (Pollux) and quality (SLAQ) allocation policies. Pure: demands, free GPUs, metrics -> counts.

Both satisfy `allocator.Policy` (`allocate(demands, free)`); the goodput policy's `decide` also
returns the global batch B it chose for each job that allows batch adaptation (`JobMetrics.max_batch`;
a job without it keeps B0 and is allocated exactly as before). What the protocol does not carry -
each job's measurements (`JobMetrics`, keyed by the same JobKey), the nodes' physical GPUs
(`NodeDevices`) and the pass's clock - is given at construction, so the operator builds one per
pass (a frozen dataclass; cheap). Jobs without metrics use the priors.

Invariants shared with `PriorityFairShare`:
- priority first: a higher level is served (up to what its objective wants, within max) before
  a lower one sees a GPU; a job whose min does not fit gets 0 (oldest first within a level);
- every granted count is 0 or within [min, max], and fits whole on eligible nodes (`Packing`);
- running workers keep their nodes, except that goodput moves a job onto one node when that pays
  (a job spread over several, or one whose node is full while another has room to grow on:
  `GoodputPolicy._consolidate`); goodput's growth prefers GPUs no running worker holds
  (`SlicedPacking.hold`).
Within a level, each job gets its minimum, then GPUs go to the job with the largest objective gain
per GPU (a lazy greedy over a heap). A job's step is one worker, or a run of workers when its
utility only pays off further on: to the next size where its busiest worker's share of the
virtual nodes drops, to fill its nodes or one or two fresh nodes, or back to its current size.
A job stops growing when more GPUs no longer help it (gain <= 0), so GPUs may stay free: the
objective, unlike fair share, does not hand out GPUs that would not speed anyone up.

Spot: a job's first `min` workers go to on-demand nodes when any fits (then a preemption never
takes the job below its minimum); further workers are placed as usual, and running workers keep
their nodes either way. (Sending the workers beyond min to spot first cost the simulated average
JCT 17 %: more preemptions and rescales.)

Time-slicing: a node advertises `replicas` GPUs backed by `physical` devices. Workers beyond the
physical count share devices; the packing prefers nodes with an idle physical device, and the
models slow a job's compute by its most contended node's share (used replicas / physical).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby
from typing import Generic, TypeVar

from .allocator import Allocation, Demand, NodeClass, Packing, Policy, PriorityFairShare, first_acceptable
from .loss_curve import LossCurve, fit_loss_curve
from .model import JobKey
from .throughput import JobModel, Measurement, Placement, ThroughputParams, fit_cached

POLICIES = ("fair", "goodput", "quality")  # what `ebbflow-operator --policy` and the simulator choose
DEFAULT_RESCALE_PAUSE_S = 30.0
NO_WORKERS_PENALTY = 1e9  # 1/speedup of a job with no workers: any first worker beats any growth
T = TypeVar("T")
_NO_NODES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NodeDevices:
    """A node's physical GPUs and the `nvidia.com/gpu` replicas it advertises (time-slicing)."""

    physical: int
    replicas: int
    spot: bool = False  # may be taken away at any time (model.SPOT_LABELS)
    gpu_type: str = ""  # the GPU product (model.LABEL_GPU_PRODUCT without "-SHARED")
    speed: float = 1.0  # relative compute speed of that type (throughput.compute_speeds)


@dataclass(frozen=True)
class JobMetrics:
    """What the trainers reported for one job (all optional but the batch shape)."""

    global_batch: int  # B0: the spec's globalBatchSize (the batch the learning rate was tuned for)
    virtual_nodes: int
    measurements: tuple[Measurement, ...] = ()
    noise_scale: float | None = None  # gradient noise scale phi
    rescale_pause_s: float = DEFAULT_RESCALE_PAUSE_S  # measured pause of one rescale
    rescales: int = 0  # how many times the job was resized so far
    losses: tuple[tuple[float, float], ...] = ()  # (step, loss)
    step: float | None = None  # steps done; defaults to the last loss report's step
    max_batch: int | None = None  # the spec's maxGlobalBatchSize: B may move in [B0, this]; None fixed

    def model(self) -> JobModel:
        params = fit_cached(self.measurements) if self.measurements else ThroughputParams.prior()
        return JobModel(
            params, self.global_batch, self.virtual_nodes, self.noise_scale, max_batch=self.max_batch
        )

    def steps_done(self) -> float:
        if self.step is not None:
            return self.step
        return max((k for k, _ in self.losses), default=0.0)


def _metrics_of(demands: Sequence[Demand], metrics: Mapping[JobKey, JobMetrics]) -> dict[JobKey, JobMetrics]:
    """Each job's metrics, the defaults built only for the jobs that reported none."""
    return {d.key: m if (m := metrics.get(d.key)) is not None else default_metrics(d) for d in demands}


def default_metrics(demand: Demand) -> JobMetrics:
    """A job that reported nothing: one virtual node per possible worker, prior models."""
    virtual = max(1, demand.max, demand.min)
    return JobMetrics(global_batch=32 * virtual, virtual_nodes=virtual)


def _fit(free: int, whole: int) -> tuple[bool, int]:
    """Sort key: nodes that hold `whole` first, smallest first; then the others, largest first."""
    return (False, free) if free >= whole else (True, -free)


# How `SlicedPacking.peek` orders nodes, the name aside (smallest first).
Rank = tuple[bool, bool, float, bool, bool, int]


def _rank(cls: NodeClass, need: int, within_min: bool, whole: int | None, theirs: bool) -> Rank:
    """A node's rank for the next worker of a job: on spot while the job's minimum is placed, then
    sharing a device, then slower; then (a growing job, `whole` None) not one of the job's nodes,
    every free GPU held by another job's running worker (`SlicedPacking.hold`), more free GPUs;
    (a first worker) every free GPU held, not holding the `whole` job, best fit."""
    free, exclusive, spot, speed, unheld = cls
    head = (within_min and spot, exclusive < need, -speed)
    if whole is None:
        return (*head, theirs, not unheld, free)
    return (*head, not unheld, *_fit(free, whole))


class SlicedPacking(Packing):
    """`Packing` that knows physical devices, spot nodes and locality: after the nodes a job runs on
    now it prefers on-demand nodes for its minimum, then a node where the
    worker gets an idle physical GPU, then the fastest GPU type, then one the job was just given
    (fewer nodes, cheaper sync), then a GPU no running worker holds (`hold`), then best fit; a
    job's first worker goes to the best-fitting node that could hold the whole job, else the
    roomiest, so jobs grow locally instead of interleaving. It also reports a job's placement.

    Every preference but the name is a function of the node's `NodeClass`, so `peek` ranks the
    index's classes rather than the nodes; a job's distinct nodes and slowest GPU type are kept
    current as it grows, so `placement` need not walk its workers."""

    def __init__(self, free: Mapping[str, int], devices: Mapping[str, NodeDevices]) -> None:
        self.devices = devices  # before `Packing.__init__`, which files the nodes by `_class_of`
        self._held: Counter[str] = Counter()  # per node: GPUs of running workers not placed back yet
        self._running: dict[JobKey, Counter[str]] = {}  # per job: its running workers by node
        self._holding: dict[JobKey, Counter[str]] = {}  # per job: those not placed back yet
        super().__init__(free)
        self._nodes: dict[JobKey, set[str]] = {}
        self._slowest: dict[JobKey, float] = {}
        self._covers_every_node: dict[frozenset[str], bool] = {}
        # No node advertises more GPUs than it has devices and none is over-committed: every
        # placement that fits has share 1, so `placement` need not compute the shares.
        self.never_shared = all(gpus >= 0 for gpus in self.free.values()) and all(
            dev.physical <= 0 or dev.replicas <= dev.physical for dev in devices.values()
        )

    def _class_of(self, node: str) -> NodeClass:
        dev = self.devices.get(node)
        free = self.free[node]
        unheld = free > self._held.get(node, 0)
        if dev is None:
            return free, free, False, 1.0, unheld
        exclusive = max(0, min(free, dev.physical - (dev.replicas - free)))
        return free, exclusive, dev.spot, dev.speed, unheld

    def hold(self, demands: Sequence[Demand]) -> None:
        """Marks the GPUs of every running worker as held until the job places a worker back on
        that node. A pass starts every job from its minimum, so another job's growth would see
        those GPUs as free and take them, although that job's worker still runs there and no resize
        moves it (`_cancel_relocations` then shrinks the job). Growth prefers, after the job's own
        nodes, a GPU nobody holds; a held one is still taken when nothing else fits (a preference,
        not a reservation: the policy may shrink a job for another). (Measured with the moves off a
        full node, `single_nodes`: a third fewer rescales and 2.4 % lower simulated goodput JCT;
        bench/README.md.)"""
        for demand in demands:
            if demand.gpus_per_worker > 0 and demand.current_nodes:
                running = self._running[demand.key] = Counter(demand.current_nodes)
                self._holding[demand.key] = running.copy()
                for node, workers in running.items():
                    self._held[node] += workers * demand.gpus_per_worker
        for node in self._held:
            if node in self.free:
                self._index.put(node, self._class_of(node))

    def _hold_again(self, demand: Demand) -> list[str]:
        """The job's running workers placed back are withdrawn: they hold their GPUs again. Returns
        the nodes whose class that changes (for the caller to file once their GPUs are back)."""
        running, holding = self._running.get(demand.key), self._holding.get(demand.key)
        if not running or holding is None:
            return []
        changed = []
        for node, workers in running.items():
            back = workers - holding[node]
            if back:
                holding[node] = workers
                self._held[node] += back * demand.gpus_per_worker
                changed.append(node)
        return changed

    def _used(self, node: str) -> int:
        dev = self.devices.get(node)
        return dev.replicas - self.free.get(node, 0) if dev is not None else 0

    def _most_exclusive(self) -> int:
        """The most GPUs any node has that would get a device of their own."""
        tally = self._index.by_exclusive()
        return max((exclusive for exclusive, nodes in tally.items() if nodes > 0), default=0)

    def _exclusive(self, node: str) -> int:
        """GPUs on `node` that would still get a device of their own (all free ones if unknown)."""
        cls = self._index.class_of(node)
        return cls[1] if cls is not None else 0

    def peek(self, demand: Demand) -> str | None:
        """The node `place` would use next ('' for a GPU-less worker, None when nothing fits)."""
        need = demand.gpus_per_worker
        if need <= 0:
            return ""
        eligible = demand.eligible
        for node in self._sticky.get(demand.key, demand.current_nodes):
            if node in eligible and self.free.get(node, 0) >= need:
                return node
        within_min = len(self._placed.get(demand.key, ())) < demand.min
        mine = self._nodes.get(demand.key, _NO_NODES)  # the nodes of its placed workers (need > 0)
        # A first worker: best fit among the nodes that could hold the whole job, else the roomiest.
        whole = None if mine else demand.max * need
        best: tuple[Rank, str] | None = None
        for node in mine:
            cls = self._index.class_of(node)
            if cls is not None and node in eligible and cls[0] >= need:
                candidate = (_rank(cls, need, within_min, whole, False), node)
                best = candidate if best is None or candidate < best else best
        for cls, names in self._index.groups():
            if cls[0] < need:
                continue
            rank = _rank(cls, need, within_min, whole, True)
            if best is not None and rank > best[0]:
                continue
            name = first_acceptable(names, eligible, mine)
            if name is not None and (best is None or (rank, name) < best):
                best = (rank, name)
        return best[1] if best is not None else None

    def speed(self, node: str) -> float:
        """The relative compute speed of the node's GPU type (1 when unknown)."""
        device = self.devices.get(node)
        return device.speed if device is not None else 1.0

    def place(self, demand: Demand) -> bool:
        node = self.peek(demand)
        if node is None:
            return False
        placed = self._placed.setdefault(demand.key, [])
        if node:
            sticky = self._sticky_nodes(demand)
            del sticky[: sticky.index(node) + 1 if node in sticky else len(sticky)]
            self._placed_on(demand, node)
            self._take(node, demand.gpus_per_worker)
        placed.append(node)
        return True

    def _placed_on(self, demand: Demand, node: str, workers: int = 1) -> None:
        self._nodes.setdefault(demand.key, set()).add(node)
        self._slowest[demand.key] = min(self._slowest.get(demand.key, math.inf), self.speed(node))
        holding = self._holding.get(demand.key)
        if holding and holding[node] > 0:  # placed back where it runs: no longer held (filed by `_take`)
            back = min(workers, holding[node])
            holding[node] -= back
            self._held[node] -= back * demand.gpus_per_worker

    def withdraw(self, demand: Demand) -> None:
        held_again = self._hold_again(demand)
        super().withdraw(demand)
        self._nodes.pop(demand.key, None)
        self._slowest.pop(demand.key, None)
        for node in held_again:
            if node in self.free:
                self._index.put(node, self._class_of(node))

    def room(self, demand: Demand) -> tuple[int, int, int]:
        """(workers that still get an exclusive device on the job's nodes, workers a fresh node
        holds exclusively, how many other eligible nodes could take at least one that way)."""
        need = max(1, demand.gpus_per_worker)
        mine = self._nodes.get(demand.key, _NO_NODES)
        own: dict[int, int] = {}  # the job's nodes by exclusive GPUs
        room = 0
        class_of = self._index.class_of
        for node in mine:
            cls = class_of(node)
            exclusive = cls[1] if cls is not None else 0
            own[exclusive] = own.get(exclusive, 0) + 1
            room += exclusive // need
        if not self._covers(demand.eligible):
            spare = [
                w for w in (self._exclusive(n) // need for n in demand.eligible if n not in mine) if w > 0
            ]
            return room, max(spare, default=1), len(spare)
        # Every node is eligible: count from the index's tally, less the job's own nodes.
        per_node, fresh = 1, 0
        for exclusive, nodes in self._index.by_exclusive().items():
            others = nodes - own.get(exclusive, 0)
            if exclusive >= need and others > 0:
                per_node, fresh = max(per_node, exclusive // need), fresh + others
        return room, per_node, fresh

    def _covers(self, eligible: frozenset[str]) -> bool:
        """`eligible` holds every node of the packing (frozensets cache their hash: O(1) after the
        first call per set)."""
        covers = self._covers_every_node.get(eligible)
        if covers is None:
            covers = self._covers_every_node[eligible] = self.free.keys() <= eligible
        return covers

    def share(self, node: str, extra: int = 0) -> float:
        dev = self.devices.get(node)
        if dev is None or dev.physical <= 0:
            return 1.0
        return max(1.0, (self._used(node) + extra) / dev.physical)

    def placement(self, demand: Demand, extra: str | None = None) -> Placement:
        """The job's placement now, or with one more worker on `extra`."""
        nodes = self._nodes.get(demand.key, _NO_NODES)
        workers = self.count(demand.key) + (extra is not None)
        need = demand.gpus_per_worker
        if self.never_shared and (not extra or self.free.get(extra, 0) >= need):
            share = 1.0
        else:
            real = nodes | {extra} if extra else nodes
            share = max((self.share(n, need if n == extra else 0) for n in real), default=1.0)
        slowest = self._slowest.get(demand.key)
        if extra:
            spread = len(nodes) + (extra not in nodes)
            speed = self.speed(extra) if slowest is None else min(slowest, self.speed(extra))
        else:
            spread = len(nodes)
            speed = 1.0 if slowest is None else slowest
        return Placement(workers=workers, nodes=max(1, spread), share=share, speed=speed)

    def single_nodes(self, demand: Demand) -> list[tuple[str, int, int]]:
        """Where a job could run on one node: (node, its workers there now, how many of its workers
        the node would hold on devices of their own). For a job spread over several nodes, each of
        its own nodes, most-used first, and the roomiest other node; for a job on one node, the
        roomiest other node when it holds more workers than the job has, up to its max (there it
        may grow: free GPUs scattered over busy nodes are worth little to it, and staying put had
        kept such jobs below their best size while GPUs stood idle). [] when it has no placed
        workers."""
        need = demand.gpus_per_worker
        mine_now = self._nodes.get(demand.key, _NO_NODES)
        if need <= 0 or not mine_now:
            return []
        workers = self.count(demand.key)
        if len(mine_now) == 1 and min(self._most_exclusive() // need, demand.max) <= workers:
            return []  # at its max, or no node holds more of its workers: most jobs, found cheaply
        options = []
        if len(mine_now) > 1:
            on = Counter(self._placed[demand.key])
            mine = sorted((n for n in on if n in demand.eligible), key=lambda n: (-on[n], n))
            options = [(node, on[node], on[node] + self._exclusive(node) // need) for node in mine]
        roomiest: tuple[int, str] | None = None
        for (_, exclusive, *_), names in self._index.groups():
            if exclusive < need or (roomiest is not None and exclusive <= roomiest[0]):
                continue
            name = first_acceptable(names, demand.eligible, mine_now)
            if name is not None:
                roomiest = (exclusive, name)
        if roomiest is not None and (len(mine_now) > 1 or min(roomiest[0] // need, demand.max) > workers):
            options.append((roomiest[1], 0, roomiest[0] // need))
        return options

    def place_on(self, demand: Demand, nodes: Sequence[str]) -> None:
        """Leaves the job with exactly one worker on each of `nodes` (ones it holds in the packing
        now, so they fit)."""
        self.withdraw(demand)
        self._sticky[demand.key] = list(nodes)
        self.place_up_to(demand, len(nodes))

    def move(self, demand: Demand, node: str, workers: int) -> None:
        """Leaves the job with `workers` workers (at least those it has there), all on `node`: its
        workers elsewhere go, new ones are placed there (`single_nodes` said they fit)."""
        placed = self._placed.get(demand.key, [])
        for elsewhere in (n for n in placed if n != node):
            self._take(elsewhere, -demand.gpus_per_worker)
        kept = [n for n in placed if n == node]
        self._placed[demand.key] = kept
        self._nodes[demand.key] = set(kept)
        self._slowest[demand.key] = self.speed(node)  # it runs on that node alone now
        self._sticky[demand.key] = [node] * (workers - len(kept))
        self.place_up_to(demand, workers - len(kept))


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


def _cancel_relocations(demands: Sequence[Demand], counts: dict[JobKey, int], packing: SlicedPacking) -> None:
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


def _allocate(
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


class _PassJobs(Generic[T]):
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


def _typical_node(
    eligible: frozenset[str], free: Mapping[str, int], devices: Mapping[str, NodeDevices]
) -> int:
    sizes = [devices[n].physical if n in devices else free.get(n, 0) for n in eligible]
    return max([s for s in sizes if s > 0], default=1)


def _breakpoints(info: Mapping[JobKey, JobMetrics]) -> Breakpoints:
    return lambda demand, count: virtual_node_breakpoints(info[demand.key].virtual_nodes, count)


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
        (B0 while its noise scale is unknown)."""
        fair = PriorityFairShare().allocate(demands, free)
        info = _metrics_of(demands, self.metrics)
        # Jobs share their eligible sets (the simulator's are one), so each set's node size is
        # worked out once per pass, not once per job over every node.
        typical: dict[frozenset[str], int] = {}
        for d in demands:
            if d.eligible not in typical:
                typical[d.eligible] = _typical_node(d.eligible, free, self.devices)
        objective = _GoodputObjective(self, info, fair, typical)
        packing = SlicedPacking(free, self.devices)
        packing.hold(demands)
        counts = _allocate(demands, packing, objective.utility, _breakpoints(info))
        _cancel_relocations(demands, counts, packing)
        moves = self._consolidate(demands, counts, packing, objective.speedup)
        batches = {
            d.key: objective.job(d)[0].best_batch(packing.placement(d))
            for d in demands
            if info[d.key].max_batch is not None and counts[d.key] > 0
        }
        return Allocation(counts, batches, moves)

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


class _GoodputObjective(_PassJobs[tuple[JobModel, float, PlacementValues, float]]):
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


@lru_cache(maxsize=4096)
def _curve(losses: tuple[tuple[float, float], ...]) -> LossCurve | None:
    """The job's fitted curve, memoised across passes; None below 3 reports."""
    return fit_loss_curve(losses)


@dataclass(frozen=True)
class QualityPolicy:
    """SLAQ: give each GPU to the job whose normalised loss would fall most over the next `horizon_s`.

    A job's utility at a placement is its fitted loss curve's normalised reduction over the steps
    it would make in the horizon (steps/s from the throughput model, time-slicing included). Jobs
    with fewer than 3 loss reports use `LossCurve.prior` from step 0, set to halve the loss over
    the horizon on the job's minimum (at least one worker): new jobs are early, with big
    reductions, as SLAQ observes, but more GPUs still help them by a finite amount.
    """

    metrics: Mapping[JobKey, JobMetrics] = field(default_factory=dict)
    devices: Mapping[str, NodeDevices] = field(default_factory=dict)
    now: float = 0.0  # unused: the curves carry their own steps; kept so both policies build alike
    horizon_s: float = 300.0
    name: str = field(default="quality")

    def decide(self, demands: Sequence[Demand], free: Mapping[str, int]) -> Allocation:
        return Allocation(self.allocate(demands, free))

    def allocate(self, demands: Sequence[Demand], free: Mapping[str, int]) -> dict[JobKey, int]:
        info = _metrics_of(demands, self.metrics)
        objective = _QualityObjective(self, info)
        return _allocate(demands, SlicedPacking(free, self.devices), objective.utility, _breakpoints(info))

    def _curve(self, demand: Demand, metrics: JobMetrics, model: JobModel) -> tuple[LossCurve, float]:
        """(curve, the step the job is at): fitted, or the prior from step 0."""
        fitted = _curve(metrics.losses)
        if fitted is not None:
            return fitted, metrics.steps_done()
        half = self.horizon_s / model.step_s(Placement(max(1, demand.min)))
        return LossCurve.prior(half), 0.0


class _QualityObjective(_PassJobs[tuple[JobModel, LossCurve, float]]):
    """One pass's quality objective: per job (model, loss curve, the step it is at), and the
    normalised loss reduction over the policy's horizon at a placement."""

    def __init__(self, policy: QualityPolicy, info: Mapping[JobKey, JobMetrics]) -> None:
        super().__init__()
        self.policy, self.info = policy, info

    def _make(self, demand: Demand) -> tuple[JobModel, LossCurve, float]:
        model = self.info[demand.key].model()
        return model, *self.policy._curve(demand, self.info[demand.key], model)

    def utility(self, demand: Demand, placement: Placement) -> float:
        if placement.workers <= 0:
            return 0.0
        model, curve, step = self.job(demand)
        return curve.normalised_reduction(step, self.policy.horizon_s / model.step_s(placement))


def policy_named(
    name: str, metrics: Mapping[JobKey, JobMetrics], devices: Mapping[str, NodeDevices], now: float
) -> Policy:
    """The policy one pass allocates with (`fair` ignores the metrics)."""
    if name == "fair":
        return PriorityFairShare()
    if name == "goodput":
        return GoodputPolicy(metrics=metrics, devices=devices, now=now)
    if name == "quality":
        return QualityPolicy(metrics=metrics, devices=devices, now=now)
    raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(POLICIES)}")
