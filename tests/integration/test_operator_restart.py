"""Restart safety: an operator killed (SIGKILL) in the middle of a rescale and started again leaves
no duplicate and no orphaned pod: it recomputes everything from what the API holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from ebbflow_api import contract
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.gpunodes import delete_node
from ebbflow_devtools.waiting import wait_for

from .conftest import GpuNodes, Kube
from .operator_helpers import (
    GROUP,
    PLURAL,
    SETTLE,
    VERSION,
    OperatorProcess,
    create_job,
    job_manifest,
    settled,
)

pytestmark = pytest.mark.usefixtures("crd")


def assert_clean(kube: Kube, namespace: str, job: str, count: int) -> None:
    """Exactly `count` workers with distinct indexes, one rendezvous pod, one Service, all owned."""
    uid = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)["metadata"]["uid"]
    pods = kube.core.list_namespaced_pod(namespace).items
    services = kube.core.list_namespaced_service(namespace).items
    for item in [*pods, *services]:
        owners = item.metadata.owner_references or []
        assert [o.uid for o in owners] == [uid], f"{item.metadata.name} is orphaned or doubly owned"
    roles = [p.metadata.labels[contract.LABEL_ROLE] for p in pods if p.metadata.deletion_timestamp is None]
    assert roles.count(contract.ROLE_RENDEZVOUS) == 1
    workers = [p for p in pods if p.metadata.labels[contract.LABEL_ROLE] == contract.ROLE_WORKER]
    live = [
        p.metadata.labels[contract.LABEL_WORKER_INDEX]
        for p in workers
        if p.metadata.deletion_timestamp is None
    ]
    assert len(live) == len(set(live)) == count
    # A pod of a deleted node may still be terminating (the pod GC force-deletes it later); it must
    # not share an index with a live worker.
    leaving = {
        p.metadata.labels[contract.LABEL_WORKER_INDEX] for p in workers if p.metadata.deletion_timestamp
    }
    assert not leaving & set(live), f"indexes {sorted(leaving & set(live))} both live and leaving"
    assert [s.metadata.name for s in services] == [f"{job}-pods"]


def test_operator_killed_mid_rescale_resumes_without_duplicates_or_orphans(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    operator = OperatorProcess(control_plane, namespace, gpu_nodes.selector, tmp_path / "operator.log")
    gpu_nodes.add(1)
    create_job(kube, namespace, job_manifest("sturdy", 2, 24, gpu_nodes.selector))
    operator.start()
    try:
        wait_for(lambda: settled(kube, namespace, "sturdy", 4), SETTLE, "4 workers on one node")

        # Grow: kill the operator as soon as it has started creating the new workers.
        added = gpu_nodes.add(5, group="more")
        wait_for(
            lambda: len(kube.core.list_namespaced_pod(namespace).items) > 5, SETTLE, "scale-up under way"
        )
        operator.kill()
        operator.start()
        wait_for(lambda: settled(kube, namespace, "sturdy", 24), SETTLE, "grown to 24 after the restart")
        assert_clean(kube, namespace, "sturdy", 24)

        # Shrink: nodes go away; kill the operator while it is reacting.
        for node in added[:3]:
            delete_node(kube.core, node)
        wait_for(
            lambda: (
                kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sturdy")[
                    "status"
                ].get("preemptions", 0)
                > 0
            ),
            SETTLE,
            "shrink under way",
            interval=0.02,
        )
        operator.kill()
        operator.start()
        wait_for(lambda: settled(kube, namespace, "sturdy", 12), SETTLE, "shrunk to 12 after the restart")
        assert_clean(kube, namespace, "sturdy", 12)
        status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "sturdy")[
            "status"
        ]
        assert status["preemptions"] == 12, "each lost worker counted exactly once across the restart"
    finally:
        operator.stop()
        print(operator.log())
