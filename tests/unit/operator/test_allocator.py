"""Allocator: priority first, then max-min fair share, whole workers packed on eligible nodes."""

from __future__ import annotations

import pytest
from ebbflow_operator.allocator import Demand, Packing, PriorityFairShare

NODES4 = {f"n{i}": 4 for i in range(4)}  # 16 GPUs


def demand(
    name: str,
    lo: int,
    hi: int,
    priority: int = 0,
    created: float = 0.0,
    gpus: int = 1,
    nodes: dict[str, int] | None = None,
    current: tuple[str, ...] = (),
) -> Demand:
    return Demand(
        key=("ns", name),
        min=lo,
        max=hi,
        gpus_per_worker=gpus,
        eligible=frozenset(nodes if nodes is not None else NODES4),
        priority=priority,
        created=created,
        current_nodes=current,
    )


CASES = [
    pytest.param([demand("a", 1, 8)], NODES4, {"a": 8}, id="one job gets its max"),
    pytest.param([demand("a", 1, 32)], NODES4, {"a": 16}, id="one job gets what fits"),
    pytest.param([demand("a", 20, 32)], NODES4, {"a": 0}, id="min does not fit: waits"),
    pytest.param(
        [demand("a", 1, 16, created=1), demand("b", 1, 16, created=2)],
        NODES4,
        {"a": 8, "b": 8},
        id="fair split",
    ),
    pytest.param(
        [demand("a", 1, 3, created=1), demand("b", 1, 16, created=2)],
        NODES4,
        {"a": 3, "b": 13},
        id="max-min: the small job is capped, the rest goes to the big one",
    ),
    pytest.param(
        [demand("a", 1, 16, created=1), demand("b", 1, 16, created=2), demand("c", 1, 16, created=3)],
        NODES4,
        {"a": 6, "b": 5, "c": 5},
        id="odd remainder goes to the oldest",
    ),
    pytest.param(
        [demand("low", 2, 16, priority=0, created=1), demand("high", 2, 12, priority=10, created=2)],
        NODES4,
        {"high": 12, "low": 4},
        id="higher priority gets its max first",
    ),
    pytest.param(
        [demand("low", 6, 16, priority=0, created=1), demand("high", 2, 12, priority=10, created=2)],
        NODES4,
        {"high": 12, "low": 0},
        id="lower priority waits when its min no longer fits",
    ),
    pytest.param(
        [demand("big-min", 10, 10, created=1), demand("small", 2, 8, created=2)],
        NODES4,
        {"big-min": 10, "small": 6},
        id="minimums before fair growth",
    ),
    pytest.param(
        [demand("two-gpus", 1, 8, gpus=2, nodes={"a": 3, "b": 3, "c": 1})],
        {"a": 3, "b": 3, "c": 1},
        {"two-gpus": 2},
        id="whole pods per node",
    ),
    pytest.param(
        [demand("picky", 1, 8, nodes={"n0": 4})], NODES4, {"picky": 4}, id="only eligible nodes count"
    ),
    pytest.param([demand("cpu-only", 2, 5, gpus=0)], {}, {"cpu-only": 5}, id="no GPUs needed: max"),
    pytest.param([demand("held", 1, 0)], NODES4, {"held": 0}, id="hold below min: nothing"),
]


@pytest.mark.parametrize(("demands", "free", "expected"), CASES)
def test_priority_fair_share(demands: list[Demand], free: dict[str, int], expected: dict[str, int]) -> None:
    allocation = PriorityFairShare().allocate(demands, free)
    assert {key[1]: count for key, count in allocation.items()} == expected


def test_allocations_fit_and_respect_bounds() -> None:
    demands = [demand(f"j{i}", 1 + i % 2, 7, gpus=1 + i % 3, created=i, priority=i % 2) for i in range(6)]
    allocation = PriorityFairShare().allocate(demands, NODES4)
    used = sum(allocation[d.key] * d.gpus_per_worker for d in demands)
    assert 0 < used <= sum(NODES4.values())
    for d in demands:
        assert allocation[d.key] == 0 or d.min <= allocation[d.key] <= d.max


def test_running_workers_keep_their_nodes() -> None:
    packing = Packing({"a": 4, "b": 4})
    sticky = demand("s", 1, 2, nodes={"a": 4, "b": 4}, current=("b", "b"))
    assert packing.place(sticky) and packing.place(sticky)
    assert packing.free == {"a": 4, "b": 2}


def test_best_fit_leaves_large_holes_for_large_pods() -> None:
    packing = Packing({"big": 4, "small": 1})
    assert packing.place(demand("one", 1, 1, nodes={"big": 4, "small": 1}))
    assert packing.free == {"big": 4, "small": 0}
