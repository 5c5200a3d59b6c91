"""One whole pass, pure: observed nodes, pods and jobs in, every job's plan out."""

from __future__ import annotations

from ebbflow_api import contract
from ebbflow_api.builders import JobBuilder
from ebbflow_operator.allocator import PriorityFairShare
from ebbflow_operator.decide import OperatorConfig, decide
from ebbflow_operator.model import Job, Node, Pod

from tests.builders import make_job

NOW = 1_000_000.0


def job(name: str, lo: int, hi: int, priority: int, age: float) -> Job:
    return make_job(JobBuilder(name).replicas(lo, hi).set(leaveGraceSeconds=30).priority(priority), age=age)


def worker(owner: Job, index: int, node: str, deleting: bool = False, phase: str = "Running") -> Pod:
    return Pod(
        f"{owner.name}-worker-{index}", "ns", f"uid-{owner.name}-{index}", owner.name,
        contract.ROLE_WORKER, owner.uid, node, phase, gpus=1, created=NOW - 100,
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
