"""Capacity model: usable nodes, taints and tolerations, free GPUs per node (table-driven)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from ebbflow_devtools.builders import JobBuilder, make_job
from ebbflow_operator.decision.capacity import cluster_capacity, job_may_use, node_usable
from ebbflow_operator.decision.model import Job, Node, Pod, Taint, Toleration

SPOT_TAINT = Taint("ebbflow.dev/spot", "NoSchedule", "true")


def spec(**overrides: Any) -> Job:
    """A job whose template has the given node selector or tolerations."""
    return replace(make_job(JobBuilder("j").replicas(1, 4)), **overrides)


@pytest.mark.parametrize(
    ("node", "usable"),
    [
        (Node("ok", 4), True),
        (Node("not-ready", 4, ready=False), False),
        (Node("cordoned", 4, unschedulable=True), False),
        (Node("unreachable", 4, taints=(Taint("node.kubernetes.io/unreachable", "NoExecute"),)), False),
        (Node("spot-tainted", 4, taints=(SPOT_TAINT,)), True),
    ],
)
def test_node_usable(node: Node, usable: bool) -> None:
    assert node_usable(node) is usable


@pytest.mark.parametrize(
    ("node", "job", "allowed"),
    [
        (Node("plain", 4), spec(), True),
        (Node("spot", 4, taints=(SPOT_TAINT,)), spec(), False),
        (
            Node("spot", 4, taints=(SPOT_TAINT,)),
            spec(tolerations=(Toleration("ebbflow.dev/spot", "Exists"),)),
            True,
        ),
        (
            Node("spot", 4, taints=(SPOT_TAINT,)),
            spec(tolerations=(Toleration("ebbflow.dev/spot", "Equal", "false"),)),
            False,
        ),
        (Node("spot", 4, taints=(SPOT_TAINT,)), spec(tolerations=(Toleration(operator="Exists"),)), True),
        (
            Node("spot", 4, taints=(SPOT_TAINT,)),
            spec(tolerations=(Toleration("ebbflow.dev/spot", "Exists", effect="NoExecute"),)),
            False,
        ),
        (Node("prefer", 4, taints=(Taint("x", "PreferNoSchedule"),)), spec(), True),
        (Node("a100", 4, labels={"gpu": "a100"}), spec(node_selector={"gpu": "a100"}), True),
        (Node("h100", 4, labels={"gpu": "h100"}), spec(node_selector={"gpu": "a100"}), False),
        (Node("cordoned", 4, unschedulable=True), spec(tolerations=(Toleration(operator="Exists"),)), False),
    ],
)
def test_job_may_use(node: Node, job: Job, allowed: bool) -> None:
    assert job_may_use(node, job) is allowed


def pod(name: str, node: str | None, gpus: int, phase: str = "Running") -> Pod:
    return Pod(name=name, namespace="ns", uid=name, node=node, gpus=gpus, phase=phase)


@pytest.mark.parametrize(
    ("pods", "movable", "free", "total"),
    [
        ([], [], {"a": 4, "b": 8}, 12),
        ([pod("other", "a", 3)], [], {"a": 1, "b": 8}, 12),
        ([pod("ours", "a", 3)], ["ours"], {"a": 4, "b": 8}, 12),
        ([pod("done", "a", 3, "Succeeded"), pod("failed", "b", 8, "Failed")], [], {"a": 4, "b": 8}, 12),
        ([pod("unbound", None, 3)], [], {"a": 4, "b": 8}, 12),
        ([pod("greedy", "a", 9)], [], {"a": 0, "b": 8}, 12),
        ([pod("on-cordoned", "c", 2)], [], {"a": 4, "b": 8}, 12),
    ],
)
def test_free_gpus_subtract_only_what_stays_put(
    pods: list[Pod], movable: list[str], free: dict[str, int], total: int
) -> None:
    nodes = [Node("a", 4), Node("b", 8), Node("c", 4, unschedulable=True)]
    capacity = cluster_capacity(nodes, pods, [p for p in pods if p.name in movable])
    assert dict(capacity.free) == free
    assert capacity.total == total
