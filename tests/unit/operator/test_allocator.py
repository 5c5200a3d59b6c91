"""Allocator: priority first, then max-min fair share, whole workers packed on eligible nodes.

The cases every policy shares (bounds, holds, whole pods per node, priority levels) are in
`test_policies.py`, run against this policy too."""

from __future__ import annotations

import pytest
from ebbflow_devtools.builders import NODES4, make_demand
from ebbflow_operator.decision.allocator import (
    Allocation,
    Demand,
    Packing,
    PriorityFairShare,
    growth_in_room,
    most_used_first,
)

CASES = [
    pytest.param([make_demand("a", 1, 8)], NODES4, {"a": 8}, id="one job gets its max"),
    pytest.param([make_demand("a", 1, 32)], NODES4, {"a": 16}, id="one job gets what fits"),
    pytest.param([make_demand("a", 20, 32)], NODES4, {"a": 0}, id="min does not fit: waits"),
    pytest.param(
        [make_demand("a", 1, 16, created=1), make_demand("b", 1, 16, created=2)],
        NODES4,
        {"a": 8, "b": 8},
        id="fair split",
    ),
    pytest.param(
        [make_demand("a", 1, 3, created=1), make_demand("b", 1, 16, created=2)],
        NODES4,
        {"a": 3, "b": 13},
        id="max-min: the small job is capped, the rest goes to the big one",
    ),
    pytest.param(
        [
            make_demand("a", 1, 16, created=1),
            make_demand("b", 1, 16, created=2),
            make_demand("c", 1, 16, created=3),
        ],
        NODES4,
        {"a": 6, "b": 5, "c": 5},
        id="odd remainder goes to the oldest",
    ),
    pytest.param(
        [
            make_demand("a", 1, 16, created=1, current=("n0",) * 4 + ("n1",)),
            make_demand("b", 1, 16, created=2, current=("n1",) * 3 + ("n2",) * 3),
            make_demand("c", 1, 16, created=3, current=("n3",) * 4 + ("n2",)),
        ],
        NODES4,
        {"a": 5, "b": 6, "c": 5},
        id="odd remainder stays with the job running it",
    ),
    pytest.param(
        [
            make_demand("a", 1, 16, created=1, current=("n0",) * 4 + ("n1",)),
            make_demand("b", 1, 16, created=2, current=("n1",) * 3 + ("n2",) * 2),
            make_demand("c", 1, 16, created=3, current=("n3",) * 4 + ("n2",)),
        ],
        NODES4,
        {"a": 6, "b": 5, "c": 5},
        id="odd remainder nobody runs goes to the oldest",
    ),
    pytest.param(
        [
            make_demand("low", 2, 16, priority=0, created=1),
            make_demand("high", 2, 12, priority=10, created=2),
        ],
        NODES4,
        {"high": 12, "low": 4},
        id="higher priority gets its max first",
    ),
    pytest.param(
        [make_demand("big-min", 10, 10, created=1), make_demand("small", 2, 8, created=2)],
        NODES4,
        {"big-min": 10, "small": 6},
        id="minimums before fair growth",
    ),
    pytest.param(
        [make_demand("picky", 1, 8, nodes={"n0": 4})], NODES4, {"picky": 4}, id="only eligible nodes count"
    ),
]


@pytest.mark.parametrize(("demands", "free", "expected"), CASES)
def test_priority_fair_share(demands: list[Demand], free: dict[str, int], expected: dict[str, int]) -> None:
    allocation = PriorityFairShare().allocate(demands, free)
    assert {key[1]: count for key, count in allocation.items()} == expected


def test_allocations_fit_and_respect_bounds() -> None:
    demands = [
        make_demand(f"j{i}", 1 + i % 2, 7, gpus=1 + i % 3, created=i, priority=i % 2) for i in range(6)
    ]
    allocation = PriorityFairShare().allocate(demands, NODES4)
    used = sum(allocation[d.key] * d.gpus_per_worker for d in demands)
    assert 0 < used <= sum(NODES4.values())
    for d in demands:
        assert allocation[d.key] == 0 or d.min <= allocation[d.key] <= d.max


def test_running_workers_keep_their_nodes() -> None:
    packing = Packing({"a": 4, "b": 4})
    sticky = make_demand("s", 1, 2, nodes={"a": 4, "b": 4}, current=("b", "b"))
    assert packing.place(sticky) and packing.place(sticky)
    assert packing.free == {"a": 4, "b": 2}


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param((), (), id="none"),
        pytest.param(("b", "a", "b"), ("b", "b", "a"), id="most-used-first"),
        pytest.param(("c", "a", "c", "a"), ("a", "a", "c", "c"), id="by-name-on-a-tie"),
        pytest.param(("x", "y", "z", "y", "y", "x"), ("y", "y", "y", "x", "x", "z"), id="three-nodes"),
    ],
)
def test_most_used_first(nodes: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert most_used_first(nodes) == expected


def test_a_shrinking_job_keeps_the_workers_that_are_together() -> None:
    """Two of three workers kept: the two on one node, not one on each (fewer nodes, less sync)."""
    free = {"a": 4, "b": 4}
    packing = Packing(free)
    shrinking = make_demand("s", 1, 3, nodes=free, current=most_used_first(("a", "b", "b")))
    assert packing.place(shrinking) and packing.place(shrinking)
    assert packing.nodes_of(shrinking.key) == ["b", "b"]


def test_best_fit_leaves_large_holes_for_large_pods() -> None:
    packing = Packing({"big": 4, "small": 1})
    assert packing.place(make_demand("one", 1, 1, nodes={"big": 4, "small": 1}))
    assert packing.free == {"big": 4, "small": 0}


@pytest.mark.parametrize(
    ("growth", "room", "expected"),
    [
        pytest.param({"a": ("n0", "n0")}, {"n0": 2}, {"a": ("n0", "n0")}, id="fits"),
        pytest.param({"a": ("n0", "n1")}, {"n0": 1, "n1": 0}, {}, id="part-of-it-held-now: none"),
        pytest.param({"wide": ("n0",)}, {"n0": 1}, {}, id="a-two-gpu-worker-in-one-gpu"),
        pytest.param(
            {"a": ("n0", "n0"), "high": ("n0",)}, {"n0": 2}, {"high": ("n0",)}, id="higher-priority-first"
        ),
        pytest.param({"a": ("n0",), "b": ("n0",)}, {"n0": 1}, {"a": ("n0",)}, id="then-the-older"),
    ],
)
def test_growth_in_room(
    growth: dict[str, tuple[str, ...]], room: dict[str, int], expected: dict[str, tuple[str, ...]]
) -> None:
    """Growths pinned only where their GPUs are free now, whole, in the allocation's order."""
    demands = [
        make_demand("a", 1, 4, created=1.0),
        make_demand("b", 1, 4, created=2.0),
        make_demand("high", 1, 4, priority=10, created=3.0),
        make_demand("wide", 1, 4, gpus=2),
    ]
    allocation = Allocation({}, growth={("ns", name): nodes for name, nodes in growth.items()})
    fitting = growth_in_room(allocation, demands, room)
    assert {key[1]: nodes for key, nodes in fitting.items()} == expected
