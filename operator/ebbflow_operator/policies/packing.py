"""Where a policy's workers go: `SlicedPacking`, the packing that knows physical devices, spot nodes
and locality. Pure.

Spot: a job's first `min` workers go to on-demand nodes when any fits (then a preemption never
takes the job below its minimum); further workers are placed as usual, and running workers keep
their nodes either way. Time-slicing: a node advertises `replicas` GPUs backed by `physical`
devices; workers beyond the physical count share devices, and the packing prefers nodes with an
idle physical device (the throughput model slows a job by its most contended node's share)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..decision.allocator import Demand, NodeClass, Packing, first_acceptable
from ..decision.model import JobKey
from .throughput import Placement

_NO_NODES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NodeDevices:
    """A node's physical GPUs and the `nvidia.com/gpu` replicas it advertises (time-slicing)."""

    physical: int
    replicas: int
    spot: bool = False  # may be taken away at any time (model.SPOT_LABELS)
    gpu_type: str = ""  # the GPU product (model.LABEL_GPU_PRODUCT without "-SHARED")
    speed: float = 1.0  # relative compute speed of that type (throughput.compute_speeds)


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
        moves it (`greedy.cancel_relocations` then shrinks the job). Growth prefers, after the job's own
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
