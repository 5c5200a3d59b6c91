"""The packings' node index (`allocator.NodeIndex`) against a brute-force scan of every node.

`Packing.place` and `SlicedPacking.peek` / `room` / `placement` find nodes through an index of
nodes by class, kept current as workers are placed and withdrawn; the helpers below are the scans
they replaced, written from the documented preferences. Random clusters (time-sliced or not, spot,
GPU types, nodes without device information, jobs restricted to some nodes, running workers) and
random sequences of placements and withdrawals must give the same answer at every step.
"""

from __future__ import annotations

import random

import pytest
from ebbflow_devtools.builders import make_demand
from ebbflow_operator.decision.allocator import Demand, Packing
from ebbflow_operator.policies import NodeDevices, SlicedPacking
from ebbflow_operator.policies.throughput import Placement

SEEDS = range(60)


def exclusive(packing: SlicedPacking, node: str) -> int:
    """GPUs on `node` that would still get a device of their own (all free ones if unknown)."""
    dev = packing.devices.get(node)
    free = packing.free.get(node, 0)
    return free if dev is None else max(0, min(free, dev.physical - (dev.replicas - free)))


def speed(packing: SlicedPacking, node: str) -> float:
    dev = packing.devices.get(node)
    return dev.speed if dev is not None else 1.0


def scan_peek(packing: SlicedPacking, demand: Demand) -> str | None:
    """Every eligible node that fits, ranked by the preferences `SlicedPacking` documents."""
    need = demand.gpus_per_worker
    if need <= 0:
        return ""
    for node in packing._sticky.get(demand.key, list(demand.current_nodes)):
        if node in demand.eligible and packing.free.get(node, 0) >= need:
            return node
    fits = [n for n in demand.eligible if packing.free.get(n, 0) >= need]
    placed = packing.nodes_of(demand.key)
    within_min = len(placed) < demand.min
    mine = set(placed)

    def spot(n: str) -> bool:
        dev = packing.devices.get(n)
        return within_min and dev is not None and dev.spot

    def head(n: str) -> tuple[bool, bool, float]:
        return spot(n), exclusive(packing, n) < need, -speed(packing, n)

    if mine:
        return min(fits, key=lambda n: (*head(n), n not in mine, packing.free[n], n), default=None)
    whole = demand.max * need

    def fit(n: str) -> tuple[bool, int]:
        free = packing.free[n]
        return (False, free) if free >= whole else (True, -free)

    return min(fits, key=lambda n: (*head(n), *fit(n), n), default=None)


def scan_best_fit(packing: Packing, demand: Demand) -> str | None:
    """`Packing.place`'s choice once the job's running nodes are used up: smallest free, then name."""
    fits = [n for n in demand.eligible if packing.free.get(n, 0) >= demand.gpus_per_worker]
    return min(fits, key=lambda n: (packing.free[n], n), default=None)


def scan_room(packing: SlicedPacking, demand: Demand) -> tuple[int, int, int]:
    need = max(1, demand.gpus_per_worker)
    mine = {n for n in packing.nodes_of(demand.key) if n}
    room = sum(exclusive(packing, n) // need for n in mine)
    spare = [w for w in (exclusive(packing, n) // need for n in demand.eligible if n not in mine) if w > 0]
    return room, max(spare, default=1), len(spare)


def scan_placement(packing: SlicedPacking, demand: Demand, extra: str | None = None) -> Placement:
    nodes = packing.nodes_of(demand.key) + ([extra] if extra is not None else [])
    real = {n for n in nodes if n}
    shares = []
    for n in real:
        dev = packing.devices.get(n)
        if dev is None or dev.physical <= 0:
            shares.append(1.0)
            continue
        used = dev.replicas - packing.free.get(n, 0) + (demand.gpus_per_worker if n == extra else 0)
        shares.append(max(1.0, used / dev.physical))
    slowest = min((speed(packing, n) for n in real), default=1.0)
    return Placement(len(nodes), max(1, len(real)), max(shares, default=1.0), slowest)


def cluster(rnd: random.Random) -> tuple[dict[str, int], dict[str, NodeDevices]]:
    """Up to 24 nodes: physical 1-8, time-sliced x2 on some, spot, three GPU types, some unknown."""
    time_sliced = rnd.random() < 0.5
    free: dict[str, int] = {}
    devices: dict[str, NodeDevices] = {}
    for i in range(rnd.randint(1, 24)):
        name = f"n{rnd.randint(0, 99):02d}-{i}"
        physical = rnd.randint(1, 8)
        replicas = physical * (rnd.choice((1, 2)) if time_sliced else 1)
        if rnd.random() < 0.9:
            devices[name] = NodeDevices(
                physical, replicas, rnd.random() < 0.4, speed=rnd.choice((0.5, 1.0, 2.0))
            )
        free[name] = rnd.randint(0, replicas)
    return free, devices


def jobs(rnd: random.Random, free: dict[str, int]) -> list[Demand]:
    nodes = sorted(free)
    out = []
    for j in range(rnd.randint(1, 6)):
        eligible = nodes if rnd.random() < 0.6 else rnd.sample(nodes, rnd.randint(1, len(nodes)))
        current = tuple(rnd.choice(nodes) for _ in range(rnd.randint(0, 3)))
        lo = rnd.randint(0, 3)
        out.append(
            make_demand(
                f"j{j}",
                lo,
                lo + rnd.randint(0, 8),
                gpus=rnd.choice((0, 1, 1, 1, 2, 3)),
                nodes={n: 0 for n in eligible},
                current=current,
            )
        )
    return out


def check(packing: SlicedPacking, demands: list[Demand]) -> None:
    for d in demands:
        node = packing.peek(d)
        assert node == scan_peek(packing, d), d.key
        assert packing.room(d) == scan_room(packing, d), d.key
        assert packing.placement(d) == scan_placement(packing, d), d.key
        if node is not None:
            assert packing.placement(d, node) == scan_placement(packing, d, node), d.key


@pytest.mark.parametrize("seed", SEEDS)
def test_sliced_packing_matches_a_scan_of_every_node(seed: int) -> None:
    rnd = random.Random(seed)
    free, devices = cluster(rnd)
    demands = jobs(rnd, free)
    packing = SlicedPacking(free, devices)
    for _ in range(40):
        check(packing, demands)
        d = rnd.choice(demands)
        if rnd.random() < 0.1:
            packing.withdraw(d)
        elif rnd.random() < 0.2:
            packing.place_min(d)
        else:
            packing.place(d)
    check(packing, demands)
    assert sum(packing.free.values()) <= sum(free.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_packing_best_fit_matches_a_scan_of_every_node(seed: int) -> None:
    rnd = random.Random(seed)
    free, _ = cluster(rnd)
    demands = jobs(rnd, free)
    packing = Packing(free)
    for _ in range(40):
        d = rnd.choice(demands)
        if rnd.random() < 0.1:
            packing.withdraw(d)
            continue
        sticky = packing._sticky.get(d.key, list(d.current_nodes))
        need = d.gpus_per_worker
        runs_on = next((n for n in sticky if n in d.eligible and packing.free.get(n, 0) >= need), None)
        expected = "" if need <= 0 else runs_on or scan_best_fit(packing, d)
        placed = packing.place(d)
        assert placed == (expected is not None)
        if placed:
            assert packing.nodes_of(d.key)[-1] == expected


def one_at_a_time(packing: Packing, demand: Demand, workers: int) -> int:
    """What `place_up_to` must equal: `place` until it fails."""
    placed = 0
    while placed < workers and packing.place(demand):
        placed += 1
    return placed


@pytest.mark.parametrize("sliced", [False, True], ids=["packing", "sliced"])
@pytest.mark.parametrize("seed", SEEDS)
def test_place_up_to_places_as_one_worker_at_a_time_would(seed: int, sliced: bool) -> None:
    """`place_up_to` puts a run of a job's running workers on one node in one step; every node, count,
    free GPU, and the next choice of every job must be what single placements give."""
    rnd = random.Random(seed)
    free, devices = cluster(rnd)
    demands = jobs(rnd, free)
    batched, single = (
        (SlicedPacking(free, devices), SlicedPacking(free, devices))
        if sliced
        else (
            Packing(free),
            Packing(free),
        )
    )
    for _ in range(30):
        d = rnd.choice(demands)
        if rnd.random() < 0.1:
            batched.withdraw(d)
            single.withdraw(d)
            continue
        workers = rnd.randint(0, 5)
        assert batched.place_up_to(d, workers) == one_at_a_time(single, d, workers)
        assert batched.free == single.free
        for job in demands:
            assert batched.nodes_of(job.key) == single.nodes_of(job.key)
            if isinstance(batched, SlicedPacking) and isinstance(single, SlicedPacking):
                assert batched.peek(job) == single.peek(job)
                assert batched.placement(job) == single.placement(job)
                assert batched.room(job) == single.room(job)
