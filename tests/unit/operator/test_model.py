"""Parsing the API's JSON into the decision layer's data: pods, nodes, jobs and progress reports (tables)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from ebbflow_api import contract
from ebbflow_api.models import (
    GPU_RESOURCE,
    Batching,
    CleanPodPolicy,
    ElasticTrainingJobSpec,
    LrScaling,
    Phase,
)
from ebbflow_devtools.builders import NOW, JobBuilder, make_job
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.model import (
    SPOT_LABELS,
    Json,
    Taint,
    Toleration,
    format_time,
    parse_job,
    parse_node,
    parse_pod,
    parse_progress,
    parse_time,
)


def raw_pod(
    *, metadata: Json | None = None, spec: Json | None = None, status: Json | None = None
) -> dict[str, Any]:
    """A pod as the API returns it, with only what the case needs besides a name."""
    return {
        "metadata": {"name": "p", "namespace": "ns", **(metadata or {})},
        "spec": spec or {},
        "status": status or {},
    }


def terminated(code: int, message: str | None = None) -> Json:
    state: Json = {"exitCode": code, "reason": "Completed"}
    if message is not None:
        state["message"] = message
    return {"name": "c", "state": {"terminated": state}}


RUNNING: Json = {"name": "c", "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}
WAITING: Json = {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}


def disruption_target(status: str = "True", reason: str | None = "PreemptionByScheduler") -> Json:
    condition: Json = {"type": "DisruptionTarget", "status": status}
    if reason is not None:
        condition["reason"] = reason
    return condition


def container(limits: Json | None = None, requests: Json | None = None, name: str = "c") -> Json:
    resources: Json = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "img", "resources": resources}


# --- parse_pod: exit codes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "statuses", "completed"),
    [
        pytest.param("Running", None, False, id="no-container-statuses"),
        pytest.param("Running", [RUNNING], False, id="running"),
        pytest.param("Running", [terminated(0)], True, id="exited-0-before-the-phase-says-so"),
        pytest.param("Succeeded", [terminated(0)], True, id="succeeded"),
        pytest.param("Running", [terminated(0), RUNNING], False, id="a-sidecar-still-running"),
        pytest.param("Running", [terminated(0), terminated(0)], True, id="every-container-exited-0"),
        pytest.param("Running", [terminated(0), terminated(1)], False, id="one-failed"),
        pytest.param("Running", [WAITING], False, id="not-started"),
    ],
)
def test_parse_pod_completed(phase: str, statuses: list[Json] | None, completed: bool) -> None:
    status: Json = {"phase": phase}
    if statuses is not None:
        status["containerStatuses"] = statuses
    assert parse_pod(raw_pod(status=status)).completed is completed


@pytest.mark.parametrize(
    ("statuses", "exit_code"),
    [
        pytest.param(None, None, id="no-container-statuses"),
        pytest.param([], None, id="empty-container-statuses"),
        pytest.param([RUNNING], None, id="running-not-terminated"),
        pytest.param([WAITING, RUNNING], None, id="waiting-and-running"),
        pytest.param([{"name": "c"}], None, id="status-without-state"),
        pytest.param([terminated(0)], 0, id="one-succeeded"),
        pytest.param([terminated(0), terminated(0)], 0, id="all-succeeded"),
        pytest.param([terminated(0), RUNNING], 0, id="succeeded-and-running"),
        pytest.param([terminated(1)], 1, id="one-failed"),
        pytest.param([terminated(0), terminated(137)], 137, id="failed-after-succeeded"),
        pytest.param([terminated(143), terminated(0)], 143, id="failed-before-succeeded"),
        pytest.param([terminated(1), terminated(137)], 1, id="first-failed-wins"),
        pytest.param([terminated(137), terminated(1)], 137, id="first-failed-wins-other-order"),
        pytest.param([RUNNING, terminated(64)], 64, id="running-and-failed"),
    ],
)
def test_parse_pod_exit_code(statuses: list[Json] | None, exit_code: int | None) -> None:
    status: Json = {"phase": "Running"}
    if statuses is not None:
        status["containerStatuses"] = statuses
    assert parse_pod(raw_pod(status=status)).exit_code == exit_code


DIVERGED = (
    "loss or gradient non-finite for 3 consecutive steps (steps 55-57); the last finite state is step 54"
)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        pytest.param([RUNNING], (None, ""), id="not-terminated"),
        pytest.param([terminated(1)], (1, ""), id="failed-without-message"),
        pytest.param([terminated(65, DIVERGED)], (65, DIVERGED), id="failed-with-message"),
        pytest.param([terminated(65, DIVERGED + "\n")], (65, DIVERGED), id="trailing-newline-dropped"),
        pytest.param([terminated(64, "")], (64, ""), id="empty-message"),
        pytest.param([terminated(0, "done")], (0, ""), id="success-message-ignored"),
        pytest.param(
            [terminated(0, "done"), terminated(65, DIVERGED)],
            (65, DIVERGED),
            id="the-failed-containers-message",
        ),
        pytest.param(
            [terminated(1, "first"), terminated(65, DIVERGED)],
            (1, "first"),
            id="message-of-the-same-container",
        ),
    ],
)
def test_parse_pod_termination_message(statuses: list[Json], expected: tuple[int | None, str]) -> None:
    """The message comes from the container whose exit code the pod reports, so the two agree."""
    pod = parse_pod(raw_pod(status={"phase": "Failed", "containerStatuses": statuses}))
    assert (pod.exit_code, pod.termination_message) == expected


# --- parse_pod: disruptions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "disruption"),
    [
        pytest.param({}, None, id="nothing"),
        pytest.param({"phase": "Failed", "reason": "UnexpectedAdmissionError"}, None, id="other-reason"),
        pytest.param({"phase": "Failed", "reason": "Evicted"}, "Evicted", id="evicted"),
        pytest.param({"reason": "Preempting"}, "Preempting", id="preempting"),
        pytest.param({"reason": "Terminated"}, "Terminated", id="terminated"),
        pytest.param({"reason": "Shutdown"}, "Shutdown", id="shutdown"),
        pytest.param({"reason": "NodeLost"}, "NodeLost", id="node-lost"),
        pytest.param({"reason": "evicted"}, None, id="reason-is-case-sensitive"),
        pytest.param(
            {"conditions": [disruption_target()]}, "PreemptionByScheduler", id="disruption-target-reason"
        ),
        pytest.param(
            {"conditions": [disruption_target(reason="DeletionByTaintManager")]},
            "DeletionByTaintManager",
            id="disruption-target-taint-manager",
        ),
        pytest.param(
            {"conditions": [disruption_target(reason=None)]},
            "DisruptionTarget",
            id="disruption-target-without-reason",
        ),
        pytest.param(
            {"conditions": [disruption_target(reason="")]},
            "DisruptionTarget",
            id="disruption-target-empty-reason",
        ),
        pytest.param({"conditions": [disruption_target(status="False")]}, None, id="disruption-target-false"),
        pytest.param(
            {"conditions": [disruption_target(status="False")], "reason": "Evicted"},
            "Evicted",
            id="false-disruption-target-falls-back-to-reason",
        ),
        pytest.param(
            {"conditions": [disruption_target(reason="EvictionByEvictionAPI")], "reason": "Evicted"},
            "EvictionByEvictionAPI",
            id="disruption-target-wins-over-reason",
        ),
        pytest.param(
            {"conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]},
            None,
            id="other-condition",
        ),
    ],
)
def test_parse_pod_disruption(status: Json, disruption: str | None) -> None:
    assert parse_pod(raw_pod(status=status)).disruption == disruption


# --- parse_pod: the scheduler's refusal ------------------------------------------------------------

REFUSED_AT = "2026-11-26T11:00:00Z"


def pod_scheduled(status: str, reason: str | None) -> Json:
    return {"type": "PodScheduled", "status": status, "reason": reason, "lastTransitionTime": REFUSED_AT}


@pytest.mark.parametrize(
    ("conditions", "refused"),
    [
        pytest.param([], False, id="not-tried-yet"),
        pytest.param([pod_scheduled("False", "Unschedulable")], True, id="refused"),
        pytest.param([pod_scheduled("True", None)], False, id="scheduled"),
        pytest.param([pod_scheduled("False", "SchedulingGated")], False, id="gated-is-not-refused"),
        pytest.param(
            [{"type": "Ready", "status": "False", "reason": "Unschedulable"}], False, id="other-type"
        ),
    ],
)
def test_parse_pod_refused_since(conditions: list[Json], refused: bool) -> None:
    pod = parse_pod(raw_pod(status={"phase": "Pending", "conditions": conditions}))
    assert pod.refused_since == (parse_time(REFUSED_AT) if refused else None)


# --- parse_pod: GPUs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("containers", "gpus"),
    [
        pytest.param(None, 0, id="no-containers"),
        pytest.param([{"name": "c", "image": "img"}], 0, id="no-resources"),
        pytest.param([container(limits={"cpu": "1"})], 0, id="no-gpu-resource"),
        pytest.param([container(limits={GPU_RESOURCE: 2})], 2, id="limits"),
        pytest.param([container(limits={GPU_RESOURCE: "4"})], 4, id="limits-as-string"),
        pytest.param([container(requests={GPU_RESOURCE: 1})], 1, id="requests-only"),
        pytest.param(
            [container(limits={GPU_RESOURCE: 2}, requests={GPU_RESOURCE: 1})],
            2,
            id="limits-win-over-requests",
        ),
        pytest.param(
            [container(limits={"cpu": "2"}, requests={GPU_RESOURCE: 3})],
            3,
            id="requests-when-limits-lack-gpus",
        ),
        pytest.param(
            [container(limits={GPU_RESOURCE: 1}, name="a"), container(limits={GPU_RESOURCE: 2}, name="b")],
            3,
            id="summed-over-containers",
        ),
        pytest.param(
            [container(limits={GPU_RESOURCE: 2}, name="a"), container(requests={GPU_RESOURCE: 1}, name="b")],
            3,
            id="limits-and-requests-of-different-containers",
        ),
        pytest.param(
            [container(limits={GPU_RESOURCE: 2}, name="a"), container(name="sidecar")],
            2,
            id="sidecar-without-gpus",
        ),
        pytest.param([container(limits={GPU_RESOURCE: "500m"})], 0, id="fraction-is-not-a-gpu"),
    ],
)
def test_parse_pod_gpus(containers: list[Json] | None, gpus: int) -> None:
    spec: Json = {} if containers is None else {"containers": containers}
    assert parse_pod(raw_pod(spec=spec)).gpus == gpus


# --- parse_pod: metadata and the rest -----------------------------------------------------------

OWNER = {"apiVersion": "ebbflow.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(raw_pod(), {"deleting": False, "ready": False}, id="bare"),
        pytest.param(
            raw_pod(metadata={"deletionTimestamp": "2024-01-01T00:00:00Z"}),
            {"deleting": True},
            id="deleting",
        ),
        pytest.param(
            raw_pod(status={"conditions": [{"type": "Ready", "status": "True"}]}), {"ready": True}, id="ready"
        ),
        pytest.param(
            raw_pod(status={"conditions": [{"type": "Ready", "status": "False"}]}),
            {"ready": False},
            id="not-ready",
        ),
        pytest.param(
            raw_pod(status={"conditions": [{"type": "ContainersReady", "status": "True"}]}),
            {"ready": False},
            id="containers-ready-is-not-ready",
        ),
        pytest.param(
            raw_pod(
                metadata={
                    "ownerReferences": [
                        {**OWNER, "uid": "other", "controller": False},
                        {**OWNER, "uid": "uid-j", "controller": True},
                    ]
                }
            ),
            {"owner_uid": "uid-j"},
            id="controller-owner",
        ),
        pytest.param(
            raw_pod(metadata={"ownerReferences": [{**OWNER, "uid": "uid-j"}]}),
            {"owner_uid": None},
            id="owner-that-is-not-controller",
        ),
        pytest.param(
            raw_pod(
                metadata={"labels": {contract.LABEL_JOB_NAME: "j", contract.LABEL_ROLE: contract.ROLE_WORKER}}
            ),
            {"job": "j", "role": contract.ROLE_WORKER},
            id="contract-labels",
        ),
        pytest.param(
            raw_pod(metadata={"labels": {"app": "j", "role": "worker"}}),
            {"job": None, "role": None},
            id="other-labels",
        ),
        pytest.param(
            raw_pod(
                metadata={
                    "annotations": {
                        contract.ANNOTATION_PROGRESS: '{"step": 3}',
                        contract.ANNOTATION_WORLD_GENERATION: "7",
                        contract.ANNOTATION_MEMORY_BUDGET: "20480",
                    }
                }
            ),
            {"progress": '{"step": 3}', "world_generation": 7, "memory_budget": "20480"},
            id="contract-annotations",
        ),
        pytest.param(
            raw_pod(metadata={"annotations": {contract.ANNOTATION_WORLD_GENERATION: ""}}),
            {"world_generation": 0, "progress": None, "memory_budget": None},
            id="empty-world-generation",
        ),
        pytest.param(raw_pod(spec={"nodeName": "od-0"}), {"node": "od-0"}, id="bound"),
        pytest.param(raw_pod(spec={"nodeName": ""}), {"node": None}, id="empty-node-is-unbound"),
        pytest.param(raw_pod(), {"node": None, "phase": "Pending"}, id="unscheduled-defaults"),
        pytest.param(raw_pod(status={"phase": "Succeeded"}), {"phase": "Succeeded"}, id="phase"),
        pytest.param(
            raw_pod(metadata={"uid": "u", "creationTimestamp": format_time(NOW)}),
            {"uid": "u", "created": NOW},
            id="uid-and-creation-time",
        ),
        pytest.param(raw_pod(), {"uid": "", "created": 0.0, "namespace": "ns"}, id="missing-uid-and-time"),
    ],
)
def test_parse_pod_fields(raw: Json, expected: dict[str, object]) -> None:
    pod = parse_pod(raw)
    assert {name: getattr(pod, name) for name in expected} == expected


def test_parse_pod_reads_back_a_worker_the_operator_built() -> None:
    """The labels, annotations and owner the operator writes are the ones the parser reads."""
    job = make_job(JobBuilder("j").replicas(1, 4).gpus(2))
    raw = manifests.worker_pod(job, 3, world_generation=5)
    raw["metadata"]["uid"] = "uid-w3"
    raw["spec"]["nodeName"] = "od-1"
    raw["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    pod = parse_pod(raw)
    assert (pod.name, pod.namespace, pod.uid) == (manifests.worker_name("j", 3), job.namespace, "uid-w3")
    assert (pod.job, pod.role, pod.owner_uid) == ("j", contract.ROLE_WORKER, job.uid)
    assert (pod.node, pod.phase, pod.ready, pod.gpus) == ("od-1", "Running", True, 2)
    assert (pod.world_generation, pod.exit_code, pod.termination_message, pod.disruption) == (
        5,
        None,
        "",
        None,
    )
    assert pod.holds_gpus and not pod.finished


# --- parse_node ----------------------------------------------------------------------------------


def raw_node(
    *,
    labels: dict[str, str] | None = None,
    taints: list[Json] | None = None,
    allocatable: Json | None = None,
    conditions: list[Json] | None = None,
    unschedulable: bool | None = None,
) -> Json:
    spec: Json = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    metadata: Json = {"name": "n"}
    if labels is not None:
        metadata["labels"] = labels
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {
            "allocatable": allocatable or {},
            "conditions": [{"type": "Ready", "status": "True"}] if conditions is None else conditions,
        },
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            raw_node(),
            {"gpus": 0, "ready": True, "unschedulable": False, "taints": (), "spot": False},
            id="plain",
        ),
        pytest.param(raw_node(allocatable={GPU_RESOURCE: "8", "cpu": "32"}), {"gpus": 8}, id="gpus-string"),
        pytest.param(raw_node(allocatable={GPU_RESOURCE: 4}), {"gpus": 4}, id="gpus-int"),
        pytest.param(raw_node(allocatable={"cpu": "32"}), {"gpus": 0}, id="no-gpus"),
        pytest.param(raw_node(conditions=[]), {"ready": False}, id="no-conditions-not-ready"),
        pytest.param(
            raw_node(conditions=[{"type": "Ready", "status": "False"}]), {"ready": False}, id="not-ready"
        ),
        pytest.param(
            raw_node(conditions=[{"type": "Ready", "status": "Unknown"}]),
            {"ready": False},
            id="ready-unknown",
        ),
        pytest.param(
            raw_node(conditions=[{"type": "MemoryPressure", "status": "True"}]),
            {"ready": False},
            id="other-condition-true",
        ),
        pytest.param(raw_node(unschedulable=True), {"unschedulable": True}, id="cordoned"),
        pytest.param(
            raw_node(
                taints=[
                    {"key": "ebbflow.dev/spot", "value": "true", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                ]
            ),
            {
                "taints": (
                    Taint("ebbflow.dev/spot", "NoSchedule", "true"),
                    Taint("node.kubernetes.io/unreachable", "NoExecute", ""),
                )
            },
            id="taints",
        ),
        pytest.param(
            raw_node(labels={"karpenter.sh/capacity-type": "on-demand"}), {"spot": False}, id="on-demand"
        ),
        pytest.param(
            raw_node(labels={"eks.amazonaws.com/capacityType": "spot"}), {"spot": False}, id="eks-lower"
        ),
        pytest.param(
            raw_node(labels={"cloud.google.com/gke-spot": "false"}), {"spot": False}, id="gke-spot-false"
        ),
        pytest.param(raw_node(labels={"spot": "true"}), {"spot": False}, id="unknown-label"),
    ],
)
def test_parse_node(raw: Json, expected: dict[str, object]) -> None:
    node = parse_node(raw)
    assert node.name == "n"
    assert {name: getattr(node, name) for name in expected} == expected


@pytest.mark.parametrize(("key", "value"), [pytest.param(k, v, id=k) for k, v in SPOT_LABELS.items()])
def test_parse_node_spot_labels(key: str, value: str) -> None:
    node = parse_node(raw_node(labels={"kubernetes.io/hostname": "n", key: value}))
    assert node.spot
    assert node.labels == {"kubernetes.io/hostname": "n", key: value}


def test_spot_labels_cover_the_major_providers() -> None:
    """A node provisioner the table forgets would make its spot nodes look on-demand."""
    assert {
        "karpenter.sh/capacity-type": "spot",
        "eks.amazonaws.com/capacityType": "SPOT",
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-preemptible": "true",
        "kubernetes.azure.com/scalesetpriority": "spot",
    }.items() <= dict(SPOT_LABELS).items()


# --- parse_job -----------------------------------------------------------------------------------

SpecField = Callable[[ElasticTrainingJobSpec], object]


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        pytest.param(lambda s: s.virtual_nodes, None, id="virtual-nodes-unset"),
        pytest.param(lambda s: s.resolved_virtual_nodes, 4, id="virtual-nodes-resolve-to-max"),
        pytest.param(lambda s: s.batching, Batching.STATIC, id="batching"),
        pytest.param(lambda s: s.lr_scaling, LrScaling.NONE, id="lr-scaling"),
        pytest.param(lambda s: s.checkpoint.path, "/checkpoints", id="checkpoint-path"),
        pytest.param(lambda s: s.checkpoint.interval_steps, 1000, id="checkpoint-interval"),
        pytest.param(lambda s: s.priority, 0, id="priority"),
        pytest.param(lambda s: s.max_restarts, 3, id="max-restarts"),
        pytest.param(lambda s: s.leave_grace_seconds, contract.DEFAULT_LEAVE_GRACE_SECONDS, id="leave-grace"),
        pytest.param(lambda s: s.clean_pod_policy, CleanPodPolicy.RUNNING, id="clean-pod-policy"),
        pytest.param(lambda s: s.rendezvous.port, contract.RENDEZVOUS_PORT, id="rendezvous-port"),
        pytest.param(lambda s: s.rendezvous.join_timeout_seconds, 600, id="join-timeout"),
        pytest.param(lambda s: s.rendezvous.image, None, id="rendezvous-image"),
        pytest.param(lambda s: s.rendezvous.command, None, id="rendezvous-command"),
    ],
)
def test_parse_job_applies_the_defaults(read: SpecField, expected: object) -> None:
    raw = JobBuilder("j", "ns").replicas(2, 4).obj()
    assert set(raw["spec"]) == {"replicas", "globalBatchSize", "template"}  # nothing else given
    assert read(parse_job(raw).spec) == expected


@pytest.mark.parametrize(
    ("builder", "gpus", "node_selector", "tolerations"),
    [
        pytest.param(JobBuilder("j"), 1, {}, (), id="builder-default"),
        pytest.param(JobBuilder("j").gpus(4), 4, {}, (), id="gpus"),
        pytest.param(JobBuilder("j").gpus(0), 0, {}, (), id="no-gpus"),
        pytest.param(
            JobBuilder("j").pod_spec(
                containers=[
                    container(limits={GPU_RESOURCE: "2"}, name="trainer"),
                    container(requests={GPU_RESOURCE: 1}, name="helper"),
                ]
            ),
            3,
            {},
            (),
            id="gpus-summed-over-containers",
        ),
        pytest.param(
            JobBuilder("j").node_selector({"gpu": "a100", "zone": "a"}),
            1,
            {"gpu": "a100", "zone": "a"},
            (),
            id="node-selector",
        ),
        pytest.param(
            JobBuilder("j").toleration("ebbflow.dev/spot", "NoSchedule"),
            1,
            {},
            (Toleration("ebbflow.dev/spot", "Exists", "", "NoSchedule"),),
            id="toleration-exists",
        ),
        pytest.param(
            JobBuilder("j")
            .toleration("dedicated", "NoExecute", operator="Equal", value="ml")
            .toleration("", operator="Exists"),
            1,
            {},
            (Toleration("dedicated", "Equal", "ml", "NoExecute"), Toleration("", "Exists", "", "")),
            id="tolerations-in-order",
        ),
        pytest.param(
            JobBuilder("j").pod_spec(tolerations=[{"key": "k", "value": "v"}]),
            1,
            {},
            (Toleration("k", "Equal", "v", ""),),
            id="toleration-operator-defaults-to-equal",
        ),
    ],
)
def test_parse_job_derives_scheduling_facts_from_the_template(
    builder: JobBuilder, gpus: int, node_selector: dict[str, str], tolerations: tuple[Toleration, ...]
) -> None:
    job = make_job(builder)
    assert job.gpus_per_worker == gpus
    assert dict(job.node_selector) == node_selector
    assert job.tolerations == tolerations


def test_parse_job_keeps_metadata_and_status() -> None:
    status = {
        "phase": "Running",
        "worldGeneration": 4,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Running"}],
    }
    job = make_job(JobBuilder("train").replicas(1, 2), namespace="team", age=60, generation=3, status=status)
    assert job.key == ("team", "train")
    assert (job.uid, job.generation, job.created) == ("uid-train", 3, NOW - 60)
    assert job.status.phase is Phase.RUNNING
    assert job.status.world_generation == 4
    assert [(c.type, c.status.value, c.reason) for c in job.status.conditions] == [
        ("Ready", "True", "Running")
    ]


def test_parse_job_null_status_is_empty() -> None:
    raw = JobBuilder("j").obj()
    raw["status"] = None
    job = parse_job(raw)
    assert job.status.phase is None and job.status.conditions == []


def _without(path: tuple[str, ...]) -> Json:
    raw = JobBuilder("j").obj()
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return raw


def _with(path: tuple[str, ...], value: object) -> Json:
    raw = JobBuilder("j").obj()
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return raw


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_without(("spec",)), id="missing-spec"),
        pytest.param(_with(("spec",), None), id="null-spec"),
        pytest.param(_without(("metadata",)), id="missing-metadata"),
        pytest.param(_without(("spec", "template")), id="missing-template"),
        pytest.param(_without(("spec", "globalBatchSize")), id="missing-global-batch-size"),
        pytest.param(_with(("spec", "replicas"), {"min": 0, "max": 1}), id="min-below-bound"),
        pytest.param(_with(("spec", "template", "spec", "containers"), []), id="no-containers"),
        pytest.param(_with(("spec", "batching"), "greedy"), id="unknown-batching"),
    ],
)
def test_parse_job_rejects_invalid_objects(raw: Json) -> None:
    with pytest.raises(pydantic.ValidationError):
        parse_job(raw)


# --- parse_progress ------------------------------------------------------------------------------

FULL_REPORT = {
    "step": 10,
    "samples": 640,
    "loss": 0.5,
    "samplesPerSecond": 12.5,
    "time": "2024-01-01T00:00:00Z",
}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(json.dumps(FULL_REPORT), FULL_REPORT, id="full"),
        pytest.param(
            json.dumps({**FULL_REPORT, "rank": 0, "secret": "x"}), FULL_REPORT, id="extra-fields-dropped"
        ),
        pytest.param(json.dumps({"step": 3, "other": 1}), {"step": 3}, id="partial"),
        pytest.param("{}", {}, id="empty-object"),
        pytest.param(json.dumps({"steps": 3}), {}, id="only-unknown-fields"),
        pytest.param(None, None, id="absent"),
        pytest.param("", None, id="empty-string"),
        pytest.param("not json", None, id="junk"),
        pytest.param('{"step": 3', None, id="truncated"),
        pytest.param("[1, 2]", None, id="list"),
        pytest.param("42", None, id="number"),
        pytest.param("null", None, id="null"),
        pytest.param('"step"', None, id="string"),
        pytest.param('{"step": 3, "loss": NaN}', None, id="nan-is-not-json"),
        pytest.param('{"step": 3, "loss": -Infinity}', None, id="infinity-is-not-json"),
        pytest.param('{"step": 3, "loss": null}', {"step": 3, "loss": None}, id="skipped-step-has-no-loss"),
    ],
)
def test_parse_progress(raw: str | None, expected: Json | None) -> None:
    assert parse_progress(raw) == expected


def test_parse_progress_keeps_exactly_the_contract_fields() -> None:
    report = {name: i for i, name in enumerate(contract.PROGRESS_FIELDS)} | {"extra": True}
    parsed = parse_progress(json.dumps(report))
    assert parsed is not None
    assert tuple(parsed) == contract.PROGRESS_FIELDS
