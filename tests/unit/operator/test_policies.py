"""Goodput (Pollux) and quality (SLAQ) policies: the bounds and degenerate cases every policy shares (the
default `PriorityFairShare` included), then each objective."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest
from ebbflow_devtools.builders import NODES4, make_demand
from ebbflow_operator.decision.allocator import Demand, Policy, PriorityFairShare
from ebbflow_operator.policies import GoodputPolicy, JobMetrics, NodeDevices, QualityPolicy, SlicedPacking
from ebbflow_operator.policies.goodput import _goodputs
from ebbflow_operator.policies.greedy import (
    cancel_relocations,
    growth_nodes,
    kept_in_place,
    virtual_node_breakpoints,
)
from ebbflow_operator.policies.loss_curve import LossCurve
from ebbflow_operator.policies.throughput import JobModel, Measurement, Placement, ThroughputParams

NOW = 100_000.0
SCALES_WELL = ThroughputParams(0.01, 0.002, 0.002, 0.0005, 0.01, 0.001, 3.0)
SYNC_BOUND = ThroughputParams(0.01, 0.002, 0.05, 0.01, 0.3, 0.05, 1.0)
CURVE = LossCurve(a=5.0, b=40.0, c=0.3)


def measured(truth: ThroughputParams) -> tuple[Measurement, ...]:
    """What trainers of a job with these parameters report at a few sizes (s = 1)."""
    return tuple(
        Measurement(k, m, truth.step_s(Placement(k, n), m, 1), truth.compute_s(m), n, 1)
        for k in (1, 2, 4, 8, 16)
        for n in ((1, 2) if k > 1 else (1,))
        for m in (8.0, 16.0)
    )


def losses(start: int, stop: int, every: int = 50) -> tuple[tuple[float, float], ...]:
    return tuple((float(k), CURVE.loss(k)) for k in range(start, stop, every))


def metrics(truth: ThroughputParams = SCALES_WELL, virtual: int = 64, **fields: object) -> JobMetrics:
    return JobMetrics(global_batch=512, virtual_nodes=virtual, measurements=measured(truth), **fields)  # type: ignore[arg-type]


PolicyFactory = Callable[..., Policy]
POLICIES = [pytest.param(GoodputPolicy, id="goodput"), pytest.param(QualityPolicy, id="quality")]


def priority_fair_share(**_: object) -> Policy:
    """The default policy; it takes none of the inputs the others weigh."""
    return PriorityFairShare()


EVERY_POLICY = [*POLICIES, pytest.param(priority_fair_share, id="priority-fair-share")]


def run(
    factory: PolicyFactory, demands: list[Demand], free: Mapping[str, int], **inputs: object
) -> dict[str, int]:
    return {key[1]: n for key, n in factory(**inputs).allocate(demands, free).items()}


# --- shared by every policy: bounds, priority and degenerate cases ----------------------------------

SHARED = [
    pytest.param([make_demand("a", 1, 8)], {}, {"a": 0}, id="no GPUs"),
    pytest.param([make_demand("a", 1, 8)], {"n0": 0, "n1": 0}, {"a": 0}, id="nodes with nothing free"),
    pytest.param([make_demand("a", 1, 16)], NODES4, {"a": 16}, id="one job (prior) takes the cluster"),
    pytest.param([make_demand("a", 1, 3)], NODES4, {"a": 3}, id="one job capped at its max"),
    pytest.param(
        [make_demand(j, 4, 16, created=i) for i, j in enumerate("abcd")],
        NODES4,
        dict.fromkeys("abcd", 4),
        id="every job at min",
    ),
    pytest.param(
        [make_demand("huge", 20, 32, created=1), make_demand("small", 1, 4, created=2)],
        NODES4,
        {"huge": 0, "small": 4},
        id="a job larger than the cluster waits",
    ),
    pytest.param(
        [make_demand(j, 0, 8, created=i) for i, j in enumerate("abc")],
        {"n0": 3},
        dict.fromkeys("abc", 1),
        id="min 0: every job gets a first worker before any grows",
    ),
    pytest.param([make_demand("held", 1, 0)], NODES4, {"held": 0}, id="hold below min: nothing"),
    pytest.param([make_demand("cpu", 2, 5, gpus=0)], {}, {"cpu": 5}, id="no GPUs needed: max"),
    pytest.param(
        [make_demand("two", 1, 8, gpus=2, nodes={"a": 3, "b": 3, "c": 1})],
        {"a": 3, "b": 3, "c": 1},
        {"two": 2},
        id="whole pods per node",
    ),
    pytest.param(
        [
            make_demand("low", 6, 16, priority=0, created=1),
            make_demand("high", 2, 12, priority=10, created=2),
        ],
        NODES4,
        {"high": 12, "low": 0},
        id="priority first: lower level waits when its min no longer fits",
    ),
]


@pytest.mark.parametrize("factory", EVERY_POLICY)
@pytest.mark.parametrize(("demands", "free", "expected"), SHARED)
def test_shared_cases(
    factory: PolicyFactory, demands: list[Demand], free: dict[str, int], expected: dict[str, int]
) -> None:
    assert run(factory, demands, free, now=NOW) == expected


@pytest.mark.parametrize("factory", POLICIES)
@pytest.mark.parametrize("seed", range(5))
def test_allocations_fit_and_respect_bounds(factory: PolicyFactory, seed: int) -> None:
    rnd = random.Random(seed)
    free = {f"n{i}": rnd.choice([0, 2, 4, 8]) for i in range(6)}
    devices = {name: NodeDevices(physical=2, replicas=8) for name in list(free)[:3]}
    demands = [
        make_demand(
            f"j{i}", rnd.randint(0, 3), rnd.randint(0, 10), rnd.randint(0, 1), i, rnd.randint(1, 2), free
        )
        for i in range(8)
    ]
    job_metrics = {d.key: metrics(rnd.choice([SCALES_WELL, SYNC_BOUND])) for d in demands[::2]}
    allocation = factory(metrics=job_metrics, devices=devices, now=NOW).allocate(demands, free)
    assert sum(allocation[d.key] * d.gpus_per_worker for d in demands) <= sum(free.values())
    for d in demands:
        assert allocation[d.key] == 0 or d.min <= allocation[d.key] <= d.max, d


# --- goodput -------------------------------------------------------------------------------------


def test_goodput_gives_more_to_the_job_that_scales_better() -> None:
    job_metrics = {("ns", "good"): metrics(SCALES_WELL), ("ns", "bad"): metrics(SYNC_BOUND)}
    for first, second in (("good", "bad"), ("bad", "good")):
        demands = [make_demand(first, 1, 16, created=1), make_demand(second, 1, 16, created=2)]
        allocation = run(GoodputPolicy, demands, NODES4, metrics=job_metrics, now=NOW)
        assert allocation["good"] > 8 > allocation["bad"] >= 1, allocation


def test_goodput_prior_lets_an_unmeasured_job_grow_next_to_a_measured_one() -> None:
    demands = [make_demand("bad", 1, 16, created=1), make_demand("new", 1, 16, created=2)]
    allocation = run(GoodputPolicy, demands, NODES4, metrics={("ns", "bad"): metrics(SYNC_BOUND)}, now=NOW)
    assert allocation["new"] > allocation["bad"] >= 1, allocation


def test_goodput_leaves_gpus_that_would_slow_a_job_down() -> None:
    allocation = run(
        GoodputPolicy, [make_demand("bad", 1, 16)], NODES4, metrics={("ns", "bad"): metrics(SYNC_BOUND)}
    )
    assert allocation == {"bad": 4}  # one node: crossing nodes costs more than it gives


def test_goodput_gives_no_worker_beyond_the_virtual_nodes() -> None:
    allocation = run(
        GoodputPolicy, [make_demand("a", 1, 16)], NODES4, metrics={("ns", "a"): metrics(virtual=6)}
    )
    assert allocation == {"a": 6}


@pytest.mark.parametrize(
    ("rescales", "age", "expected"),
    [
        pytest.param(0, NOW, 16, id="old job, no rescales: grows"),
        pytest.param(5, 400.0, 4, id="young job that rescaled often: keeps its size"),
    ],
)
def test_goodput_rescale_penalty(rescales: int, age: float, expected: int) -> None:
    job_metrics = {("ns", "a"): metrics(rescales=rescales, rescale_pause_s=60.0)}
    running = make_demand("a", 1, 16, created=NOW - age, current=("n0",) * 4)
    assert run(GoodputPolicy, [running], NODES4, metrics=job_metrics, now=NOW) == {"a": expected}


# --- goodput: a job spread over several nodes moves onto one (Allocation.moves) --------------------


def placed(packing: SlicedPacking, demand: Demand) -> SlicedPacking:
    """`packing` with the demand's running workers placed where they run."""
    for _ in demand.current_nodes:
        assert packing.place(demand)
    return packing


@pytest.mark.parametrize(
    ("free", "current", "expected"),
    [
        pytest.param(
            {"a": 4, "b": 4},
            ("b", "a", "a", "a"),
            [("a", 3, 4), ("b", 1, 4)],
            id="own nodes, most-used first",
        ),
        pytest.param(
            {"a": 2, "b": 2, "c": 8, "d": 4},
            ("a", "a", "b", "b"),
            [("a", 2, 2), ("b", 2, 2), ("c", 0, 8)],
            id="and the roomiest other node",
        ),
        pytest.param({"a": 4, "b": 4}, ("a", "a"), [("b", 0, 4)], id="on one node: the roomiest other"),
        pytest.param({"a": 4, "b": 2}, ("a", "a"), [], id="on one node, no other with room for more"),
    ],
)
def test_single_nodes(
    free: dict[str, int], current: tuple[str, ...], expected: list[tuple[str, int, int]]
) -> None:
    job = make_demand("j", 1, 8, nodes=free, current=current)
    assert placed(SlicedPacking(free, {}), job).single_nodes(job) == expected


def test_single_nodes_count_only_devices_of_their_own() -> None:
    """A node whose free GPUs would share devices with busy ones holds none of the job's workers."""
    devices = {"a": NodeDevices(2, 2), "b": NodeDevices(2, 2), "sliced": NodeDevices(2, 8)}
    free = {"a": 2, "b": 2, "sliced": 4}  # 4 replicas free, but both physical devices are in use
    job = make_demand("j", 1, 4, nodes=free, current=("a", "a", "b", "b"))
    assert placed(SlicedPacking(free, devices), job).single_nodes(job) == [("a", 2, 2), ("b", 2, 2)]


@pytest.mark.parametrize(
    ("workers", "nodes"),
    [pytest.param(4, ["a"] * 4, id="same size"), pytest.param(3, ["a"] * 3, id="smaller")],
)
def test_move_leaves_the_job_on_one_node(workers: int, nodes: list[str]) -> None:
    free = {"a": 4, "b": 4}
    job = make_demand("j", 1, 4, nodes=free, current=("a", "a", "b", "b"))
    packing = placed(SlicedPacking(free, {}), job)
    packing.move(job, "a", workers)
    assert packing.nodes_of(job.key) == nodes
    assert packing.free == {"a": 4 - workers, "b": 4}
    assert packing.placement(job) == Placement(workers=workers, nodes=1, share=1.0)


def test_move_onto_a_faster_node_runs_at_its_speed() -> None:
    """Spread over a slow node and a fast one, the job runs at the slow one's pace; moved onto the
    fast node alone, at the fast one's (the slowest GPU type is the new node's, not the old min)."""
    free = {"fast": 4, "slow": 4}
    devices = {"fast": NodeDevices(4, 4, speed=2.0), "slow": NodeDevices(4, 4, speed=0.5)}
    job = make_demand("j", 1, 4, nodes=free, current=("fast", "fast", "slow", "slow"))
    packing = placed(SlicedPacking(free, devices), job)
    assert packing.placement(job).speed == 0.5
    packing.move(job, "fast", 4)
    assert packing.placement(job) == Placement(workers=4, nodes=1, share=1.0, speed=2.0)


@pytest.mark.parametrize(
    ("rescales", "age", "moves"),
    [
        pytest.param(0, NOW, {"j": ("n0",) * 2}, id="old job: moves onto its own node with room"),
        pytest.param(5, 400.0, {}, id="young job that rescaled often: stays spread"),
    ],
)
def test_goodput_moves_a_spread_job_onto_one_node(
    rescales: int, age: float, moves: dict[str, tuple[str, ...]]
) -> None:
    """Cross-node sync dominates SYNC_BOUND's step: on one node it runs much faster, which pays the
    rescale pause unless the restart factor (age, rescales) says it does not. `other` fills n1, so
    the spread job's workers there go to n0."""
    job_metrics = {("ns", "j"): metrics(SYNC_BOUND, virtual=4, rescales=rescales, rescale_pause_s=60.0)}
    spread = make_demand("j", 4, 4, created=NOW - age, current=("n1", "n1", "n0", "n0"))
    other = make_demand("other", 2, 2, created=0.0, current=("n1", "n1"))
    free = {"n0": 4, "n1": 4}
    decision = GoodputPolicy(metrics=job_metrics, now=NOW).decide([other, spread], free)
    assert decision.counts == {("ns", "j"): 4, ("ns", "other"): 2}
    assert {key[1]: nodes for key, nodes in decision.moves.items()} == moves


@pytest.mark.parametrize(
    ("rescales", "age", "moves"),
    [
        pytest.param(0, NOW, {"j": ("n1",) * 4}, id="old job: moves off its full node to grow"),
        pytest.param(5, 400.0, {}, id="young job that rescaled often: stays"),
    ],
)
def test_goodput_moves_a_job_off_its_full_node(
    rescales: int, age: float, moves: dict[str, tuple[str, ...]]
) -> None:
    """`j` runs 2 workers on n0, whose other 2 GPUs `other` holds; n1 is empty. Growing onto n1
    would spread it (SYNC_BOUND: cross-node sync dominates), so the greedy leaves it at 2; running
    4 on n1 pays the rescale pause unless the restart factor says it does not."""
    job_metrics = {("ns", "j"): metrics(SYNC_BOUND, virtual=4, rescales=rescales, rescale_pause_s=60.0)}
    job = make_demand("j", 1, 4, created=NOW - age, current=("n0", "n0"))
    other = make_demand("other", 2, 2, created=0.0, current=("n0", "n0"))
    decision = GoodputPolicy(metrics=job_metrics, now=NOW).decide([other, job], {"n0": 4, "n1": 4})
    assert decision.counts == {("ns", "j"): 4 if moves else 2, ("ns", "other"): 2}
    assert {key[1]: nodes for key, nodes in decision.moves.items()} == moves


def cross_node_halves(_: Demand, placement: Placement) -> float:
    """A speedup model for `_consolidate` alone: linear in workers, halved across nodes."""
    return placement.workers * (1.0 if placement.nodes == 1 else 0.5)


@pytest.mark.parametrize(
    ("free", "count", "expected"),
    [
        pytest.param(
            {"n0": 4, "n1": 4}, 6, (4, ("n0",), 1), id="smaller on its own node: 4 on one beat 6 on two"
        ),
        pytest.param(
            {"n0": 4, "n1": 4, "n2": 8}, 6, (8, ("n2",) * 8, 1), id="on the roomiest other node, up to max"
        ),
        pytest.param({"n0": 4, "n1": 4}, 4, (4, (), 2), id="resized this pass: left to the greedy"),
        pytest.param({"n0": 3, "n1": 3}, 6, (6, (), 2), id="no node holds more than it has there"),
    ],
)
def test_consolidate(free: dict[str, int], count: int, expected: tuple[int, tuple[str, ...], int]) -> None:
    """`_consolidate` on its own: six workers, three on n0 and three on n1 (max 8): (count after,
    the new workers' node per worker, nodes the packing then has the job on)."""
    job = make_demand("j", 2, 8, nodes=free, current=("n0",) * 3 + ("n1",) * 3)
    packing = placed(SlicedPacking(free, {}), job)
    counts = {job.key: count}
    moves = GoodputPolicy(now=NOW)._consolidate([job], counts, packing, cross_node_halves)
    nodes = len(set(packing.nodes_of(job.key)))
    assert (counts[job.key], moves.get(job.key, ()), nodes) == expected


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param(("a", "a", "b", "c"), 4, id="every worker where it runs"),
        pytest.param(("a", "a", "b", "c", "d"), 4, id="grown onto another node"),
        pytest.param(("a", "a", "b"), 3, id="shrunk: the least-used node's worker goes"),
        pytest.param(("a", "a", "b", "d"), 3, id="c's worker moved to d"),
        pytest.param(("a", "a", "c", "d"), 2, id="b's worker moved: none kept past it"),
        pytest.param(("d", "d"), 0, id="moved away entirely"),
    ],
)
def test_kept_in_place(nodes: tuple[str, ...], expected: int) -> None:
    """Running on a, a, b, c (most-used first): how many of those workers `nodes` keeps in order."""
    job = make_demand("j", 1, 8, current=("a", "a", "b", "c"))
    assert kept_in_place(job, nodes) == expected


@pytest.mark.parametrize(
    ("lo", "plan", "expected"),
    [
        pytest.param(1, ("a", "a", "b", "b"), ("a", "a", "b", "b"), id="kept where it runs"),
        pytest.param(1, ("a", "a", "b", "b", "c"), ("a", "a", "b", "b", "c"), id="grown: kept"),
        pytest.param(1, ("a", "a", "b", "c"), ("a", "a", "b"), id="a worker moved to c: shrinks instead"),
        pytest.param(1, ("a", "a", "c", "c"), ("a", "a"), id="both of b's moved: shrinks onto a"),
        pytest.param(3, ("a", "a", "c", "c"), ("a", "a", "c", "c"), id="below its min: left as planned"),
    ],
)
def test_cancel_relocations(lo: int, plan: tuple[str, ...], expected: tuple[str, ...]) -> None:
    """The greedy's plan for a job running on a, a, b, b: a worker it would move to another node at
    the same count (its GPU taken by another job's growth) is not moved; the job shrinks onto the
    workers it keeps in place, in the packing and in the counts."""
    free = {"a": 4, "b": 4, "c": 4}
    job = make_demand("j", lo, 8, nodes=free, current=("a", "a", "b", "b"))
    packing = SlicedPacking(free, {})
    packing.place_on(job, plan)
    counts = {job.key: len(plan)}
    cancel_relocations([job], counts, packing)
    assert (counts[job.key], tuple(packing.nodes_of(job.key))) == (len(expected), expected)


# --- where growth goes (Allocation.growth: the operator pins new workers there) --------------------


@pytest.mark.parametrize(
    ("current", "plan", "gpus", "moved", "expected"),
    [
        pytest.param(("a", "a"), ("a", "a", "c", "a"), 1, False, ("c", "a"), id="beside its workers"),
        pytest.param((), ("c", "c"), 1, False, ("c", "c"), id="a new job"),
        pytest.param(("a", "b"), ("a", "b"), 1, False, None, id="same size"),
        pytest.param(("a", "b"), ("a",), 1, False, None, id="shrunk"),
        pytest.param(("a", "b"), ("a", "c", "c"), 1, False, None, id="a running worker would move"),
        pytest.param(("a", "a"), ("a", "a", "c"), 1, True, None, id="moved: the move's workers"),
        pytest.param(("a",), ("a", ""), 0, False, None, id="gpu-less workers need no node"),
    ],
)
def test_growth_nodes(
    current: tuple[str, ...], plan: tuple[str, ...], gpus: int, moved: bool, expected: tuple[str, ...] | None
) -> None:
    """The nodes of a growing job's new workers in the packing, in placement order, for jobs that
    keep every running worker in place; none for any other job."""
    free = {"a": 4, "b": 4, "c": 4}
    job = make_demand("j", 1, 8, gpus=gpus, nodes=free, current=current)
    packing = SlicedPacking(free, {})
    packing.place_on(job, plan)
    growth = growth_nodes([job], {job.key: len(plan)}, packing, [job.key] if moved else [])
    assert growth.get(job.key) == expected


@pytest.mark.parametrize("factory", POLICIES)
def test_objective_policies_say_where_every_growth_goes(factory: PolicyFactory) -> None:
    """Each growing job's new workers, one node each, beside its running ones: the counts and the
    nodes agree, and the nodes hold what the growth takes."""
    free = {"n0": 4, "n1": 4, "n2": 4}
    running = make_demand("running", 1, 8, created=1.0, nodes=free, current=("n0", "n0"))
    new = make_demand("new", 2, 3, created=2.0, nodes=free)
    decision = factory(metrics={}, now=NOW).decide([running, new], free)
    assert decision.growth, "a prior makes both jobs grow"
    for demand in (running, new):
        grown = decision.counts[demand.key] - len(demand.current_nodes)
        assert len(decision.growth.get(demand.key, ())) == max(0, grown)
    taken = [node for nodes in decision.growth.values() for node in nodes]
    # `free` counts the running workers' GPUs as free (theirs to keep), as the operator's capacity does.
    assert all(taken.count(node) + running.current_nodes.count(node) <= free[node] for node in free)


# --- goodput: batch-size co-adaptation (JobMetrics.max_batch) -------------------------------------


def batching(truth: ThroughputParams, noise: float | None, max_batch: int | None) -> JobMetrics:
    return replace(metrics(truth), noise_scale=noise, max_batch=max_batch)


@pytest.mark.parametrize(
    ("job", "workers", "batch"),
    [
        pytest.param(batching(SCALES_WELL, None, None), 16, None, id="fixed B: no batch chosen"),
        pytest.param(batching(SCALES_WELL, None, 4096), 16, 512, id="phi unknown: B0"),
        pytest.param(batching(SCALES_WELL, 1.0, 4096), 16, 512, id="phi small: B0"),
        pytest.param(batching(SCALES_WELL, 4096.0, 4096), 16, 1024, id="phi large: larger B"),
        pytest.param(batching(SCALES_WELL, 1e6, 4096), 16, 4096, id="phi huge: max"),
        pytest.param(batching(SCALES_WELL, 1e6, 512), 16, 512, id="max == B0"),
        pytest.param(batching(SYNC_BOUND, None, None), 4, None, id="sync-bound, fixed: one node"),
        pytest.param(batching(SYNC_BOUND, 512.0, 4096), 4, 512, id="sync-bound, phi moderate: as fixed"),
        pytest.param(batching(SYNC_BOUND, 4096.0, 4096), 13, 4096, id="sync-bound, phi large: grows, max B"),
    ],
)
def test_goodput_decides_count_and_batch(job: JobMetrics, workers: int, batch: int | None) -> None:
    policy = GoodputPolicy(metrics={("ns", "a"): job}, now=NOW)
    decision = policy.decide([make_demand("a", 1, 16)], NODES4)
    assert decision.counts == policy.allocate([make_demand("a", 1, 16)], NODES4) == {("ns", "a"): workers}
    assert decision.global_batch == ({} if batch is None else {("ns", "a"): batch})


def test_goodput_batch_adaptation_leaves_a_fixed_batch_job_as_it_was() -> None:
    """Next to jobs that may change B, a fixed-B job's share moves only through the others' choices;
    with no noise estimate an adaptive job is allocated exactly as if its B were fixed."""
    demands = [make_demand("fixed", 1, 16, created=1), make_demand("other", 1, 16, created=2)]
    fixed = metrics(SYNC_BOUND)
    unknown = {("ns", "fixed"): fixed, ("ns", "other"): batching(SYNC_BOUND, None, 4096)}
    plain = {("ns", "fixed"): fixed, ("ns", "other"): fixed}
    assert run(GoodputPolicy, demands, NODES4, metrics=unknown, now=NOW) == run(
        GoodputPolicy, demands, NODES4, metrics=plain, now=NOW
    )
    large = {("ns", "fixed"): fixed, ("ns", "other"): batching(SYNC_BOUND, 4096.0, 4096)}
    decision = GoodputPolicy(metrics=large, now=NOW).decide(demands, NODES4)
    assert decision.counts == {("ns", "fixed"): 4, ("ns", "other"): 11}
    assert decision.global_batch == {("ns", "other"): 4096}


def test_goodput_chooses_no_batch_for_a_job_left_without_workers() -> None:
    demands = [make_demand("big", 16, 16, created=1), make_demand("late", 4, 8, created=2)]
    job_metrics = {d.key: batching(SCALES_WELL, 1e6, 4096) for d in demands}
    decision = GoodputPolicy(metrics=job_metrics, now=NOW).decide(demands, NODES4)
    assert decision.counts == {("ns", "big"): 16, ("ns", "late"): 0}
    assert decision.global_batch == {("ns", "big"): 4096}


# --- quality -------------------------------------------------------------------------------------


def test_quality_gives_more_to_the_job_with_more_predicted_reduction() -> None:
    job_metrics = {
        ("ns", "early"): metrics(losses=losses(0, 500)),
        ("ns", "converged"): metrics(losses=losses(0, 30_000, 500)),
    }
    for first, second in (("early", "converged"), ("converged", "early")):
        demands = [make_demand(first, 1, 16, created=1), make_demand(second, 1, 16, created=2)]
        allocation = run(QualityPolicy, demands, NODES4, metrics=job_metrics)
        assert allocation["early"] > allocation["converged"] >= 1, allocation


@pytest.mark.parametrize(
    ("new_metrics", "expected"),
    [
        # 14 or 15 workers leave the busiest with ceil(64/13) = 5 virtual nodes too: no faster than 13.
        pytest.param(metrics(), {"converged": 3, "new": 13}, id="measured, no losses yet"),
        pytest.param(None, {"converged": 4, "new": 12}, id="nothing reported: V = max = 12"),
    ],
)
def test_quality_prior_treats_a_new_job_as_early(
    new_metrics: JobMetrics | None, expected: dict[str, int]
) -> None:
    job_metrics = {("ns", "converged"): metrics(losses=losses(0, 30_000, 500))}
    if new_metrics is not None:
        job_metrics[("ns", "new")] = new_metrics
    demands = [
        make_demand("converged", 1, 16, created=1),
        make_demand("new", 1, 12 if new_metrics is None else 16, created=2),
    ]
    assert run(QualityPolicy, demands, NODES4, metrics=job_metrics) == expected


def test_quality_stops_where_more_gpus_do_not_speed_the_job() -> None:
    allocation = run(
        QualityPolicy,
        [make_demand("a", 1, 16)],
        NODES4,
        metrics={("ns", "a"): metrics(virtual=6, losses=losses(0, 500))},
    )
    assert allocation == {"a": 6}


# --- time-slicing --------------------------------------------------------------------------------

SLICED = {"s": NodeDevices(physical=2, replicas=8)}


@pytest.mark.parametrize("factory", POLICIES)
@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(SLICED, 2, id="2 physical x 4 replicas: exclusive devices only"),
        pytest.param({}, 8, id="devices unknown: every replica counts as a GPU"),
    ],
)
def test_time_slicing_is_not_free(
    factory: PolicyFactory, devices: dict[str, NodeDevices], expected: int
) -> None:
    job = make_demand("a", 1, 8, nodes={"s": 8})
    assert run(factory, [job], {"s": 8}, metrics={("ns", "a"): metrics(virtual=8)}, devices=devices) == {
        "a": expected
    }


def test_packing_prefers_an_idle_physical_device_over_best_fit() -> None:
    devices = {"busy": NodeDevices(physical=2, replicas=4), "idle": NodeDevices(physical=2, replicas=4)}
    free = {"busy": 2, "idle": 4}  # best fit alone would pick "busy", whose devices are both in use
    packing = SlicedPacking(free, devices)
    job = make_demand("a", 1, 2, nodes=free)  # both nodes could hold the whole job
    assert packing.place(job) and packing.place(job)
    assert packing.free == {"busy": 2, "idle": 2}
    assert packing.placement(job) == Placement(workers=2, nodes=1, share=1.0)
    assert packing.place(job)  # the third shares a device wherever it goes
    assert packing.placement(job).share == pytest.approx(1.5)


def test_packing_puts_a_jobs_minimum_on_demand() -> None:
    """A spot preemption should never take a job below its minimum: its first `min` workers go to
    the on-demand node, though the spot node has more room (best fit for the whole job); beyond
    min, placement is as usual (here: on the job's own node first)."""
    devices = {"od": NodeDevices(4, 4), "spot": NodeDevices(8, 8, spot=True)}
    free = {"od": 4, "spot": 8}
    packing = SlicedPacking(free, devices)
    job = make_demand("a", 2, 6, nodes=free)
    for _ in range(6):
        assert packing.place(job)
    assert packing.nodes_of(job.key) == ["od", "od", "od", "od", "spot", "spot"]


def test_packing_prefers_the_faster_gpu_type_and_the_placement_runs_at_the_slowest() -> None:
    devices = {
        "fast": NodeDevices(2, 2, gpu_type="H100", speed=2.0),
        "slow": NodeDevices(4, 4, gpu_type="T4"),
    }
    free = {"fast": 2, "slow": 4}
    packing = SlicedPacking(free, devices)
    job = make_demand("a", 1, 3, nodes=free)
    assert packing.place(job) and packing.place(job)
    assert packing.nodes_of(job.key) == ["fast", "fast"]
    assert packing.placement(job).speed == 2.0
    assert packing.place(job)  # the third worker only fits on the slow node: the step waits for it
    assert packing.placement(job) == Placement(workers=3, nodes=2, share=1.0, speed=1.0)


def test_running_workers_stay_on_spot_even_below_the_minimum() -> None:
    devices = {"od": NodeDevices(4, 4), "spot": NodeDevices(4, 4, spot=True)}
    packing = SlicedPacking({"od": 4, "spot": 4}, devices)
    job = make_demand("a", 2, 2, nodes={"od": 4, "spot": 4}, current=("spot", "spot"))
    assert packing.place(job) and packing.place(job)
    assert packing.nodes_of(job.key) == ["spot", "spot"]


def test_packing_keeps_running_workers_on_their_nodes() -> None:
    packing = SlicedPacking({"a": 4, "b": 4}, {})
    job = make_demand("s", 1, 3, nodes={"a": 4, "b": 4}, current=("b", "b"))
    assert packing.place(job) and packing.place(job) and packing.place(job)
    assert packing.free == {"a": 4, "b": 1}


@pytest.mark.parametrize(
    ("free", "hold", "current", "expected"),
    [
        pytest.param({"a": 4, "b": 4}, True, (), "b", id="first worker: a GPU nobody holds over best fit"),
        pytest.param({"a": 4, "b": 4}, False, (), "a", id="first worker without holds: best fit"),
        pytest.param({"a": 4, "b": 0}, True, (), "a", id="first worker: a held GPU when nothing else fits"),
        pytest.param({"a": 4, "b": 4, "c": 1}, True, ("c",), "b", id="growth: a GPU nobody holds"),
        pytest.param({"a": 4, "b": 0, "c": 1}, True, ("c",), "a", id="growth: a held GPU if it must"),
    ],
)
def test_packing_prefers_gpus_no_running_worker_holds(
    free: dict[str, int], hold: bool, current: tuple[str, ...], expected: str
) -> None:
    """`other` runs 4 workers on a and is placed back at its minimum (1), as a pass starts: a's 3
    other GPUs look free but its workers still run there. `job` (max 2; running on c, full, when
    `current`) places its next worker on a GPU nobody holds when one fits, else on a held one."""
    other = make_demand("other", 1, 4, nodes=free, current=("a",) * 4)
    job = make_demand("job", 1, 2, nodes=free, current=current)
    packing = SlicedPacking(free, {})
    if hold:
        packing.hold([other, job])
    assert packing.place_min(other) and (not current or packing.place_min(job))
    assert packing.peek(job) == expected


def test_withdrawn_workers_hold_their_gpus_again() -> None:
    """A job placed back on its nodes and then withdrawn (its minimum did not fit, or
    `cancel_relocations` places it anew) holds the GPUs of its running workers again."""
    free = {"a": 4, "b": 4}
    other = make_demand("other", 2, 4, nodes=free, current=("a",) * 4)
    job = make_demand("job", 1, 1, nodes=free)
    packing = SlicedPacking(free, {})
    packing.hold([other, job])
    assert packing.place_up_to(other, 4) == 4 and packing.peek(job) == "b"  # best fit, a full
    packing.withdraw(other)
    assert packing.free == free and packing.peek(job) == "b"  # a's 4 GPUs free, and held


@pytest.mark.parametrize(
    ("virtual", "count", "expected"),
    [
        pytest.param(64, 4, [5, 6], id="64 over 4 -> load 16; 13 at 5, 11 at 6"),
        pytest.param(8, 2, [3, 4], id="8 over 2 -> 3 and 4 workers"),
        pytest.param(8, 8, [], id="one virtual node each: nothing above"),
        pytest.param(8, 0, [2, 3], id="no workers yet: counted from one"),
    ],
)
def test_virtual_node_breakpoints(virtual: int, count: int, expected: list[int]) -> None:
    assert list(virtual_node_breakpoints(virtual, count)) == expected


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param(Placement(1), id="one worker"),
        pytest.param(Placement(8, 1), id="8 on one node"),
        pytest.param(Placement(8, 3), id="8 spread over 3 nodes"),
        pytest.param(Placement(4, 1, 2.0), id="time-sliced"),
        pytest.param(Placement(4, 2, 1.0, 0.3), id="a slow GPU type"),
        pytest.param(Placement(64, 8), id="beyond the virtual nodes"),
    ],
)
@pytest.mark.parametrize("max_batch", [None, 1024], ids=["fixed batch", "adaptive batch"])
def test_goodputs_is_the_models_best_and_kept_per_model(placement: Placement, max_batch: int | None) -> None:
    """The cross-pass table gives `JobModel.best`'s goodput to the bit, and an equal model (the next
    pass's, from the same measurements) finds the same table."""
    model = JobModel(SCALES_WELL, 128, 16, noise_scale=500.0, max_batch=max_batch)
    goodput = _goodputs(model)
    assert goodput(placement) == model.best(placement)[0]
    assert goodput(placement) == model.best(placement)[0]  # the remembered value
    assert _goodputs(replace(model)) is goodput
    assert _goodputs(replace(model, global_batch=256)) is not goodput
