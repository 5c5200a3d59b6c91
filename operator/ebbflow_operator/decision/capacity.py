"""Capacity model: which nodes a job may use and how many GPUs on each are free for Ebbflow.

GPUs are counted as the node advertises them (`nvidia.com/gpu` allocatable), so time-sliced
replicas count one each. A node is usable when it is Ready, not cordoned and free of the node
lifecycle controller's condition taints; a job may use it when its template's nodeSelector matches
and it tolerates every NoSchedule/NoExecute taint. CPU, memory and node affinity are left to the
scheduler; what the scheduler refuses anyway is caught by the pending timeout (planner.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .model import CONDITION_TAINT_PREFIX, Job, Node, Pod

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def node_usable(node: Node) -> bool:
    """Would the scheduler place anything here at all?"""
    condition_tainted = any(t.key.startswith(CONDITION_TAINT_PREFIX) for t in node.taints)
    return node.ready and not node.unschedulable and not condition_tainted


def job_may_use(node: Node, job: Job) -> bool:
    """Node usable, nodeSelector matched, and every blocking taint tolerated by the job's template."""
    if not node_usable(node):
        return False
    if any(node.labels.get(key) != value for key, value in job.node_selector.items()):
        return False
    return all(
        any(toleration.tolerates(taint) for toleration in job.tolerations)
        for taint in node.taints
        if taint.effect in BLOCKING_EFFECTS
    )


def evicts(node: Node, job: Job) -> bool:
    """A NoExecute taint the job does not tolerate: its pods there are being evicted (spot termination)."""
    return any(
        taint.effect == "NoExecute" and not any(t.tolerates(taint) for t in job.tolerations)
        for taint in node.taints
    )


def matches_selector(node: Node, selector: Mapping[str, str]) -> bool:
    return all(node.labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True)
class ClusterCapacity:
    """GPUs per usable node and how many of them Ebbflow may hand out."""

    total: int  # GPUs advertised by usable nodes
    free: Mapping[str, int]  # node -> GPUs not held by pods outside the allocation


def cluster_capacity(nodes: Iterable[Node], pods: Iterable[Pod], movable: Iterable[Pod]) -> ClusterCapacity:
    """Free GPUs per usable node: allocatable minus what non-movable bound pods hold.

    `movable` are the managed workers whose GPUs the allocator hands out again (running and leaving
    workers of active jobs); every other bound, unfinished pod (other workloads, workers of
    finished jobs) keeps its GPUs.
    """
    movable_uids = {pod.uid for pod in movable}
    usable = {node.name: node.gpus for node in nodes if node_usable(node)}
    free = dict(usable)
    for pod in pods:
        if pod.holds_gpus and pod.uid not in movable_uids and pod.node in free:
            free[pod.node] -= pod.gpus
    return ClusterCapacity(
        total=sum(usable.values()), free={name: max(0, gpus) for name, gpus in free.items()}
    )


def eligible_nodes(nodes: Sequence[Node], job: Job) -> frozenset[str]:
    return frozenset(node.name for node in nodes if job_may_use(node, job))
