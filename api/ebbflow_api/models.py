"""The ElasticTrainingJob API in pydantic: the single source of its fields, defaults, bounds and rules.

Everything else is derived from these classes: the CRD's structural schema with its CEL rules
(`ebbflow_api.crd`, committed under crds/), the operator's parsing of jobs (`ElasticTrainingJob.
model_validate`), and the trainer's defaults and V/B/max checks (`TrainingShape`). Python names are
snake_case; the API's camelCase names are generated from them (one spelling each).

Invariants: a default or a bound is written once, here; a cross-field rule is written once, in CEL
(`cel_rules`), and evaluated by the API server and by `rule_violations` alike. No Kubernetes client
or torch import, so both sides can use this module.
"""

from __future__ import annotations

import datetime
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator

from . import contract
from .base import ApiModel, DateTime, Int64, OpenModel
from .rules import Rule, evaluate, violations

# Upper bounds that catch typos (an extra zero) rather than limit real jobs.
MAX_REPLICAS = 1024
MAX_VIRTUAL_NODES = 65536
MAX_GLOBAL_BATCH_SIZE = 1 << 24
MAX_PRIORITY = 1_000_000
MAX_RESTARTS = 1000
MAX_LEAVE_GRACE_SECONDS = 3600
MAX_NON_FINITE_STEPS = 10_000
MAX_JOB_NAME_LENGTH = 40  # leaves room for "-worker-NNNN" in 63-character pod and Service names
MAX_GPUS_PER_WORKER = 64
GPU_RESOURCE = "nvidia.com/gpu"

# V when spec.virtualNodes is unset. The rules below use it, and so does the operator (through
# `TrainingShape.resolved_virtual_nodes`), so "V defaults to max" is written only here.
VIRTUAL_NODES_OR_MAX = "(has(self.virtualNodes) ? self.virtualNodes : self.replicas.max)"


# --- enumerations ------------------------------------------------------------------------------


class Batching(StrEnum):
    """static: B/V samples per virtual node; dynamic: rebalance by measured throughput."""

    STATIC = "static"
    DYNAMIC = "dynamic"


class LrScaling(StrEnum):
    """Learning-rate scaling when the global batch changes."""

    NONE = "none"
    LINEAR = "linear"
    SQRT = "sqrt"
    ADASCALE = "adascale"


class CleanPodPolicy(StrEnum):
    """Which pods are deleted when the job ends."""

    RUNNING = "Running"
    ALL = "All"
    NONE = "None"


class Phase(StrEnum):
    """A job's phase (status.phase); Succeeded and Failed are final."""

    PENDING = "Pending"
    RUNNING = "Running"
    SCALING = "Scaling"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


# --- spec ----------------------------------------------------------------------------------------

_GPU_VALUES = [str(n) for n in range(MAX_GPUS_PER_WORKER + 1)]
# A quantity: "4", "16Gi", 2. Bounded so that the API server can price CEL rules reading it.
Quantity = Annotated[int | str, Field(json_schema_extra={"maxLength": 64})]
ResourceMap = Annotated[
    dict[str, Quantity],
    Field(
        max_length=16,
        json_schema_extra={
            "x-kubernetes-validations": [
                Rule(
                    f"!('{GPU_RESOURCE}' in self) || (type(self['{GPU_RESOURCE}']) == int ? "
                    f"self['{GPU_RESOURCE}'] >= 0 && self['{GPU_RESOURCE}'] <= {MAX_GPUS_PER_WORKER} : "
                    f"self['{GPU_RESOURCE}'] in {_GPU_VALUES})",
                    f"{GPU_RESOURCE} must be a whole number of GPUs between 0 and {MAX_GPUS_PER_WORKER}; "
                    "use time-slicing replicas for fractions",
                ).schema()
            ]
        },
    ),
]


class Resources(OpenModel):
    limits: ResourceMap | None = Field(
        None, description=f"Resource limits; {GPU_RESOURCE} is the GPUs each worker needs."
    )
    requests: ResourceMap | None = Field(None, description="Resource requests.")


class Container(OpenModel):
    name: str = Field(min_length=1, max_length=63, description="Container name.")
    image: str = Field(
        min_length=1,
        max_length=512,
        description="Container image (the trainer image for the trainer container).",
    )
    resources: Resources | None = None


class PodSpec(OpenModel):
    containers: list[Container] = Field(
        min_length=1,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-validations": [
                Rule(
                    "self.all(c, size(c.image) > 0)",
                    "every container needs an image: set spec.template.spec.containers[].image",
                ).schema()
            ]
        },
    )


class PodTemplate(ApiModel):
    """The worker PodTemplateSpec. The operator adds the contract's labels and environment, sets
    restartPolicy Never and terminationGracePeriodSeconds to leaveGraceSeconds, and
    shareProcessNamespace true unless the template sets it."""

    metadata: dict[str, Any] | None = None
    spec: PodSpec

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"spec": self.spec.to_json()}
        if self.metadata is not None:
            body["metadata"] = self.metadata
        return body


class Replicas(ApiModel):
    """Worker count bounds; the operator picks the size in [min, max] that fits."""

    min: int = Field(ge=1, le=MAX_REPLICAS, description="Fewest workers the job can train with.")
    max: int = Field(
        ge=1, le=MAX_REPLICAS, description="Most workers the job can use; `kubectl scale` sets it."
    )
    cel_rules = (
        Rule(
            "self.min <= self.max",
            "spec.replicas.min must be <= spec.replicas.max: lower min or raise max",
        ),
    )


class Checkpoint(ApiModel):
    """Where durable checkpoints go: a shared volume, or an S3-compatible object store that the
    trainer uploads to while training goes on (docs/trainer.md, "Checkpoints in object storage")."""

    path: str = Field(
        "/checkpoints",
        max_length=1024,
        pattern="^(/|s3://).+",
        description="An absolute path on a shared volume, or s3://<bucket>[/<prefix>] in an object store "
        "(then endpoint and credentialsSecret are needed).",
    )
    interval_steps: int = Field(1000, ge=1, le=10_000_000, description="Steps between durable checkpoints.")
    endpoint: str | None = Field(
        None,
        max_length=1024,
        pattern="^https?://[^/?#]+/?$",
        description="The object store's URL (s3:// paths only), e.g. https://s3.us-east-1.amazonaws.com.",
    )
    credentials_secret: str | None = Field(
        None,
        max_length=253,
        pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="A Secret of the job's namespace holding the store's credentials as AWS_ACCESS_KEY_ID "
        "and AWS_SECRET_ACCESS_KEY (AWS_REGION and AWS_SESSION_TOKEN optional); s3:// paths only. "
        "Credentials never go in the spec.",
    )
    retain: int | None = Field(
        None, ge=1, le=1000, description="Complete checkpoints kept in the object store (default 2)."
    )
    cel_rules = (
        Rule(
            "!has(self.path) || !self.path.startsWith('s3://') || "
            "self.path.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$')",
            "spec.checkpoint.path must be s3://<bucket>[/<prefix>] with a bucket name of 3-63 characters "
            "(a-z, 0-9, '.', '-'): fix the bucket name",
            field_path=".path",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.path) || !self.path.startsWith('s3://') || "
            "(has(self.endpoint) && has(self.credentialsSecret))",
            "spec.checkpoint.path s3://... needs spec.checkpoint.endpoint (the store's URL) and "
            "spec.checkpoint.credentialsSecret (the Secret holding its credentials): set both",
            field_path=".path",
            reason="FieldValueRequired",
        ),
        Rule(
            "(has(self.path) && self.path.startsWith('s3://')) || (!has(self.endpoint) "
            "&& !has(self.credentialsSecret) && !has(self.retain))",
            "spec.checkpoint.endpoint, credentialsSecret and retain apply to an s3:// path only: remove "
            "them or make spec.checkpoint.path s3://<bucket>[/<prefix>]",
            field_path=".path",
            reason="FieldValueInvalid",
        ),
    )


class BandLimit(ApiModel):
    """Opt-in memory elasticity: the convolutions drop their highest frequencies when a worker's share
    of its GPU's memory shrinks (Dziedzic et al., ICML 2019; docs/trainer.md)."""

    memory_budget_mib: int | None = Field(
        None,
        alias="memoryBudgetMiB",
        ge=1,
        le=16_777_216,
        description="GPU memory (MiB) each worker may use. Unset: the device's memory shared among the "
        "workers time-sliced on it, from the node's labels nvidia.com/gpu.memory (MiB per GPU) and "
        "nvidia.com/gpu.replicas, times the worker's GPUs; the smallest over the job's workers.",
    )
    max_compression_rate: float = Field(
        0.75,
        ge=0,
        lt=1,
        description="The largest fraction of each convolution's spectrum the trainers may drop (they "
        "choose among 0, 0.25, 0.5 and 0.75 the smallest that fits the budget).",
    )


class RendezvousSpec(ApiModel):
    """The rendezvous pod (CPU only) that hosts the c10d store."""

    port: int = Field(contract.RENDEZVOUS_PORT, ge=1024, le=65535, description="TCP port of the c10d store.")
    join_timeout_seconds: int = Field(
        600,
        ge=10,
        le=86400,
        description="Seconds a worker waits for a rendezvous round before giving up.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="Image of the rendezvous pod (default: the first worker image).",
    )
    command: list[str] | None = Field(
        None, max_length=64, description="Command of the rendezvous pod (default: the contract's)."
    )


def _multiple_of_v(batch: str) -> str:
    """CEL: a batch splits evenly into the virtual nodes (V defaults to replicas.max)."""
    return f"{batch} % {VIRTUAL_NODES_OR_MAX} == 0"


class TrainingShape(ApiModel):
    """What a step means: the part of the spec the trainer receives and checks with the same rules."""

    replicas: Replicas
    virtual_nodes: int | None = Field(
        None,
        ge=1,
        le=MAX_VIRTUAL_NODES,
        description="V, the fixed number of virtual nodes (default: replicas.max); >= max, and >= max x "
        "GPUs per worker when a worker has several (one training process per GPU).",
    )
    global_batch_size: int = Field(
        ge=1, le=MAX_GLOBAL_BATCH_SIZE, description="B, samples per step; a multiple of V."
    )
    batching: Batching = Field(Batching.STATIC, description=Batching.__doc__)
    lr_scaling: LrScaling = Field(LrScaling.NONE, description=LrScaling.__doc__)
    max_global_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_GLOBAL_BATCH_SIZE,
        description="Lets the goodput policy change B (Pollux's batch-size co-adaptation) between "
        "globalBatchSize and this, in multiples of V, with lrScaling adascale keeping the step's "
        "learning rate right; unset (the default): B never changes.",
    )
    momentum_correction: bool = Field(
        False,
        description="When B changes (maxGlobalBatchSize, or a resume at another globalBatchSize), also "
        "correct SGD's momentum: a step worth r steps at the base batch (r from lrScaling) gets momentum "
        "m0^r and learning rate lr x r x (1 - m0^r) / (1 - m0), and the velocity is rescaled at the change, "
        "so momentum remembers the same number of samples and lr / (1 - m) follows lrScaling "
        "(docs/trainer.md). Needs lrScaling other than none and torch.optim.SGD with momentum; "
        "no effect while B stays the base batch.",
    )
    cel_rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "!has(self.virtualNodes) || self.virtualNodes >= self.replicas.max",
            "spec.virtualNodes must be >= spec.replicas.max: raise virtualNodes or lower max",
            field_path=".virtualNodes",
            reason="FieldValueInvalid",
        ),
        Rule(
            _multiple_of_v("self.globalBatchSize"),
            "spec.globalBatchSize must be a multiple of spec.virtualNodes (or of spec.replicas.max when "
            "virtualNodes is unset): round it to a multiple",
            field_path=".globalBatchSize",
            reason="FieldValueInvalid",
        ),
        Rule(
            f"!has(self.lrScaling) || self.lrScaling != 'adascale' || {VIRTUAL_NODES_OR_MAX} >= 2",
            "spec.lrScaling adascale needs spec.virtualNodes >= 2 (the gradient noise scale is estimated "
            "from the spread between virtual nodes): raise virtualNodes or choose another lrScaling",
            field_path=".lrScaling",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.maxGlobalBatchSize) || self.maxGlobalBatchSize >= self.globalBatchSize",
            "spec.maxGlobalBatchSize must be >= spec.globalBatchSize: raise it or leave it unset",
            field_path=".maxGlobalBatchSize",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.maxGlobalBatchSize) || " + _multiple_of_v("self.maxGlobalBatchSize"),
            "spec.maxGlobalBatchSize must be a multiple of spec.virtualNodes (or of spec.replicas.max when "
            "virtualNodes is unset): round it to a multiple",
            field_path=".maxGlobalBatchSize",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.momentumCorrection) || !self.momentumCorrection || "
            "(has(self.lrScaling) && self.lrScaling != 'none')",
            "spec.momentumCorrection needs spec.lrScaling linear, sqrt or adascale (momentum follows the "
            "learning rate's scaling): set lrScaling or leave momentumCorrection unset",
            field_path=".momentumCorrection",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.maxGlobalBatchSize) || (has(self.lrScaling) && self.lrScaling == 'adascale')",
            "spec.maxGlobalBatchSize needs spec.lrScaling adascale (a larger batch must scale the "
            "learning rate by its measured gain): set lrScaling: adascale or leave maxGlobalBatchSize unset",
            field_path=".maxGlobalBatchSize",
            reason="FieldValueInvalid",
        ),
    )

    def allows_global_batch(self, batch: int) -> bool:
        """Whether B may become `batch` during the run: only with maxGlobalBatchSize, never below
        globalBatchSize, and the shape with that B passes the same rules (whole virtual nodes, <= max)."""
        if self.max_global_batch_size is None or batch < self.global_batch_size:
            return False
        return not violations(TrainingShape.cel_rules, {**self.to_json(), "globalBatchSize": batch})

    @cached_property
    def resolved_virtual_nodes(self) -> int:
        """V, with the API's default applied (the same CEL expression the rules use)."""
        value: int = evaluate(VIRTUAL_NODES_OR_MAX, self.to_json())
        return value


def _container_gpus(container: str) -> str:
    """CEL: the GPUs a container's limits ask for (0 without any, or for a value that is not a whole
    number, which the limits' own rule reports)."""
    value = f"{container}.resources.limits['{GPU_RESOURCE}']"
    present = f"has({container}.resources) && has({container}.resources.limits) && '{GPU_RESOURCE}' in "
    present += f"{container}.resources.limits && string({value}).matches('^[0-9]{{1,2}}$')"
    return f"({present} ? int({value}) : 0)"


class ElasticTrainingJobSpec(TrainingShape):
    template: PodTemplate
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    priority: int = Field(
        0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Higher-priority jobs get GPUs first (up to their max).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=MAX_RESTARTS,
        description="Real worker failures (not preemptions) tolerated before Failed.",
    )
    leave_grace_seconds: int = Field(
        contract.DEFAULT_LEAVE_GRACE_SECONDS,
        ge=1,
        le=MAX_LEAVE_GRACE_SECONDS,
        description="Seconds a worker gets after SIGTERM to hand its state over before it is killed.",
    )
    max_non_finite_steps: int = Field(
        3,
        ge=1,
        le=MAX_NON_FINITE_STEPS,
        description="Consecutive steps with a non-finite loss or gradient (each skipped) before the job "
        "fails with reason NonFiniteLoss.",
    )
    clean_pod_policy: CleanPodPolicy = Field(
        CleanPodPolicy.RUNNING,
        description="Which pods are deleted when the job ends: Running (unfinished pods and the rendezvous "
        "pod; finished workers stay for their logs), All, or None.",
    )
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)
    band_limit: BandLimit | None = Field(
        None,
        description="Set (even empty, {}) to let the trainers trade convolution bandwidth for GPU memory: "
        "the training script's Conv2d layers become band-limited and their compression rate follows "
        "the workers' memory budget. Unset (the default): the model is never changed.",
    )
    cel_rules = (
        *TrainingShape.cel_rules,
        Rule(
            "self.template.spec.containers.all(c, "
            f"{_container_gpus('c')} <= 1 || "
            f"(has(self.virtualNodes) && self.virtualNodes >= self.replicas.max * {_container_gpus('c')}))",
            "a worker with several GPUs runs one training process per GPU and each process needs a "
            "virtual node: set spec.virtualNodes to at least spec.replicas.max times the GPUs per worker "
            "(and spec.globalBatchSize to a multiple of it)",
            field_path=".virtualNodes",
            reason="FieldValueInvalid",
        ),
    )


# --- status --------------------------------------------------------------------------------------


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    observed_generation: Int64 = 0
    last_transition_time: DateTime | None = None

    @field_validator("last_transition_time", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return value or None


class LastRescale(ApiModel):
    time: DateTime
    from_: int = Field(alias="from")
    to: int
    reason: str


class Evaluation(ApiModel):
    """The training script's last evaluation (its eval_fn)."""

    step: Int64 | None = Field(None, description="Global step after which the model was evaluated.")
    metrics: dict[str, float] | None = None


class Progress(ApiModel):
    """Latest report of the trainers (rank 0)."""

    step: Int64 | None = None
    samples: Int64 | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    time: str | None = None
    eval: Evaluation | None = None
    world_size: int | None = Field(None, description="Workers that trained the step.")
    micro_batch: int | None = Field(None, description="Samples per micro-batch (one virtual node).")
    accumulation_steps: int | None = Field(
        None, description="Micro-batches rank 0 accumulated before the synchronising one."
    )
    step_seconds: float | None = Field(None, description="Wall time of the step.")
    compute_seconds: float | None = Field(
        None, description="Rank 0's forward+backward seconds for one micro-batch."
    )
    communication_seconds: float | None = Field(
        None, description="The rest of the step: gradient sync and waiting for slower workers."
    )
    noise_scale: float | None = Field(None, description="Gradient noise scale estimate, when measured.")
    rescale_pause_seconds: float | None = Field(
        None, description="Pause of the last membership change, when there was one."
    )
    compression_rate: float | None = Field(
        None, description="Fraction of each convolution's spectrum dropped (spec.bandLimit only)."
    )


class ElasticTrainingJobStatus(ApiModel):
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: Int64 | None = None
    replicas: int | None = Field(None, description="Worker pods that exist and are not leaving.")
    ready_replicas: int | None = Field(None, description="Workers running and ready.")
    desired_replicas: int | None = Field(None, description="The allocator's size for the job.")
    selector: str | None = Field(None, description="Label selector of the worker pods.")
    world_generation: Int64 | None = None
    global_batch_size: int | None = Field(
        None,
        description="The global batch B the goodput policy chose (only with spec.maxGlobalBatchSize; "
        "the workers' annotation carries it to the trainers, which switch at a step boundary).",
    )
    last_rescale: LastRescale | None = None
    preemptions: Int64 | None = None
    restarts: Int64 | None = None
    worker_nodes: dict[str, str] = Field(
        default_factory=dict,
        description="Worker pods as last observed (or just created) and their nodes ('' while "
        "unscheduled); a bound worker that vanishes from here without the operator deleting it was "
        "preempted.",
    )
    hold_replicas: int | None = Field(
        None, description="After a pending timeout the job stays at most this big until holdUntil."
    )
    hold_until: DateTime | None = None
    start_time: DateTime | None = None
    completion_time: DateTime | None = None
    progress: Progress | None = None


# --- the object ----------------------------------------------------------------------------------


class ObjectMeta(ApiModel):
    """The metadata fields the operator reads; the API server owns their schema."""

    name: str
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    creation_timestamp: str | None = None


class ElasticTrainingJob(ApiModel):
    metadata: ObjectMeta
    spec: ElasticTrainingJobSpec
    status: ElasticTrainingJobStatus = Field(default_factory=ElasticTrainingJobStatus)
    cel_rules = (
        Rule(
            f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters (pod and Service names are "
            "derived from it): choose a shorter name",
        ),
        Rule(
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "metadata.name must start with a letter and contain only lowercase letters, digits and '-' "
            "(it names Services): rename the job",
        ),
    )

    @field_validator("status", mode="before")
    @classmethod
    def _null_status_is_empty(cls, value: object) -> object:
        return {} if value is None else value


def rule_violations(model: ApiModel, path: str = "") -> list[tuple[str, Rule]]:
    """Every CEL rule `model` (and the models inside it) breaks, with the path of the object."""
    found = [(path, rule) for rule in violations(type(model).cel_rules, model.to_json())]
    for name, value in model:
        alias = type(model).model_fields[name].alias or name
        if isinstance(value, ApiModel):
            found += rule_violations(value, f"{path}.{alias}" if path else alias)
    return found


def format_time(seconds: float) -> str:
    """POSIX seconds -> the RFC 3339 form Kubernetes writes (second precision, UTC)."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


def parse_time(value: str | None) -> float | None:
    """RFC 3339 timestamp -> POSIX seconds."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
