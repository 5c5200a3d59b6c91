"""Plain data the decision layer works on, parsed from the API's JSON (dicts in, frozen dataclasses out).

No kopf or kubernetes imports: the Kubernetes I/O layer hands raw JSON objects to `parse_*`, and
everything downstream is pure. Jobs arrive already defaulted by the API server (see crd.py).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebbflow_trainer import contract

GPU_RESOURCE = "nvidia.com/gpu"
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
# Taints the node lifecycle controller sets on nodes that are not healthy.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"


def parse_time(value: str | None) -> float | None:
    """RFC 3339 timestamp -> POSIX seconds."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def format_time(seconds: float) -> str:
    """POSIX seconds -> the RFC 3339 form Kubernetes writes (second precision, UTC)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


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
    phase: str = "Pending"
    gpus: int = 0
    created: float = 0.0
    deleting: bool = False
    ready: bool = False
    exit_code: int | None = None  # of the first terminated container that failed (or 0)
    disruption: str | None = None  # DisruptionTarget condition reason, or status.reason
    progress: str | None = None  # ANNOTATION_PROGRESS
    world_generation: int = 0

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def holds_gpus(self) -> bool:
        """Bound and not finished: the scheduler counts its requests against the node."""
        return self.node is not None and not self.finished


@dataclass(frozen=True)
class Rendezvous:
    port: int = contract.RENDEZVOUS_PORT
    join_timeout_seconds: int = 600
    image: str | None = None
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class JobSpec:
    min_replicas: int
    max_replicas: int
    global_batch_size: int
    virtual_nodes: int
    template: Mapping[str, Any] = field(default_factory=dict)
    gpus_per_worker: int = 1
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    batching: str = contract.BATCHING_POLICIES[0]
    lr_scaling: str = contract.LR_SCALING_POLICIES[0]
    checkpoint_path: str = "/checkpoints"
    checkpoint_interval_steps: int = 1000
    priority: int = 0
    max_restarts: int = 3
    leave_grace_seconds: int = contract.DEFAULT_LEAVE_GRACE_SECONDS
    clean_pod_policy: str = "Running"
    rendezvous: Rendezvous = field(default_factory=Rendezvous)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    observed_generation: int = 0
    last_transition_time: str = ""

    def to_json(self) -> Json:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": self.observed_generation,
            "lastTransitionTime": self.last_transition_time,
        }


@dataclass(frozen=True)
class JobStatus:
    """The parts of a job's status the operator reads back: its durable record of observations."""

    phase: str = ""
    desired_replicas: int = 0
    world_generation: int = 0
    preemptions: int = 0
    restarts: int = 0
    worker_nodes: Mapping[str, str] = field(default_factory=dict)
    hold_replicas: int | None = None
    hold_until: float | None = None
    conditions: tuple[Condition, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    namespace: str
    name: str
    uid: str
    generation: int
    created: float
    spec: JobSpec
    status: JobStatus = field(default_factory=JobStatus)

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


def _exit_code(status: Mapping[str, Any]) -> int | None:
    codes = [
        int(terminated["exitCode"])
        for container in status.get("containerStatuses") or []
        if (terminated := (container.get("state") or {}).get("terminated"))
    ]
    if not codes:
        return None
    failed = [code for code in codes if code != 0]
    return failed[0] if failed else 0


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
    return Pod(
        name=metadata["name"],
        namespace=metadata.get("namespace", ""),
        uid=metadata.get("uid", ""),
        job=labels.get(contract.LABEL_JOB_NAME),
        role=labels.get(contract.LABEL_ROLE),
        owner_uid=owner.get("uid") if owner else None,
        node=spec.get("nodeName") or None,
        phase=status.get("phase") or "Pending",
        gpus=_pod_gpus(spec),
        created=parse_time(metadata.get("creationTimestamp")) or 0.0,
        deleting=bool(metadata.get("deletionTimestamp")),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        exit_code=_exit_code(status),
        disruption=_disruption(status),
        progress=annotations.get(contract.ANNOTATION_PROGRESS),
        world_generation=int(annotations.get(contract.ANNOTATION_WORLD_GENERATION, 0) or 0),
    )


def parse_job_spec(spec: Mapping[str, Any]) -> JobSpec:
    template = spec["template"]
    pod_spec = template.get("spec") or {}
    replicas = spec["replicas"]
    rendezvous = spec.get("rendezvous") or {}
    checkpoint = spec.get("checkpoint") or {}
    command = rendezvous.get("command")
    return JobSpec(
        min_replicas=int(replicas["min"]),
        max_replicas=int(replicas["max"]),
        global_batch_size=int(spec["globalBatchSize"]),
        virtual_nodes=int(spec.get("virtualNodes") or replicas["max"]),
        template=template,
        gpus_per_worker=_pod_gpus(pod_spec),
        node_selector=dict(pod_spec.get("nodeSelector") or {}),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in pod_spec.get("tolerations") or []
        ),
        batching=str(spec.get("batching", contract.BATCHING_POLICIES[0])),
        lr_scaling=str(spec.get("lrScaling", contract.LR_SCALING_POLICIES[0])),
        checkpoint_path=str(checkpoint.get("path", "/checkpoints")),
        checkpoint_interval_steps=int(checkpoint.get("intervalSteps", 1000)),
        priority=int(spec.get("priority", 0)),
        max_restarts=int(spec.get("maxRestarts", 3)),
        leave_grace_seconds=int(spec.get("leaveGraceSeconds", contract.DEFAULT_LEAVE_GRACE_SECONDS)),
        clean_pod_policy=str(spec.get("cleanPodPolicy", "Running")),
        rendezvous=Rendezvous(
            port=int(rendezvous.get("port", contract.RENDEZVOUS_PORT)),
            join_timeout_seconds=int(rendezvous.get("joinTimeoutSeconds", 600)),
            image=rendezvous.get("image"),
            command=tuple(command) if command else None,
        ),
    )


def parse_condition(raw: Mapping[str, Any]) -> Condition:
    return Condition(
        type=str(raw.get("type", "")),
        status=str(raw.get("status", "Unknown")),
        reason=str(raw.get("reason", "")),
        message=str(raw.get("message", "")),
        observed_generation=int(raw.get("observedGeneration", 0) or 0),
        last_transition_time=str(raw.get("lastTransitionTime", "")),
    )


def parse_job_status(status: Mapping[str, Any]) -> JobStatus:
    hold = status.get("holdReplicas")
    return JobStatus(
        phase=str(status.get("phase", "")),
        desired_replicas=int(status.get("desiredReplicas", 0) or 0),
        world_generation=int(status.get("worldGeneration", 0) or 0),
        preemptions=int(status.get("preemptions", 0) or 0),
        restarts=int(status.get("restarts", 0) or 0),
        worker_nodes=dict(status.get("workerNodes") or {}),
        hold_replicas=int(hold) if hold is not None else None,
        hold_until=parse_time(status.get("holdUntil")),
        conditions=tuple(parse_condition(c) for c in status.get("conditions") or []),
        raw=status,
    )


def parse_job(raw: Mapping[str, Any]) -> Job:
    metadata = raw["metadata"]
    return Job(
        namespace=metadata["namespace"],
        name=metadata["name"],
        uid=metadata.get("uid", ""),
        generation=int(metadata.get("generation", 0) or 0),
        created=parse_time(metadata.get("creationTimestamp")) or 0.0,
        spec=parse_job_spec(raw["spec"]),
        status=parse_job_status(raw.get("status") or {}),
    )


def parse_progress(raw: str | None) -> Json | None:
    """A trainer's progress annotation, keeping only the contract's fields; None when unreadable."""
    if not raw:
        return None
    try:
        report = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    return {key: report[key] for key in contract.PROGRESS_FIELDS if key in report}
