"""Fake GPU nodes (KWOK) and the disruptions Ebbflow must survive: preemption, drain, new nodes, crashes.

Nodes carry what the NVIDIA device plugin and GPU feature discovery put on a real GPU node with
time-slicing: `nvidia.com/gpu` capacity of physical GPUs x replicas, and the product, count,
replicas, memory and sharing-strategy labels. Spot nodes carry the spot label (and optionally a taint).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from ebbflow_operator.decision.model import (
    GPU_RESOURCE,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_REPLICAS,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ebbflow_devtools.waiting import wait_for

LABEL_GPU_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_SPOT = "karpenter.sh/capacity-type"  # the de-facto capacity-type label (Karpenter)
SPOT = "spot"
ON_DEMAND = "on-demand"
TAINT_SPOT = "ebbflow.dev/spot"
TAINT_SPOT_TERMINATION = "ebbflow.dev/spot-termination"
CONDITION_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Test-only: KWOK's pod-exit stage terminates a running pod with this exit code (stages/ beside this module),
# and copies the optional message annotation into state.terminated.message, as the kubelet copies
# what a trainer wrote to its terminationMessagePath.
FAKE_EXIT_CODE_ANNOTATION = "ebbflow.dev/fake-exit-code"
FAKE_TERMINATION_MESSAGE_ANNOTATION = "ebbflow.dev/fake-termination-message"


@dataclass(frozen=True)
class GpuNodeTemplate:
    """What one fake GPU node looks like. `gpus` are physical; time-slicing multiplies them."""

    gpus: int = 2
    time_slicing_replicas: int = 2
    product: str = "NVIDIA-A100-SXM4-40GB"
    memory_mib: int | None = 40960  # one physical GPU's, as GPU feature discovery labels it (None: no label)
    spot: bool = False
    spot_taint: bool = False
    cpu: str = "32"
    memory: str = "256Gi"
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def advertised_gpus(self) -> int:
        return self.gpus * self.time_slicing_replicas

    def manifest(self, name: str) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            LABEL_GPU_PRODUCT: self.product + ("-SHARED" if self.time_slicing_replicas > 1 else ""),
            LABEL_GPU_COUNT: str(self.gpus),
            LABEL_GPU_REPLICAS: str(self.time_slicing_replicas),
            LABEL_SPOT: SPOT if self.spot else ON_DEMAND,
            **({} if self.memory_mib is None else {LABEL_GPU_MEMORY: str(self.memory_mib)}),
            **self.labels,
        }
        if self.time_slicing_replicas > 1:
            labels[LABEL_GPU_SHARING] = "time-slicing"
        taints = [{"key": TAINT_SPOT, "value": "true", "effect": "NoSchedule"}] if self.spot_taint else []
        resources = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": "110",
            GPU_RESOURCE: str(self.advertised_gpus),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
            "spec": {"taints": taints},
            "status": {"capacity": resources, "allocatable": resources},
        }


def create_gpu_nodes(
    core: client.CoreV1Api,
    count: int,
    template: GpuNodeTemplate | None = None,
    prefix: str = "gpu-node",
    start_index: int = 0,
    wait_ready: bool = True,
    timeout: float = 30.0,
) -> list[str]:
    """Creates `count` fake GPU nodes named `<prefix>-<i>` (idempotent) and waits until they are Ready."""
    template = template or GpuNodeTemplate()
    names = [f"{prefix}-{i}" for i in range(start_index, start_index + count)]
    for name in names:
        try:
            core.create_node(template.manifest(name))
        except ApiException as error:
            if error.status != 409:
                raise
    if wait_ready:
        for name in names:
            wait_for(functools.partial(node_is_ready, core, name), timeout, f"node {name} Ready")
    return names


def node_is_ready(core: client.CoreV1Api, name: str) -> bool:
    """Ready and free of the condition taints, so the scheduler will place pods on it."""
    try:
        node = core.read_node(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    # New nodes carry the not-ready taint until the node lifecycle controller sees them Ready.
    tainted = any(t.key in CONDITION_TAINTS for t in node.spec.taints or [])
    return ready and not tainted


def preempt_node(core: client.CoreV1Api, name: str, timeout: float = 30.0) -> None:
    """Spot preemption as a cloud does it: a NoExecute taint evicts the pods, then the node goes away."""
    taint = {"key": TAINT_SPOT_TERMINATION, "value": "true", "effect": "NoExecute"}
    node = core.read_node(name)
    taints = [t.to_dict() for t in node.spec.taints or []]
    if not any(t["key"] == TAINT_SPOT_TERMINATION for t in taints):
        core.patch_node(name, {"spec": {"taints": [*_clean(taints), taint]}})
    wait_for(lambda: not pods_on_node(core, name), timeout, f"pods evicted from {name}")
    delete_node(core, name)


def delete_node(core: client.CoreV1Api, name: str) -> None:
    try:
        core.delete_node(name)
    except ApiException as error:
        if error.status != 404:
            raise


def drain_node(core: client.CoreV1Api, name: str, timeout: float = 60.0) -> None:
    """`kubectl drain`: cordon, then evict every pod through the Eviction API (which honours PDBs)."""
    core.patch_node(name, {"spec": {"unschedulable": True}})
    deadline = time.monotonic() + timeout
    while pods := pods_on_node(core, name):
        for pod in pods:
            evict_pod(core, pod.metadata.namespace, pod.metadata.name)
        if time.monotonic() > deadline:
            raise TimeoutError(f"drain of {name} timed out; pods left: {[p.metadata.name for p in pods]}")
        time.sleep(0.2)


def evict_pod(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Asks the Eviction API to evict a pod. False when a PodDisruptionBudget refuses (HTTP 429)."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    try:
        core.create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as error:
        if error.status == 429:
            return False
        if error.status != 404:
            raise
    return True


def fail_pod(core: client.CoreV1Api, namespace: str, name: str, exit_code: int, message: str = "") -> None:
    """Makes a running pod on a fake node terminate with `exit_code` (0 succeeds, anything else fails)
    and, if given, the termination `message` its trainer would have written. One patch, so the pod
    never terminates without its message."""
    annotations = {FAKE_EXIT_CODE_ANNOTATION: str(exit_code)}
    if message:
        annotations[FAKE_TERMINATION_MESSAGE_ANNOTATION] = message
    core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


def pods_on_node(core: client.CoreV1Api, name: str) -> list[client.V1Pod]:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
    return [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]


def _clean(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if v is not None} for t in taints]
