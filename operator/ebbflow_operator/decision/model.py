"""Plain data the decision layer works on: nodes and pods parsed from the API's JSON into frozen
dataclasses, and jobs as the API models (`ebbflow_api.models`) plus the scheduling facts derived
from their pod template.

No kopf or kubernetes imports: the Kubernetes I/O layer hands raw JSON objects to `parse_*`, and
everything downstream is pure. Jobs arrive already defaulted by the API server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebbflow_api import contract
from ebbflow_api.models import (
    GPU_RESOURCE,
    ElasticTrainingJob,
    ElasticTrainingJobSpec,
    ElasticTrainingJobStatus,
    format_time,
    parse_time,
)

__all__ = ["GPU_RESOURCE", "format_time", "parse_time"]

JobKey = tuple[str, str]  # (namespace, name)
Json = dict[str, Any]

# Labels clouds and node provisioners put on spot/preemptible nodes (key -> value meaning spot).
SPOT_LABELS: Mapping[str, str] = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
# NVIDIA GPU feature discovery's node labels: the physical GPU count, time-slicing replicas per GPU,
# and the memory of one physical GPU in MiB.
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"  # "-SHARED" appended when time-sliced
LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
# Taints the node lifecycle controller sets on nodes that are not healthy.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"


def gpu_count(value: object) -> int:
    """A whole-GPU quantity ("2", 2) as an int; the CRD rejects anything else for jobs."""
    try:
        return int(str(value))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' toleration semantics (an empty key with Exists tolerates everything)."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int  # allocatable nvidia.com/gpu: physical GPUs x time-slicing replicas
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False

    @property
    def spot(self) -> bool:
        return any(self.labels.get(key) == value for key, value in SPOT_LABELS.items())


@dataclass(frozen=True)
class Pod:
    """What the decisions need to know about one pod."""

    name: str
    namespace: str
    uid: str = ""
    job: str | None = None  # LABEL_JOB_NAME
    role: str | None = None  # LABEL_ROLE
    owner_uid: str | None = None  # controller owner reference
    node: str | None = None  # spec.nodeName: None while unscheduled
    # Since when the scheduler has found no node for it (PodScheduled False, reason Unschedulable);
    # None while it has not tried: a pod queued behind thousands of others is not refused.
    refused_since: float | None = None
    phase: str = "Pending"
    gpus: int = 0
    created: float = 0.0
    deleting: bool = False
    ready: bool = False
    exit_code: int | None = None  # of the first terminated container that failed (or 0)
    termination_message: str = ""  # that failed container's state.terminated.message: why it stopped
    # Every container terminated with exit code 0: the kubelet reports the phase Succeeded only a
    # moment later, and meanwhile the pod is Running and not Ready.
    completed: bool = False
    disruption: str | None = None  # DisruptionTarget condition reason, or status.reason
    progress: str | None = None  # ANNOTATION_PROGRESS
    world_generation: int = 0
    global_batch: str | None = None  # ANNOTATION_GLOBAL_BATCH_SIZE as written (None: absent)
    memory_budget: str | None = None  # ANNOTATION_MEMORY_BUDGET as written (None: absent)
    ip: str | None = None  # status.podIP: None until the pod has its network

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def succeeded(self) -> bool:
        """Phase Succeeded, or every container exited 0 with nothing disrupting the pod: the kubelet
        reports the phase a moment after the containers end (a kubelet eviction's graceful exit 0
        comes with its DisruptionTarget condition, and ends Failed)."""
        return self.phase == "Succeeded" or (self.completed and self.disruption is None)

    @property
    def holds_gpus(self) -> bool:
        """Bound and not finished: the scheduler counts its requests against the node."""
        return self.node is not None and not self.finished


@dataclass(frozen=True)
class Placement:
    """Where a queued job's admitted Kueue flavors put its workers (decision/kueue.py): node labels
    required, taints tolerated."""

    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Json, ...] = ()


@dataclass(frozen=True)
class Job:
    """A job as the decisions see it: the API object plus what its pod template implies."""

    api: ElasticTrainingJob
    gpus_per_worker: int = 1
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    queue: str | None = None  # the Kueue LocalQueue its label names (decision/kueue.py)

    @property
    def spec(self) -> ElasticTrainingJobSpec:
        return self.api.spec

    @property
    def status(self) -> ElasticTrainingJobStatus:
        return self.api.status

    @property
    def namespace(self) -> str:
        return self.api.metadata.namespace

    @property
    def name(self) -> str:
        return self.api.metadata.name

    @property
    def uid(self) -> str:
        return self.api.metadata.uid

    @property
    def generation(self) -> int:
        return self.api.metadata.generation

    @property
    def created(self) -> float:
        return parse_time(self.api.metadata.creation_timestamp) or 0.0

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)


# --- parsing -------------------------------------------------------------------------------------


def _taint(raw: Mapping[str, Any]) -> Taint:
    return Taint(
        key=str(raw.get("key", "")), effect=str(raw.get("effect", "")), value=str(raw.get("value", ""))
    )


def parse_node(raw: Mapping[str, Any]) -> Node:
    metadata, spec, status = raw.get("metadata", {}), raw.get("spec", {}), raw.get("status", {})
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return Node(
        name=metadata["name"],
        gpus=gpu_count((status.get("allocatable") or {}).get(GPU_RESOURCE, 0)),
        labels=dict(metadata.get("labels") or {}),
        taints=tuple(_taint(t) for t in spec.get("taints") or []),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
    )


def _pod_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs the scheduler reserves for a pod: the sum over containers (limits imply requests)."""
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        total += gpu_count(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)))
    return total


def _termination(status: Mapping[str, Any]) -> tuple[int | None, str]:
    """The exit code and termination message of the first terminated container that failed; (0, "")
    when every terminated one succeeded, (None, "") while none has terminated."""
    terminated = [
        state
        for container in status.get("containerStatuses") or []
        if (state := (container.get("state") or {}).get("terminated"))
    ]
    if not terminated:
        return None, ""
    failed = next((t for t in terminated if int(t["exitCode"]) != 0), None)
    if failed is None:
        return 0, ""
    return int(failed["exitCode"]), str(failed.get("message") or "").strip()


def _completed(status: Mapping[str, Any]) -> bool:
    """Every container has terminated with exit code 0 (whatever the phase says yet)."""
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all(
        (terminated := (container.get("state") or {}).get("terminated")) and int(terminated["exitCode"]) == 0
        for container in statuses
    )


def _disruption(status: Mapping[str, Any]) -> str | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return str(condition.get("reason") or "DisruptionTarget")
    reason = status.get("reason")
    return str(reason) if reason in ("Evicted", "Preempting", "Terminated", "Shutdown", "NodeLost") else None


def parse_pod(raw: Mapping[str, Any]) -> Pod:
    metadata, spec, status = raw.get("metadata", {}), raw.get("spec", {}), raw.get("status", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    owner = next((o for o in metadata.get("ownerReferences") or [] if o.get("controller")), None)
    conditions = status.get("conditions") or []
    exit_code, termination_message = _termination(status)
    return Pod(
        name=metadata["name"],
        namespace=metadata.get("namespace", ""),
        uid=metadata.get("uid", ""),
        job=labels.get(contract.LABEL_JOB_NAME),
        role=labels.get(contract.LABEL_ROLE),
        owner_uid=owner.get("uid") if owner else None,
        node=spec.get("nodeName") or None,
        refused_since=_refused_since(conditions),
        phase=status.get("phase") or "Pending",
        gpus=_pod_gpus(spec),
        created=parse_time(metadata.get("creationTimestamp")) or 0.0,
        deleting=bool(metadata.get("deletionTimestamp")),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        exit_code=exit_code,
        termination_message=termination_message,
        completed=_completed(status),
        disruption=_disruption(status),
        progress=annotations.get(contract.ANNOTATION_PROGRESS),
        world_generation=int(annotations.get(contract.ANNOTATION_WORLD_GENERATION, 0) or 0),
        global_batch=annotations.get(contract.ANNOTATION_GLOBAL_BATCH_SIZE),
        memory_budget=annotations.get(contract.ANNOTATION_MEMORY_BUDGET),
        ip=status.get("podIP") or None,
    )


def _refused_since(conditions: list[Mapping[str, Any]]) -> float | None:
    """When the scheduler started refusing the pod: the kube-scheduler sets PodScheduled False with
    reason Unschedulable after it tried every node, and keeps the transition time while it retries."""
    for condition in conditions:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return parse_time(condition.get("lastTransitionTime")) or 0.0
    return None


def parse_toleration(raw: Mapping[str, Any]) -> Toleration:
    return Toleration(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or "Equal"),
        value=str(raw.get("value") or ""),
        effect=str(raw.get("effect") or ""),
    )


def job_from_api(api: ElasticTrainingJob, queue: str | None = None) -> Job:
    """Derives the scheduling facts (GPUs per worker, node selector, tolerations) once per version."""
    pod_spec = api.spec.template.spec.to_json()
    return Job(
        api=api,
        gpus_per_worker=_pod_gpus(pod_spec),
        node_selector=dict(pod_spec.get("nodeSelector") or {}),
        tolerations=tuple(parse_toleration(t) for t in pod_spec.get("tolerations") or []),
        queue=queue,
    )


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's: the LocalQueue a job is submitted to


def parse_job(raw: Mapping[str, Any]) -> Job:
    """An ElasticTrainingJob from the API (pydantic validates it against the same models as the CRD)."""
    labels = (raw.get("metadata") or {}).get("labels") or {}
    return job_from_api(ElasticTrainingJob.model_validate(raw), labels.get(QUEUE_LABEL) or None)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def parse_progress(raw: str | None) -> Json | None:
    """A trainer's progress annotation, keeping only the contract's fields; None when unreadable."""
    if not raw:
        return None
    try:
        # No NaN or infinity: the report is copied into the job's status, and JSON has neither.
        report = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    return {key: report[key] for key in contract.PROGRESS_FIELDS if key in report}
