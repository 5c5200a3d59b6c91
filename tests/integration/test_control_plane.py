"""The local control plane is real: scheduling, garbage collection, taint eviction, Eviction API + PDBs."""

from __future__ import annotations

import uuid
from typing import Any

from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.gpunodes import (
    GPU_RESOURCE,
    GpuNodeTemplate,
    drain_node,
    evict_pod,
    fail_pod,
    node_is_ready,
    preempt_node,
)
from ebbflow_devtools.waiting import wait_for
from kubernetes.client.exceptions import ApiException

from .conftest import GpuNodes, Kube


def gpu_pod(name: str, gpus: int, node_selector: dict[str, str], **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": node_selector,
            "containers": [
                {
                    "name": "trainer",
                    "image": "ebbflow/trainer:test",
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


def phase(kube: Kube, namespace: str, name: str) -> str:
    return str(kube.core.read_namespaced_pod(name, namespace).status.phase)


def pod_gone(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        return error.status == 404
    return False


def test_fake_gpu_nodes_advertise_time_sliced_capacity(kube: Kube, gpu_nodes: GpuNodes) -> None:
    [name] = gpu_nodes.add(1, GpuNodeTemplate(gpus=2, time_slicing_replicas=4, spot=True))
    node = kube.core.read_node(name)
    assert node.status.capacity[GPU_RESOURCE] == "8"
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.memory"] == "40960"  # MiB of one physical GPU (the A100 40GB's)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED")
    assert labels["karpenter.sh/capacity-type"] == "spot"
    assert node_is_ready(kube.core, name)


def test_gpu_pod_is_scheduled_on_a_node_with_room_and_runs(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    [small] = gpu_nodes.add(1, GpuNodeTemplate(gpus=1, time_slicing_replicas=1), group="small")
    [big] = gpu_nodes.add(1, GpuNodeTemplate(gpus=2, time_slicing_replicas=2), group="big")
    kube.core.create_namespaced_pod(namespace, gpu_pod("two-gpus", 2, gpu_nodes.selector))
    wait_for(lambda: phase(kube, namespace, "two-gpus") == "Running", 30, "pod Running")
    pod = kube.core.read_namespaced_pod("two-gpus", namespace)
    assert pod.spec.node_name == big, f"2 GPUs fit only on {big}, not on {small}"
    assert pod.status.pod_ip


def test_pod_asking_more_gpus_than_the_cluster_has_stays_pending(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    gpu_nodes.add(2, GpuNodeTemplate(gpus=2, time_slicing_replicas=2))
    kube.core.create_namespaced_pod(namespace, gpu_pod("too-big", 5, gpu_nodes.selector))

    def failed_scheduling() -> list[Any]:
        events = kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=too-big"
        ).items
        return [e for e in events if e.reason == "FailedScheduling"]

    [event, *_] = wait_for(failed_scheduling, 30, "FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in event.message
    assert phase(kube, namespace, "too-big") == "Pending"
    assert kube.core.read_namespaced_pod("too-big", namespace).spec.node_name is None


def test_deleting_the_owner_garbage_collects_its_pods(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    gpu_nodes.add(1)
    owner = kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for i in range(2):
        kube.core.create_namespaced_pod(
            namespace, gpu_pod(f"owned-{i}", 1, gpu_nodes.selector, ownerReferences=[reference])
        )
    wait_for(
        lambda: all(phase(kube, namespace, f"owned-{i}") == "Running" for i in range(2)), 30, "pods Running"
    )
    kube.core.delete_namespaced_config_map("owner", namespace)
    wait_for(
        lambda: all(pod_gone(kube, namespace, f"owned-{i}") for i in range(2)), 60, "owned pods collected"
    )


def test_no_execute_taint_evicts_pods_and_preemption_removes_the_node(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    [node] = gpu_nodes.add(1, GpuNodeTemplate(spot=True))
    kube.core.create_namespaced_pod(namespace, gpu_pod("victim", 1, gpu_nodes.selector))
    wait_for(lambda: phase(kube, namespace, "victim") == "Running", 30, "pod Running")
    preempt_node(kube.core, node)
    assert pod_gone(kube, namespace, "victim")
    assert not node_is_ready(kube.core, node)
    assert node not in {n.metadata.name for n in kube.core.list_node().items}


def test_eviction_api_honours_a_pod_disruption_budget(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    [node] = gpu_nodes.add(1)
    labels = {"app": f"pdb-{uuid.uuid4().hex[:4]}"}
    for i in range(2):
        kube.core.create_namespaced_pod(
            namespace, gpu_pod(f"guarded-{i}", 1, gpu_nodes.selector, labels=labels)
        )
    wait_for(
        lambda: all(phase(kube, namespace, f"guarded-{i}") == "Running" for i in range(2)), 30, "Running"
    )
    kube.policy.create_namespaced_pod_disruption_budget(
        namespace,
        {"metadata": {"name": "keep-one"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}},
    )

    def disruptions_allowed() -> int:
        return int(
            kube.policy.read_namespaced_pod_disruption_budget(
                "keep-one", namespace
            ).status.disruptions_allowed
        )

    wait_for(lambda: disruptions_allowed() == 1, 30, "PDB status computed by the disruption controller")
    assert evict_pod(kube.core, namespace, "guarded-0")
    wait_for(lambda: pod_gone(kube, namespace, "guarded-0"), 30, "first eviction applied")
    wait_for(lambda: disruptions_allowed() == 0, 30, "PDB budget spent")
    assert not evict_pod(kube.core, namespace, "guarded-1"), "the PDB must refuse the second eviction"
    assert phase(kube, namespace, "guarded-1") == "Running"
    assert kube.core.read_node(node).spec.unschedulable is None


def test_drain_cordons_and_evicts(kube: Kube, namespace: str, gpu_nodes: GpuNodes) -> None:
    first, second = gpu_nodes.add(2)
    kube.core.create_namespaced_pod(namespace, gpu_pod("drained", 1, {"kubernetes.io/hostname": first}))
    wait_for(lambda: phase(kube, namespace, "drained") == "Running", 30, "pod Running")
    drain_node(kube.core, first)
    assert kube.core.read_node(first).spec.unschedulable is True
    wait_for(lambda: pod_gone(kube, namespace, "drained"), 30, "pod evicted")
    assert kube.core.read_node(second).spec.unschedulable is None


def test_added_node_takes_a_pending_pod(kube: Kube, namespace: str, gpu_nodes: GpuNodes) -> None:
    gpu_nodes.add(1, GpuNodeTemplate(gpus=1, time_slicing_replicas=1))
    kube.core.create_namespaced_pod(namespace, gpu_pod("waiting", 4, gpu_nodes.selector))
    wait_for(
        lambda: kube.core.read_namespaced_pod("waiting", namespace).status.conditions,
        30,
        "scheduler to look at the pod",
    )
    assert phase(kube, namespace, "waiting") == "Pending"
    [added] = gpu_nodes.add(1, GpuNodeTemplate(gpus=2, time_slicing_replicas=2), group="new")
    wait_for(lambda: phase(kube, namespace, "waiting") == "Running", 60, "pod Running on the new node")
    assert kube.core.read_namespaced_pod("waiting", namespace).spec.node_name == added


def test_a_pod_can_be_made_to_exit_with_a_given_code(kube: Kube, namespace: str, gpu_nodes: GpuNodes) -> None:
    """...and a termination message, as the kubelet reports what a trainer wrote (none unless given)."""
    gpu_nodes.add(1)
    said = 'loss or gradient non-finite for 3 consecutive steps (steps 55-57): "quoted", #, {{ }}'
    cases = (
        ("crashes", 137, "", "Failed"),
        ("diverges", 65, said, "Failed"),
        ("finishes", 0, "", "Succeeded"),
    )
    for name, code, message, expected in cases:
        kube.core.create_namespaced_pod(namespace, gpu_pod(name, 1, gpu_nodes.selector))
        wait_for(lambda name=name: phase(kube, namespace, name) == "Running", 30, f"{name} Running")
        fail_pod(kube.core, namespace, name, code, message)
        wait_for(lambda name=name, expected=expected: phase(kube, namespace, name) == expected, 30, expected)
        [status] = kube.core.read_namespaced_pod(name, namespace).status.container_statuses
        assert status.state.terminated.exit_code == code
        assert status.state.terminated.message == (message or None), name


def test_a_component_that_exited_is_revived_and_works_again(
    control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes: GpuNodes
) -> None:
    """What the chaos soak relies on (the kubelet's part for static pods): the scheduler killed,
    `revive` starts it again with its own command, and it schedules again."""
    gpu_nodes.add(1)
    [scheduler] = [c for c in control_plane.components if c.name == "kube-scheduler"]
    scheduler.process.kill()
    scheduler.process.wait(10)
    kube.core.create_namespaced_pod(namespace, gpu_pod("after-revive", 1, gpu_nodes.selector))
    assert control_plane.revive() == ["kube-scheduler"]
    assert control_plane.revive() == []  # running again: nothing to do
    wait_for(
        lambda: phase(kube, namespace, "after-revive") == "Running", 60, "scheduled by the revived scheduler"
    )
