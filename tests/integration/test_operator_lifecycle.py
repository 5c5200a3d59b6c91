"""The real operator (a subprocess) against the real control plane: size, preemption, growth,
priority, pending timeout, the end of a job, garbage collection and metrics."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.gpunodes import GpuNodeTemplate, drain_node, fail_pod, preempt_node
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.declarer import job_token
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .conftest import GpuNodes, Kube
from .operator_helpers import (
    GROUP,
    PLURAL,
    SETTLE,
    TOKEN_KEY,
    VERSION,
    OperatorProcess,
    condition,
    create_job,
    events,
    job_manifest,
    running_operator,
    settled,
    status,
    workers,
)

pytestmark = pytest.mark.usefixtures("crd")


def start_job(kube: Kube, namespace: str, manifest: dict[str, Any], running: int, what: str) -> None:
    """Create the job and wait until it has settled with `running` workers (`what` names the wait)."""
    create_job(kube, namespace, manifest)
    wait_for(lambda: settled(kube, namespace, manifest["metadata"]["name"], running), SETTLE, what)


def _operator(
    plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, log: Path, pending_timeout: float
) -> Iterator[OperatorProcess]:
    with running_operator(
        plane,
        namespace,
        gpu_nodes.selector,
        log,
        "--pending-timeout",
        str(pending_timeout),
        "--pending-hold",
        "120",
    ) as process:
        yield process
        print(process.log())  # shown by pytest when the test failed


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """Pending timeout long enough that a loaded machine's slow scheduling is never mistaken."""
    yield from _operator(control_plane, namespace, gpu_nodes, tmp_path / "operator.log", 60)


@pytest.fixture
def impatient_operator(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """For the pending-timeout tests: workers the scheduler refused for 4 s are withdrawn."""
    yield from _operator(control_plane, namespace, gpu_nodes, tmp_path / "operator.log", 4)


def endpoint_hostnames(kube: Kube, namespace: str, service: str) -> set[str]:
    """The hostnames of the endpoints the EndpointSlice controller lists for `service`."""
    slices = client.DiscoveryV1Api(kube.core.api_client).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return {e.hostname for s in slices.items for e in s.endpoints or [] if e.hostname}


def test_job_gets_rendezvous_service_and_workers_on_gpu_nodes(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    nodes = set(gpu_nodes.add(2))  # 2 x 4 time-sliced GPUs
    start_job(kube, namespace, job_manifest("train", 2, 6, gpu_nodes.selector), 6, "6 workers running")

    pods = workers(kube, namespace, "train")
    job_uid = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "train")[
        "metadata"
    ]["uid"]
    assert {p.spec.node_name for p in pods} <= nodes
    assert sorted(p.metadata.name for p in pods) == [f"train-worker-{i}" for i in range(6)]
    for pod in pods:
        [owner] = pod.metadata.owner_references
        assert owner.uid == job_uid and owner.controller
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        endpoint = f"train-rdzv.train-pods.{namespace}.svc:{contract.RENDEZVOUS_PORT}"
        assert env[contract.ENV_RDZV_ENDPOINT] == endpoint
        assert env[contract.ENV_RDZV_ID] == job_uid
        assert env[contract.ENV_MIN_REPLICAS] == "2" and env[contract.ENV_MAX_REPLICAS] == "6"
        assert pod.spec.termination_grace_period_seconds == 5
    rendezvous = kube.core.read_namespaced_pod("train-rdzv", namespace)
    assert rendezvous.status.phase == "Running"
    assert rendezvous.metadata.owner_references[0].uid == job_uid
    # The job's rendezvous token: in a Secret of the job, read by the rendezvous pod alone.
    token = kube.core.read_namespaced_secret("train-rdzv-token", namespace)
    assert token.metadata.owner_references[0].uid == job_uid
    assert base64.b64decode(token.data[contract.RDZV_TOKEN_KEY]).decode() == job_token(
        TOKEN_KEY.encode(), job_uid
    )
    [reference] = [e for e in rendezvous.spec.containers[0].env if e.name == contract.ENV_RDZV_TOKEN]
    assert reference.value_from.secret_key_ref.name == "train-rdzv-token"
    service = kube.core.read_namespaced_service("train-pods", namespace)
    assert service.spec.cluster_ip == "None" and service.spec.ports[0].port == contract.RENDEZVOUS_PORT
    assert [s.metadata.name for s in kube.core.list_namespaced_service(namespace).items] == ["train-pods"]
    # The endpoint's name exists: the EndpointSlice controller lists the rendezvous pod under its
    # hostname (what cluster DNS serves as train-rdzv.train-pods), beside the six workers.
    wait_for(
        lambda: (
            endpoint_hostnames(kube, namespace, "train-pods")
            == {"train-rdzv", *(f"train-worker-{i}" for i in range(6))}
        ),
        SETTLE,
        "the Service's endpoints named by hostname",
    )
    ready = condition(kube, namespace, "train", "Ready")
    assert ready and ready["status"] == "True" and ready["observedGeneration"] == 1
    code, body = operator.health()
    assert code == 200 and json.loads(body)["reconcileLoop"] == "ok", (code, body)


def test_preempted_node_shrinks_the_job_which_keeps_running_and_grows_back(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(2)
    [spot] = gpu_nodes.add(1, GpuNodeTemplate(spot=True), group="spot")
    start_job(kube, namespace, job_manifest("elastic", 2, 12, gpu_nodes.selector), 12, "12 workers running")
    on_spot = [p.metadata.name for p in workers(kube, namespace, "elastic") if p.spec.node_name == spot]
    assert len(on_spot) == 4

    preempt_node(kube.core, spot)
    wait_for(lambda: settled(kube, namespace, "elastic", 8), SETTLE, "job shrunk to 8 and Running")
    current = status(kube, namespace, "elastic")
    assert current["preemptions"] == 4
    assert current["restarts"] == 0, "preemption is not failure"
    assert current["lastRescale"]["from"] == 12 and current["lastRescale"]["to"] == 8
    assert current["lastRescale"]["reason"] == "Preemption"
    preempted = condition(kube, namespace, "elastic", "Preempted")
    assert preempted and preempted["status"] == "True"
    assert all(name in preempted["message"] for name in on_spot)
    assert wait_for(lambda: events(kube, namespace, "elastic", "Preempted"), 10, "Preempted event")

    gpu_nodes.add(1, group="new")
    wait_for(lambda: settled(kube, namespace, "elastic", 12), SETTLE, "job grown back to 12")
    assert status(kube, namespace, "elastic")["lastRescale"]["reason"] == "CapacityFreed"
    assert status(kube, namespace, "elastic")["worldGeneration"] >= 3


def test_drained_node_is_a_preemption_and_the_job_moves_to_the_other_nodes(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(2)
    start_job(kube, namespace, job_manifest("drained", 1, 4, gpu_nodes.selector), 4, "4 workers")
    first = workers(kube, namespace, "drained")[0].spec.node_name
    on_first = [p for p in workers(kube, namespace, "drained") if p.spec.node_name == first]

    drain_node(kube.core, first)  # cordon + Eviction API
    wait_for(lambda: settled(kube, namespace, "drained", 4), SETTLE, "back at 4 workers")
    assert all(p.spec.node_name != first for p in workers(kube, namespace, "drained"))
    current = status(kube, namespace, "drained")
    assert current["preemptions"] == len(on_first) and current["restarts"] == 0


def test_added_nodes_grow_the_job_to_max(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    start_job(kube, namespace, job_manifest("grow", 1, 10, gpu_nodes.selector), 4, "4 workers on one node")
    gpu_nodes.add(2, group="more")
    wait_for(lambda: settled(kube, namespace, "grow", 10), SETTLE, "grown to max 10")
    rescale = status(kube, namespace, "grow")["lastRescale"]
    assert rescale["to"] == 10 and rescale["from"] >= 4 and rescale["reason"] == "CapacityFreed"


def test_higher_priority_gets_its_max_and_the_other_keeps_its_min_or_waits(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(2)  # 8 GPUs
    low = job_manifest("low", 2, 8, gpu_nodes.selector, priority=0)
    start_job(kube, namespace, low, 8, "low-priority job alone gets 8")

    high = job_manifest("high", 2, 6, gpu_nodes.selector, priority=100)
    start_job(kube, namespace, high, 6, "high-priority job at its max")
    wait_for(lambda: settled(kube, namespace, "low", 2), SETTLE, "low-priority job down to its min")
    assert status(kube, namespace, "low")["lastRescale"]["reason"] == "CapacityReclaimed"

    create_job(kube, namespace, job_manifest("late", 3, 4, gpu_nodes.selector, priority=0))

    def waiting() -> bool:
        schedulable = condition(kube, namespace, "late", "Schedulable")
        return bool(schedulable and schedulable["status"] == "False")

    wait_for(waiting, SETTLE, "the job that cannot reach its min waits")
    schedulable = condition(kube, namespace, "late", "Schedulable")
    assert schedulable and schedulable["reason"] == "InsufficientGPUs" and "min 3" in schedulable["message"]
    assert status(kube, namespace, "late")["phase"] == "Pending"
    assert workers(kube, namespace, "late", None) == []
    wait_for(
        lambda: settled(kube, namespace, "high", 6) and settled(kube, namespace, "low", 2),
        SETTLE,
        "the two running jobs keep their sizes",
    )


def test_workers_pending_too_long_are_withdrawn_and_the_job_shrinks(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, impatient_operator: OperatorProcess
) -> None:
    # The allocator counts GPUs; the scheduler also counts CPU: 32 CPUs fit one 20-CPU worker only.
    gpu_nodes.add(1)
    cpu_bound = job_manifest("cpu-bound", 1, 4, gpu_nodes.selector, cpu="20")
    start_job(kube, namespace, cpu_bound, 1, "withdrawn down to 1 worker")
    current = status(kube, namespace, "cpu-bound")
    assert current["holdReplicas"] == 1 and current["lastRescale"]["reason"] == "PendingTimeout"
    assert current["lastRescale"]["to"] == 1
    [event, *_] = events(kube, namespace, "cpu-bound", "WorkersWithdrawn")
    assert "the scheduler refused" in event.message


def test_job_that_cannot_reach_min_within_the_pending_timeout_waits(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, impatient_operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    create_job(kube, namespace, job_manifest("too-fat", 2, 4, gpu_nodes.selector, cpu="20"))

    def waiting() -> bool:
        schedulable = condition(kube, namespace, "too-fat", "Schedulable")
        return bool(schedulable and schedulable["reason"] == "PendingTimeout")

    wait_for(waiting, SETTLE, "Schedulable=False/PendingTimeout")
    wait_for(lambda: not workers(kube, namespace, "too-fat", None), SETTLE, "every worker withdrawn")
    assert status(kube, namespace, "too-fat")["phase"] == "Pending"


def declared(operator: OperatorProcess, pod: str, evidence: str) -> bool:
    """Whether the operator's log says it declared `pod` gone to its rendezvous, with `evidence`
    (or tried to)."""
    log = operator.log_path.read_text(errors="replace")
    return any(pod in line and "gone" in line and evidence in line for line in log.splitlines())


def test_failures_restart_workers_until_max_restarts_then_the_job_fails(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    start_job(kube, namespace, job_manifest("flaky", 1, 2, gpu_nodes.selector, maxRestarts=1), 2, "2 workers")

    fail_pod(kube.core, namespace, "flaky-worker-0", contract.EXIT_SIGTERM)  # preemption, not failure
    wait_for(
        lambda: status(kube, namespace, "flaky").get("preemptions") == 1, SETTLE, "counted as preemption"
    )
    wait_for(lambda: settled(kube, namespace, "flaky", 2), SETTLE, "replaced")
    assert status(kube, namespace, "flaky")["restarts"] == 0

    fail_pod(kube.core, namespace, "flaky-worker-1", 1)
    wait_for(lambda: status(kube, namespace, "flaky").get("restarts") == 1, SETTLE, "first real failure")
    # Each ended worker was declared gone to the job's rendezvous pod (whose address here is KWOK's,
    # where nothing listens: the operator says so, and the workers' heartbeats are the fallback).
    for name, evidence in (("flaky-worker-0", "exit code 143"), ("flaky-worker-1", "exit code 1")):
        wait_for(partial(declared, operator, name, evidence), SETTLE, f"{name} declared gone")
    wait_for(lambda: settled(kube, namespace, "flaky", 2), SETTLE, "replaced after a real failure")

    victim = workers(kube, namespace, "flaky")[0].metadata.name
    fail_pod(kube.core, namespace, victim, 3)
    wait_for(lambda: status(kube, namespace, "flaky").get("phase") == "Failed", SETTLE, "job Failed")
    failed = condition(kube, namespace, "flaky", "Failed")
    assert failed and failed["reason"] == "TooManyFailures" and "maxRestarts=1" in failed["message"]
    wait_for(lambda: not workers(kube, namespace, "flaky"), SETTLE, "running workers cleaned up")
    assert kube.core.read_namespaced_pod(victim, namespace).status.phase == "Failed", "kept for its logs"


def test_a_nonfinite_loss_fails_the_job_at_once_with_restarts_left(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    """Restarting a diverged job would replay the divergence: it fails with reason NonFiniteLoss and
    the trainer's own words, replaces nobody, and keeps the diverged pod for its logs."""
    gpu_nodes.add(1)
    diverging = job_manifest("diverging", 1, 2, gpu_nodes.selector, maxRestarts=5)
    start_job(kube, namespace, diverging, 2, "2 workers")
    said = (
        "loss or gradient non-finite for 3 consecutive steps (steps 55-57); the last finite state is step 54"
    )

    fail_pod(kube.core, namespace, "diverging-worker-1", contract.EXIT_NONFINITE_LOSS, said)
    wait_for(lambda: status(kube, namespace, "diverging").get("phase") == "Failed", SETTLE, "job Failed")
    failed = condition(kube, namespace, "diverging", "Failed")
    assert failed and failed["reason"] == "NonFiniteLoss", failed
    code = contract.EXIT_NONFINITE_LOSS
    assert failed["message"] == f"diverging-worker-1 exited {code} (NonFiniteLoss): {said}"
    assert status(kube, namespace, "diverging")["restarts"] == 1, "counted once as a real failure, no more"
    wait_for(lambda: not workers(kube, namespace, "diverging"), SETTLE, "running workers cleaned up")
    names = {p.metadata.name for p in workers(kube, namespace, "diverging", phase=None)}
    assert names == {"diverging-worker-1"}, "no replacement; only the diverged pod is left"
    diverged = kube.core.read_namespaced_pod("diverging-worker-1", namespace)
    assert diverged.status.phase == "Failed", "kept for its logs"
    wait_for(
        lambda: any(failed["message"] == e.message for e in events(kube, namespace, "diverging", "Failed")),
        SETTLE,
        "a Failed event with the same message",
    )


def test_job_succeeds_when_its_workers_finish(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    start_job(kube, namespace, job_manifest("done", 1, 3, gpu_nodes.selector), 3, "3 workers")
    for pod in workers(kube, namespace, "done"):
        fail_pod(kube.core, namespace, pod.metadata.name, contract.EXIT_SUCCESS)
    wait_for(lambda: status(kube, namespace, "done").get("phase") == "Succeeded", SETTLE, "Succeeded")
    assert len(workers(kube, namespace, "done", "Succeeded")) == 3, "cleanPodPolicy Running keeps them"

    def rendezvous_gone() -> bool:
        try:
            kube.core.read_namespaced_pod("done-rdzv", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(rendezvous_gone, SETTLE, "rendezvous pod cleaned up")
    assert status(kube, namespace, "done")["completionTime"]


def test_deleting_the_job_garbage_collects_everything(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    start_job(kube, namespace, job_manifest("short", 1, 4, gpu_nodes.selector), 4, "4 workers")
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "short")
    selector = contract.LABEL_JOB_NAME + "=short"

    def collected() -> bool:
        pods = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        services = kube.core.list_namespaced_service(namespace, label_selector=selector).items
        return not pods and not services

    wait_for(collected, SETTLE, "pods and Services garbage-collected")


def test_metrics_report_jobs_workers_and_gpus(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(2)
    start_job(kube, namespace, job_manifest("watched", 1, 5, gpu_nodes.selector), 5, "5 workers")
    labels = f'job="watched",namespace="{namespace}"'

    def scraped() -> str | None:
        text = operator.metrics()
        return text if f"ebbflow_job_ready_workers{{{labels}}} 5.0" in text else None

    text = wait_for(scraped, SETTLE, "metrics caught up")
    assert f"ebbflow_job_desired_workers{{{labels}}} 5.0" in text
    assert f"ebbflow_job_current_workers{{{labels}}} 5.0" in text
    assert f"ebbflow_job_allocated_gpus{{{labels}}} 5.0" in text
    assert 'ebbflow_jobs{phase="Running"} 1.0' in text
    assert 'ebbflow_cluster_gpus{state="total"} 8.0' in text
    assert 'ebbflow_cluster_gpus{state="free"} 3.0' in text
    assert 'ebbflow_rescales_total{reason="SpecChanged"} 1.0' in text
    assert "ebbflow_decision_latency_seconds_count" in text
    assert "ebbflow_reconcile_errors_total 0.0" in text
    assert "ebbflow_preemptions_total 0.0" in text
    assert 'ebbflow_pass_seconds_count{part="decide"}' in text
    # Its own requests, as the audit names them: the 5 workers and the rendezvous pod, status patches.
    created = re.search(r'ebbflow_api_requests_total\{resource="pods",verb="create"\} (\S+)', text)
    assert created and float(created.group(1)) >= 6, text
    assert 'ebbflow_api_requests_total{resource="elastictrainingjobs/status",verb="patch"}' in text
