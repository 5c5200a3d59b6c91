"""One whole pass, pure: observed nodes, pods and jobs in, every job's plan out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import pytest
from ebbflow_api import contract
from ebbflow_devtools.builders import (
    JobBuilder,
    make_job,
    make_node,
    make_rendezvous,
    make_worker,
    with_writes,
)
from ebbflow_operator.decision.allocator import Allocation, PriorityFairShare
from ebbflow_operator.decision.decide import OperatorConfig, PassResult, PlanMemo, decide, this_pass
from ebbflow_operator.decision.model import Job, JobKey, Node, Pod
from ebbflow_operator.decision.plan import Deletion, Event, Plan, Refusal

NOW = 1_000_000.0


def job(name: str, lo: int, hi: int, priority: int, age: float) -> Job:
    return make_job(JobBuilder(name).replicas(lo, hi).set(leaveGraceSeconds=30).priority(priority), age=age)


def worker(owner: Job, index: int, node: str, deleting: bool = False, phase: str = "Running") -> Pod:
    return Pod(
        f"{owner.name}-worker-{index}", "ns", f"uid-{owner.name}-{index}", owner.name,
        contract.ROLE_WORKER, owner.uid, node, phase=phase, gpus=1, created=NOW - 100,
        deleting=deleting, ready=phase == "Running",
    )  # fmt: skip


def test_workers_still_leaving_do_not_push_a_lower_priority_job_below_its_minimum() -> None:
    """Mid-shrink: low gave 6 of its 8 workers to high; those 6 are still terminating."""
    nodes = [Node("a", 4), Node("b", 4)]
    low, high = job("low", 2, 8, priority=0, age=600), job("high", 2, 6, priority=100, age=10)
    pods = [worker(low, i, "a" if i < 4 else "b", deleting=i >= 2) for i in range(8)]
    result = decide(nodes, pods, [low, high], {}, {}, NOW, OperatorConfig(), PriorityFairShare())
    sizes = {plan.job.name: plan.status["desiredReplicas"] for plan in result.plans}
    assert sizes == {"low": 2, "high": 6}
    low_plan = next(plan for plan in result.plans if plan.job.name == "low")
    assert not [d for d in low_plan.delete if d.name in {"low-worker-0", "low-worker-1"}]


def test_a_deleted_worker_that_left_with_exit_0_does_not_end_the_job() -> None:
    """`kubectl delete pod`: the worker hands its state over and exits 0, so its pod is Succeeded
    while it is still being deleted. That is a worker leaving, not the job finishing: the job keeps
    its other workers (found on kind, where the job flapped between 3 and 0 workers)."""
    nodes = [Node("a", 4)]
    train = job("train", 1, 3, priority=0, age=600)
    left = worker(train, 1, "a", deleting=True, phase="Succeeded")
    pods = [worker(train, 0, "a"), left, worker(train, 2, "a")]
    result = decide(nodes, pods, [train], {}, {}, NOW, OperatorConfig(), PriorityFairShare())
    (plan,) = result.plans
    assert plan.status["desiredReplicas"] == 3
    assert not [d for d in plan.delete if d.name in {"train-worker-0", "train-worker-2"}]


@dataclass(frozen=True)
class DecidedPolicy:
    """A policy whose decision is given: what `decide` does with an objective policy's growth."""

    allocation: Allocation

    def allocate(self, demands: object, free: object) -> dict[JobKey, int]:
        return self.allocation.counts

    def decide(self, demands: object, free: object) -> Allocation:
        return self.allocation


@pytest.mark.parametrize(
    ("growth", "pins"),
    [
        pytest.param(("a", "a"), ("a", "a"), id="free-now: pinned"),
        pytest.param(("b", "b"), (), id="held-by-leaving-workers: the-scheduler-places-them"),
    ],
)
def test_a_growth_is_pinned_only_where_its_gpus_are_free_now(
    growth: tuple[str, ...], pins: tuple[str, ...]
) -> None:
    """`grow` runs 2 workers on a (2 GPUs free there); `shrunk`'s two workers on b (2 GPUs) are
    leaving, so the allocation counts b's GPUs as free, but a worker pinned there would wait for them."""
    nodes = [Node("a", 4), Node("b", 2), Node("c", 1)]
    grow, shrunk = job("grow", 1, 4, priority=0, age=600), job("shrunk", 1, 4, priority=0, age=900)
    pods = [worker(grow, 0, "a"), worker(grow, 1, "a"), worker(shrunk, 0, "b", deleting=True)]
    pods += [worker(shrunk, 1, "b", deleting=True), worker(shrunk, 2, "c")]
    decided = Allocation({grow.key: 4, shrunk.key: 1}, growth={grow.key: growth})
    result = decide(nodes, pods, [grow, shrunk], {}, {}, NOW, OperatorConfig(), DecidedPolicy(decided))
    plan = next(plan for plan in result.plans if plan.job.name == "grow")
    assert (len(plan.create_workers), plan.pins) == (2, pins)


@pytest.mark.parametrize(
    ("gone", "sizes", "changed", "scaling"),
    [
        pytest.param(
            "n7", {"a": 4, "b": 4, "c": 3, "d": 3}, {"c", "d"}, set(), id="one-worker-of-each-keeps-the-rest"
        ),
        pytest.param(
            "n4",
            {"a": 4, "b": 3, "c": 3, "d": 4},
            {"b", "c"},
            {"b", "c"},
            id="two-of-one-take-from-the-youngest",
        ),
    ],
)
def test_a_lost_node_resizes_the_jobs_that_lost_workers_unless_fairness_moves_one(
    gone: str, sizes: dict[str, int], changed: set[str], scaling: set[str]
) -> None:
    """16 GPUs, four jobs at 4 each; a node goes, 14 GPUs share out 4, 4, 3, 3. When it held one
    worker of each of the two oldest, those two stay at 3 (Running at once, their pods on the lost
    node deleted) and the others keep 4, rather than the oldest growing back on workers taken from
    the younger ones (four jobs re-forming for a loss that touched two). When it held two workers of
    one job, that job at 2 is below the fair share: it gets one back from the youngest job at 4
    (max-min fairness, not a tie), so a node holding several workers of a job costs another job a
    re-formation and both a second pass."""
    old = [make_job(JobBuilder(name).replicas(1, 8), age=7200) for name in ("c", "d")]
    young = [make_job(JobBuilder(name).replicas(1, 8), age=60) for name in ("a", "b")]
    layout = {
        "a": ["n0", "n0", "n1", "n1"],
        "b": ["n2", "n2", "n3", "n3"],
        "c": ["n4", "n4", "n5", "n7"],
        "d": ["n6", "n6", "n5", "n7"],
    }
    nodes = [make_node(f"n{i}", 2) for i in range(8)]

    def pods_of(jobs: list[Job]) -> list[Pod]:
        return [
            pod
            for j in jobs
            for pod in (
                *(make_worker(j, i, n) for i, n in enumerate(layout[j.name])),
                make_rendezvous(j, "n0"),
            )
        ]

    first = decide_pass(nodes, pods_of([*old, *young]), [*old, *young])
    statuses = {p.job.name: p.status for p in first.plans}
    assert {name: s["desiredReplicas"] for name, s in statuses.items()} == dict.fromkeys("abcd", 4)
    jobs = [
        make_job(
            JobBuilder(j.name).replicas(1, 8), age=7200 if j.name in "cd" else 60, status=statuses[j.name]
        )
        for j in [*old, *young]
    ]
    after = decide_pass([n for n in nodes if n.name != gone], pods_of(jobs), jobs)
    plans = {p.job.name: p for p in after.plans}
    assert {name: p.status["desiredReplicas"] for name, p in plans.items()} == sizes
    assert {name for name, p in plans.items() if p.delete or p.create_workers} == changed
    lost = [
        f"{name}-worker-{i}" for name, nodes_of in layout.items() for i, n in enumerate(nodes_of) if n == gone
    ]
    assert sorted(d.name for p in plans.values() for d in p.delete if d.reason == "node gone") == sorted(lost)
    # A job that only lost workers is Running at once; one that gains or hands over takes a pass more.
    assert {name for name, p in plans.items() if p.status["phase"] == "Scaling"} == scaling


# --- the plan memo -------------------------------------------------------------------------------

SERVICES = {("ns", "a"): frozenset({"a-pods"}), ("ns", "b"): frozenset({"b-pods"})}
POLICIES = {("ns", "a"): frozenset({"a-pods"}), ("ns", "b"): frozenset({"b-pods"})}


@dataclass(frozen=True)
class World:
    nodes: list[Node]
    pods: list[Pod]
    jobs: list[Job]
    services: Mapping[JobKey, frozenset[str]] = field(default_factory=lambda: SERVICES)


def settled_world(b_status: dict[str, object] | None = None) -> tuple[list[Node], list[Pod], list[Job]]:
    """Jobs a (2 workers) and b (2 workers) on two nodes, each status what a pass last wrote for
    them, so the next pass has nothing to write."""
    nodes = [make_node("n0", 2), make_node("n1", 2)]

    def pods_of(j: Job, node: str) -> list[Pod]:
        return [make_worker(j, 0, node), make_worker(j, 1, node), make_rendezvous(j, node)]

    jobs = [make_job(JobBuilder(name).replicas(1, 2)) for name in ("a", "b")]
    pods = [*pods_of(jobs[0], "n0"), *pods_of(jobs[1], "n1")]
    first = decide_pass(nodes, pods, jobs)
    statuses = {p.job.name: {**p.job.status.to_json(), **p.status_patch} for p in first.plans}
    if b_status is not None:
        statuses["b"] = {**statuses["b"], **b_status}
    jobs = [make_job(JobBuilder(j.name).replicas(1, 2), status=statuses[j.name]) for j in jobs]
    pods = [*pods_of(jobs[0], "n0"), *pods_of(jobs[1], "n1")]
    return nodes, pods, jobs


def decide_in(world: World, memo: PlanMemo | None = None) -> PassResult:
    config, policy = OperatorConfig(), PriorityFairShare()
    return decide(world.nodes, world.pods, world.jobs, world.services, POLICIES, NOW, config, policy, memo)


def decide_pass(
    nodes: list[Node], pods: list[Pod], jobs: list[Job], memo: PlanMemo | None = None
) -> PassResult:
    return decide(nodes, pods, jobs, SERVICES, POLICIES, NOW, OperatorConfig(), PriorityFairShare(), memo)


def test_a_pass_over_the_same_objects_reuses_the_plans_that_wrote_nothing() -> None:
    nodes, pods, jobs = settled_world()
    first = decide_pass(nodes, pods, jobs)
    assert not any(p.has_work for p in first.plans)
    assert set(first.memo) == {("ns", "a"), ("ns", "b")}
    again = decide_pass(nodes, pods, jobs, first.memo)
    assert all(new is old for new, old in zip(again.plans, first.plans, strict=True))


def test_a_changed_pod_replans_its_job_alone_as_a_fresh_pass_would() -> None:
    nodes, pods, jobs = settled_world()
    first = decide_pass(nodes, pods, jobs)
    failed = replace(pods[0], phase="Failed", ready=False)  # a's worker 0
    changed = [failed, *pods[1:]]
    memoised, fresh = decide_pass(nodes, changed, jobs, first.memo), decide_pass(nodes, changed, jobs)
    assert memoised.plans == fresh.plans
    a_plan, b_plan = memoised.plans
    assert a_plan is not first.plans[0] and a_plan.has_work  # the failure is noticed
    assert b_plan is first.plans[1]
    assert ("ns", "a") not in memoised.memo


@pytest.mark.parametrize(
    ("change", "reused"),
    [
        pytest.param(lambda w: w, True, id="nothing"),
        pytest.param(
            lambda w: replace(w, nodes=[replace(w.nodes[0]), w.nodes[1]]), False, id="node-a-new-version"
        ),
        pytest.param(
            lambda w: replace(w, jobs=[replace(w.jobs[0]), w.jobs[1]]), False, id="job-a-new-version"
        ),
        pytest.param(lambda w: replace(w, services={}), False, id="services-gone"),
    ],
)
def test_any_new_object_or_value_replans(change: Callable[[World], World], reused: bool) -> None:
    world = World(*settled_world())
    first = decide_pass(world.nodes, world.pods, world.jobs)
    after = change(world)
    memoised, fresh = decide_in(after, first.memo), decide_in(after)
    assert memoised.plans == fresh.plans
    assert (memoised.plans[0] is first.plans[0]) is reused


@pytest.mark.parametrize(
    ("b_status", "b_pods"),
    [
        pytest.param({"holdReplicas": 1, "holdUntil": "2099-01-01T00:00:00Z"}, None, id="hold-in-force"),
        pytest.param(None, "unscheduled", id="a-pod-not-yet-scheduled"),
    ],
)
def test_plans_that_wait_on_the_clock_are_not_remembered(
    b_status: dict[str, object] | None, b_pods: str | None
) -> None:
    nodes, pods, jobs = settled_world(b_status)
    if b_pods == "unscheduled":
        pods = [*pods, make_worker(jobs[1], 2, node=None, phase="Pending")]
    result = decide_pass(nodes, pods, jobs)
    assert ("ns", "b") not in result.memo
    assert ("ns", "a") in result.memo


@pytest.mark.parametrize(
    ("refused_ago", "creates"),
    [
        pytest.param(10.0, 0, id="within-the-back-off"),
        pytest.param(31.0, 1, id="back-off-lapsed"),
        pytest.param(None, 1, id="never-refused"),
    ],
)
def test_a_refused_worker_holds_back_its_jobs_new_workers_for_the_back_off(
    refused_ago: float | None, creates: int
) -> None:
    nodes, pods, jobs = settled_world()
    pods = [p for p in pods if p.name != "b-worker-1"]  # b is a worker short
    refusal = None if refused_ago is None else Refusal("b-worker-1", "forbidden", NOW - refused_ago)
    refusals = {} if refusal is None else {("ns", "b"): refusal}
    config, policy = OperatorConfig(), PriorityFairShare()
    result = decide(nodes, pods, jobs, SERVICES, POLICIES, NOW, config, policy, refusals=refusals)
    b_plan = result.plans[1]
    assert len(b_plan.create_workers) == creates
    assert ("ns", "b") not in result.memo  # it waits on the clock: the back-off, or its new worker


# --- this_pass: the writes one pass applies ------------------------------------------------------


def plan_of(name: str, creates: int = 0, deletes: int = 0, status: bool = True) -> Plan:
    """A plan of `status` (1 write), `creates` workers and `deletes` deletions."""
    plan = Plan(
        job=make_job(JobBuilder(name).replicas(1, 24)),
        status_patch={"replicas": creates} if status else {},
        create_workers=tuple((i, 1) for i in range(creates)),
        delete=tuple(Deletion(f"{name}-worker-{i}", f"uid-{i}", 0, "lost") for i in range(deletes)),
    )
    return with_writes(plan)


IDLE = Plan(job=make_job(JobBuilder("idle").replicas(1, 2)))


@pytest.mark.parametrize(
    ("plans", "budget", "now", "later"),
    [
        pytest.param([plan_of("a", 3), plan_of("b", 3)], 8, ["a", "b"], [], id="all-fit"),
        pytest.param([plan_of("a", 3), plan_of("b", 3), plan_of("c", 1)], 8, ["a", "b"], ["c"], id="cut"),
        pytest.param([plan_of("a", 3), plan_of("b", 3)], 7, ["a"], ["b"], id="whole-plans-only"),
        pytest.param([plan_of("a", 30), plan_of("b", 1)], 8, ["a"], ["b"], id="first-always-taken"),
        pytest.param(
            [plan_of("a", 5), plan_of("b", 1), plan_of("c", 1)], 8, ["a", "b"], ["c"], id="jobs-order-kept"
        ),
        pytest.param(
            [plan_of("a", 4), plan_of("b", 4), plan_of("lost", 0, deletes=2)],
            8,
            ["lost", "a"],
            ["b"],
            id="deletions-first",
        ),
        pytest.param([plan_of("a", 0), plan_of("b", 0)], 1, ["a"], ["b"], id="a-status-is-a-write"),
        pytest.param([IDLE, plan_of("a", 0), IDLE], 1, ["a"], [], id="plans-without-writes-left-out"),
        pytest.param([IDLE], 1, [], [], id="nothing-to-do"),
    ],
)
def test_this_pass(plans: list[Plan], budget: int, now: list[str], later: list[str]) -> None:
    unbuilt = [replace(p, writes=()) for p in plans]  # as the planner leaves them: counted, not built
    applied, deferred = this_pass(unbuilt, budget, {})
    assert ([p.job.name for p in applied], [p.job.name for p in deferred]) == (now, later)
    assert sum(p.write_count for p in applied) <= budget or len(applied) == 1
    assert all(len(p.writes) + len(p.events) == p.write_count for p in applied), "applied: built"
    assert all(p.writes == () for p in deferred), "a deferred plan builds no body"


@pytest.mark.parametrize(
    ("plan", "writes"),
    [
        pytest.param(IDLE, 0, id="nothing"),
        pytest.param(plan_of("a", 3, deletes=2), 6, id="status-creates-deletes"),
        pytest.param(replace(IDLE, events=(Event("Normal", "Rescaled", "1 -> 2"),)), 1, id="an-event"),
        pytest.param(
            with_writes(
                replace(IDLE, create_rendezvous_pod=True, create_service=True, create_network_policy=True)
            ),
            4,  # and the rendezvous token's Secret
            id="children",
        ),
    ],
)
def test_plan_writes(plan: Plan, writes: int) -> None:
    assert plan.write_count == writes
    assert plan.has_work == (writes > 0)


@pytest.mark.parametrize(
    ("plan", "summary"),
    [
        pytest.param(IDLE, "nothing", id="nothing"),
        pytest.param(
            plan_of("a", 2, deletes=1),
            "status replicas; delete a-worker-0 (lost); create 2 worker(s)",
            id="status-deletes-creates",
        ),
        pytest.param(
            replace(IDLE, create_rendezvous_pod=True, events=(Event("Normal", "Rescaled", "1 -> 2"),)),
            "create rendezvous pod; event Rescaled",
            id="children-and-events",
        ),
    ],
)
def test_plan_summary(plan: Plan, summary: str) -> None:
    assert plan.summary() == summary
