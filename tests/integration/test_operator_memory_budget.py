"""spec.bandLimit against the real control plane: the operator gives every worker of a band-limited
job its GPU memory budget in an annotation the kubelet projects into a file, from the spec or from
the labels GPU feature discovery puts on the nodes (KWOK nodes labelled as it labels them), and
follows changes; a job that did not opt in gets none of it.

The workers are KWOK pods (no trainer runs): what the trainer does with the file is the trainer
tier's; this tier checks what the API server accepts and what the operator writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.gpunodes import GpuNodeTemplate
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision import manifests

from .conftest import GpuNodes, Kube
from .operator_helpers import (
    SETTLE,
    OperatorProcess,
    create_job,
    events,
    job_manifest,
    patch_job,
    running_operator,
    settled,
    workers,
)

pytestmark = pytest.mark.usefixtures("crd")

BAND_LIMIT_ENV = {contract.ENV_BAND_LIMIT, contract.ENV_MAX_COMPRESSION_RATE, contract.ENV_MEMORY_BUDGET_FILE}
CHANGED = "MemoryBudgetChanged"


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[OperatorProcess]:
    with running_operator(control_plane, namespace, gpu_nodes.selector, tmp_path / "operator.log") as process:
        yield process
        print(process.log())  # shown by pytest when the test failed


def budgets(kube: Kube, namespace: str, job: str) -> list[str | None]:
    """Each running worker's budget annotation, by pod name."""
    pods = sorted(workers(kube, namespace, job), key=lambda p: p.metadata.name)
    return [(p.metadata.annotations or {}).get(contract.ANNOTATION_MEMORY_BUDGET) for p in pods]


def every_worker_carries(kube: Kube, namespace: str, job: str, count: int, budget: int) -> bool:
    return budgets(kube, namespace, job) == [str(budget)] * count


def band_limit_parts(pod: Any) -> tuple[set[str], list[Any], list[Any]]:
    """What spec.bandLimit puts on a worker: its variables, its volume and the trainer's mount."""
    [trainer] = pod.spec.containers
    env = {e.name for e in trainer.env or []} & BAND_LIMIT_ENV
    volumes = [v for v in pod.spec.volumes or [] if v.name == manifests.BUDGET_VOLUME]
    mounts = [m for m in trainer.volume_mounts or [] if m.name == manifests.BUDGET_VOLUME]
    return env, volumes, mounts


def test_the_smallest_share_on_the_nodes_reaches_every_worker_of_a_band_limited_job(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    """On a node of two exclusive 40960 MiB GPUs each worker may use 40960 MiB. Once a node whose one
    GPU is time-sliced 2 ways joins and the job grows onto it, its new workers may use 20480, and so
    every worker is told 20480 (the workers train at one rate), with one MemoryBudgetChanged."""
    gpu_nodes.add(1, GpuNodeTemplate(gpus=2, time_slicing_replicas=1), group="whole")
    create_job(kube, namespace, job_manifest("limited", 1, 4, gpu_nodes.selector, bandLimit={}))
    wait_for(lambda: settled(kube, namespace, "limited", 2), SETTLE, "2 workers on the exclusive GPUs")
    wait_for(
        lambda: every_worker_carries(kube, namespace, "limited", 2, 40960), 30, "every worker told 40960 MiB"
    )
    [pod, _] = workers(kube, namespace, "limited")
    env, [volume], [mount] = band_limit_parts(pod)
    assert env == BAND_LIMIT_ENV and mount.read_only
    [item] = volume.downward_api.items
    assert item.field_ref.field_path == f"metadata.annotations['{contract.ANNOTATION_MEMORY_BUDGET}']"
    values = {e.name: e.value for e in pod.spec.containers[0].env}
    assert values[contract.ENV_MEMORY_BUDGET_FILE] == f"{mount.mount_path}/{item.path}"
    assert values[contract.ENV_MAX_COMPRESSION_RATE] == "0.75"

    gpu_nodes.add(1, GpuNodeTemplate(gpus=1, time_slicing_replicas=2), group="sliced")
    wait_for(lambda: settled(kube, namespace, "limited", 4), SETTLE, "grown onto the time-sliced GPU")
    wait_for(
        lambda: every_worker_carries(kube, namespace, "limited", 4, 20480), 30, "every worker told 20480 MiB"
    )
    found = wait_for(lambda: events(kube, namespace, "limited", CHANGED), 30, "a MemoryBudgetChanged event")
    assert [e.message for e in found] == ["memory budget 40960 MiB -> 20480 MiB per worker"]


def test_a_spec_budget_reaches_every_worker_and_follows_the_spec_and_other_jobs_get_none(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(2)  # labelled 40960 MiB GPUs shared 2 ways: the spec's value wins over them
    fixed = job_manifest("fixed", 1, 3, gpu_nodes.selector, bandLimit={"memoryBudgetMiB": 6000})
    create_job(kube, namespace, fixed)
    create_job(kube, namespace, job_manifest("plain", 1, 3, gpu_nodes.selector))
    for job in ("fixed", "plain"):
        wait_for(lambda job=job: settled(kube, namespace, job, 3), SETTLE, f"{job}: 3 workers running")
    wait_for(
        lambda: every_worker_carries(kube, namespace, "fixed", 3, 6000), 30, "every worker told 6000 MiB"
    )
    for pod in workers(kube, namespace, "plain"):
        assert contract.ANNOTATION_MEMORY_BUDGET not in (pod.metadata.annotations or {})
        assert band_limit_parts(pod) == (set(), [], [])

    patch_job(kube, namespace, "fixed", {"spec": {"bandLimit": {"memoryBudgetMiB": 3000}}})
    wait_for(
        lambda: every_worker_carries(kube, namespace, "fixed", 3, 3000), 30, "every worker told 3000 MiB"
    )
    found = wait_for(lambda: events(kube, namespace, "fixed", CHANGED), 30, "a MemoryBudgetChanged event")
    assert [e.message for e in found] == ["memory budget 6000 MiB -> 3000 MiB per worker"]
    assert not events(kube, namespace, "plain", CHANGED)
