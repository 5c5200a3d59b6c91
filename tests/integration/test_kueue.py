"""`ebbflow-operator --kueue true` under Kueue's real manager (the pinned v0.17.0, started beside the
control plane): queued jobs wait for admission, run what Kueue admits, shrink gracefully to make
room for a higher priority (or, where no shrink can, empty gracefully when Kueue preempts them and
resume when admitted again), give their quota back when they end, and grow back through a
replacement slice.

Workers are KWOK pods (no process runs): what is checked is what the operator and Kueue make of
each other's objects. A ClusterQueue of 8 GPUs per test, on 12 GPUs of fake nodes, so the quota and
not the nodes is what limits the queued jobs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools import kueue
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import ControlPlane, ControlPlaneError
from ebbflow_devtools.gpunodes import GpuNodeTemplate, fail_pod
from ebbflow_devtools.waiting import NotYet, wait_for
from kubernetes.client.exceptions import ApiException

from .conftest import GpuNodes, Kube, install_manifest, unavailable
from .operator_helpers import (
    SETTLE,
    OperatorProcess,
    condition,
    create_job,
    patch_job,
    running_operator,
    settled,
    status,
)

pytestmark = pytest.mark.usefixtures("crd")

QUOTA = 8
NODES = GpuNodeTemplate(gpus=4, time_slicing_replicas=1)  # three of them: 12 GPUs
GROUP, VERSION = kueue.KUEUE_GROUP, kueue.KUEUE_VERSION


@pytest.fixture(scope="module")
def kueue_manager(control_plane: ControlPlane, kube: Kube) -> None:
    """Kueue's CRDs and manager, once for this module (the plane stops it at the session's end)."""
    if kueue.missing():
        unavailable(str(kueue.missing()))
    if not any(c.name == "kueue" for c in control_plane.components):
        try:
            kueue.start_kueue(control_plane, lambda manifest: install_manifest(kube, manifest))
        except ControlPlaneError as error:
            pytest.fail(f"Kueue's manager did not start: {error}", pytrace=False)
    try:
        kube.custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", kueue.resource_flavor())
    except ApiException as error:
        if error.status != 409:
            raise


@pytest.fixture
def queue(kube: Kube, namespace: str, kueue_manager: None) -> Iterator[str]:
    """A LocalQueue in the test's namespace, on a ClusterQueue of QUOTA GPUs for it alone."""
    name = f"team-{namespace}"
    kube.custom.create_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", kueue.cluster_queue(name, QUOTA, namespace)
    )
    kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "localqueues", kueue.local_queue(namespace, "team", name)
    )
    yield "team"
    kube.custom.delete_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[OperatorProcess]:
    gpu_nodes.add(3, NODES)
    log = tmp_path / "operator.log"
    with running_operator(control_plane, namespace, gpu_nodes.selector, log, "--kueue", "true") as process:
        yield process
        print(process.log())  # shown by pytest when the test failed


def queued_job(
    name: str, lo: int, hi: int, nodes: GpuNodes, queue: str | None, priority: int = 0
) -> dict[str, Any]:
    job = JobBuilder(name).replicas(lo, hi).gpus(1).node_selector(nodes.selector).priority(priority)
    if queue:
        job.queue(queue)
    return job.set(leaveGraceSeconds=5).obj()


def workloads(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    found = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "workloads", label_selector=f"{contract.LABEL_JOB_NAME}={job}"
    )["items"]
    return sorted(found, key=lambda w: w["metadata"]["name"])


def _condition_true(workload: dict[str, Any], kind: str) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def admitted_workers(kube: Kube, namespace: str, job: str) -> int | None:
    """The workers count of the job's admitted, unfinished slice (None: none admitted)."""
    for workload in workloads(kube, namespace, job):
        admission = (workload.get("status") or {}).get("admission")
        if admission and _condition_true(workload, "Admitted") and not _condition_true(workload, "Finished"):
            assigned = {a["name"]: a.get("count") for a in admission["podSetAssignments"]}
            counts = {p["name"]: p["count"] for p in workload["spec"]["podSets"]}
            return min(int(assigned["workers"]), int(counts["workers"]))  # a count lowered since
    return None


def worker_pods(kube: Kube, namespace: str, job: str) -> list[Any]:
    """Every worker pod of the job, those being deleted too (they still hold their GPUs)."""
    selector = f"{contract.LABEL_JOB_NAME}={job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def settled_at(kube: Kube, namespace: str, job: str, count: int) -> bool | NotYet:
    if settled(kube, namespace, job, count) and admitted_workers(kube, namespace, job) == count:
        return True
    pods = len(worker_pods(kube, namespace, job))
    return NotYet(f"{job}: admitted {admitted_workers(kube, namespace, job)}, {pods} worker pod(s)")


def test_queued_jobs_wait_for_admission_and_run_what_kueue_admits(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, queue: str, operator: OperatorProcess
) -> None:
    create_job(kube, namespace, queued_job("huge", 10, 12, gpu_nodes, queue))
    create_job(kube, namespace, queued_job("free", 1, 2, gpu_nodes, None))
    create_job(kube, namespace, queued_job("a", 2, 8, gpu_nodes, queue))

    def waiting_with_kueues_reason() -> bool:
        found = condition(kube, namespace, "huge", "Admitted")
        return bool(found and found["status"] == "False" and "quota" in found["message"])

    wait_for(waiting_with_kueues_reason, SETTLE, "the over-quota job's Admitted condition quoting Kueue")
    wait_for(lambda: settled_at(kube, namespace, "a", QUOTA), SETTLE, "job a admitted and running 8 workers")
    wait_for(lambda: settled(kube, namespace, "free", 2), SETTLE, "the job without a queue running 2 workers")
    selector = f"{contract.LABEL_JOB_NAME}=huge"
    assert kube.core.list_namespaced_pod(namespace, label_selector=selector).items == []
    [slice_] = workloads(kube, namespace, "a")
    assert slice_["metadata"]["ownerReferences"][0]["name"] == "a"
    assert [(p["name"], p["count"]) for p in slice_["spec"]["podSets"]] == [("workers", 8), ("rendezvous", 1)]
    admitted = condition(kube, namespace, "a", "Admitted")
    assert admitted and admitted["status"] == "True", admitted


def cluster_queue_gpus_used(kube: Kube, namespace: str) -> int | None:
    """The GPUs Kueue counts as used in the test's ClusterQueue (its status)."""
    queue = kube.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", f"team-{namespace}")
    for flavor in (queue.get("status") or {}).get("flavorsUsage") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] == "nvidia.com/gpu":
                return int(resource.get("total") or 0)
    return None


def test_a_graceful_shrink_gives_the_quota_back_once_the_workers_have_left(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, queue: str, operator: OperatorProcess
) -> None:
    create_job(kube, namespace, queued_job("a", 2, 8, gpu_nodes, queue))
    wait_for(lambda: settled_at(kube, namespace, "a", 8), SETTLE, "job a admitted and running 8 workers")
    wait_for(lambda: cluster_queue_gpus_used(kube, namespace) == 8, SETTLE, "Kueue counting 8 GPUs used")
    patch_job(kube, namespace, "a", {"spec": {"replicas": {"max": 4}}})
    # The slice's count is lowered in place (Kueue's webhook allows an admitted elastic slice that
    # much), so Kueue counts 4 GPUs once the 4 leavers are gone, with no new slice.
    wait_for(lambda: settled_at(kube, namespace, "a", 4), SETTLE, "job a shrunk to 4 workers, admitted 4")
    wait_for(lambda: cluster_queue_gpus_used(kube, namespace) == 4, SETTLE, "Kueue counting 4 GPUs used")
    [slice_] = workloads(kube, namespace, "a")
    assert slice_["spec"]["podSets"][0]["count"] == 4


class QuotaWatch:
    """Samples the GPUs the queued jobs' worker pods hold (deleted ones too, until they are gone)
    while a test runs: what Kueue admits must cover them at every moment."""

    def __init__(self, kube: Kube, namespace: str, jobs: tuple[str, ...]) -> None:
        self.most, self.stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(kube, namespace, jobs), daemon=True)
        self._thread.start()

    def _run(self, kube: Kube, namespace: str, jobs: tuple[str, ...]) -> None:
        while not self.stop.wait(0.2):
            held = sum(
                len([p for p in worker_pods(kube, namespace, j) if p.status.phase != "Succeeded"])
                for j in jobs
            )
            self.most = max(self.most, held)

    def close(self) -> int:
        self.stop.set()
        self._thread.join(10)
        return self.most


def test_a_higher_priority_job_gets_room_by_a_graceful_shrink_and_the_lower_one_grows_back(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, queue: str, operator: OperatorProcess
) -> None:
    create_job(kube, namespace, queued_job("a", 2, 8, gpu_nodes, queue))
    wait_for(lambda: settled_at(kube, namespace, "a", 8), SETTLE, "job a admitted and running 8 workers")
    before = {p.metadata.uid for p in worker_pods(kube, namespace, "a")}
    watch = QuotaWatch(kube, namespace, ("a", "b"))
    started = time.monotonic()
    create_job(kube, namespace, queued_job("b", 4, 4, gpu_nodes, queue, priority=100))
    wait_for(lambda: settled_at(kube, namespace, "a", 4), SETTLE, "job a shrunk in place to 4 workers")
    wait_for(lambda: settled_at(kube, namespace, "b", 4), SETTLE, "job b admitted and running 4 workers")
    print(f"room made and b admitted in {time.monotonic() - started:.1f} s")
    kept = {p.metadata.uid for p in worker_pods(kube, namespace, "a")}
    assert len(kept) == 4 and kept <= before, "job a's remaining workers are not 4 of those it ran"
    evicted = [
        w["metadata"]["name"] for w in workloads(kube, namespace, "a") if _condition_true(w, "Evicted")
    ]
    assert not evicted, f"Kueue evicted job a's slices {evicted}: the shrink came too late"

    finish(kube, namespace, "b")
    wait_for(lambda: settled_at(kube, namespace, "a", 8), SETTLE, "job a grown back to 8 through a new slice")
    slices = workloads(kube, namespace, "a")
    replacing = [w for w in slices if kueue_replacement(w)]
    assert replacing and not _condition_true(replacing[-1], "Finished"), [
        w["metadata"]["name"] for w in slices
    ]
    most = watch.close()
    assert most <= QUOTA, f"the queued jobs' workers held {most} GPUs of a quota of {QUOTA}"


def test_a_preemption_no_shrink_can_avoid_empties_the_job_gracefully_until_it_is_admitted_again(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, queue: str, operator: OperatorProcess
) -> None:
    create_job(kube, namespace, queued_job("a", 6, 8, gpu_nodes, queue))  # 6 + 4 > 8: no room by shrinking
    wait_for(lambda: settled_at(kube, namespace, "a", 8), SETTLE, "job a admitted and running 8 workers")
    watch = QuotaWatch(kube, namespace, ("a", "b"))
    create_job(kube, namespace, queued_job("b", 4, 4, gpu_nodes, queue, priority=100))
    wait_for(lambda: settled_at(kube, namespace, "b", 4), SETTLE, "job b admitted and running 4 workers")
    wait_for(lambda: not worker_pods(kube, namespace, "a"), SETTLE, "job a emptied")
    requeued = [
        w
        for w in workloads(kube, namespace, "a")
        if (w.get("status") or {}).get("requeueState") is not None or _condition_true(w, "Requeued")
    ]
    assert requeued, "job a's slice was never requeued after its eviction"
    finish(kube, namespace, "b")
    wait_for(lambda: settled_at(kube, namespace, "a", 8), SETTLE, "job a admitted again for 8 workers")
    most = watch.close()
    assert most <= QUOTA, f"the queued jobs' workers held {most} GPUs of a quota of {QUOTA}"


def finish(kube: Kube, namespace: str, job: str) -> None:
    """The job's training ends (its workers exit 0): it succeeds and its slice is finished."""
    for pod in worker_pods(kube, namespace, job):
        fail_pod(kube.core, namespace, pod.metadata.name, 0)
    wait_for(lambda: status(kube, namespace, job).get("phase") == "Succeeded", SETTLE, f"job {job} succeeded")
    wait_for(
        lambda: all(_condition_true(w, "Finished") for w in workloads(kube, namespace, job)),
        SETTLE,
        f"job {job}'s slice finished (its quota back to the queue)",
    )


def kueue_replacement(workload: dict[str, Any]) -> str | None:
    annotations = workload["metadata"].get("annotations") or {}
    return annotations.get("kueue.x-k8s.io/workload-slice-replacement-for")
