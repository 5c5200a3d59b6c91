"""Test-object builders shared by every tier, the benchmarks and the dev clusters (Kueue style).

`JobBuilder` starts from a small valid ElasticTrainingJob and changes only what the caller cares
about, `JobBuilder("train").replicas(1, 4).gpus(2).priority(10).obj()`: the plain manifest a user
would `kubectl apply`; `model()` validates it with the API models. `make_job`, `make_pod`,
`make_node` and the demand builders give the objects as the operator's decision layer sees them;
`WorkloadBuilder` a Kueue Workload slice of a job in the states Kueue leaves it in.
Jobs go through the real parsing path (`JobBuilder` manifest -> `parse_job`), so a test can never
hold a job the API server would not accept.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Self

from ebbflow_api import contract
from ebbflow_api.models import GPU_RESOURCE, ElasticTrainingJob
from ebbflow_operator.decision import kueue, kueue_room
from ebbflow_operator.decision.allocator import Demand
from ebbflow_operator.decision.model import QUEUE_LABEL, Job, Node, Pod, format_time, parse_job
from ebbflow_operator.decision.plan import Plan
from ebbflow_operator.decision.planner import rendered

DEFAULT_IMAGE = "ebbflow/trainer:test"


class JobBuilder:
    """Builds one manifest; every method returns the builder, `obj()` a fresh copy of the manifest."""

    def __init__(self, name: str, namespace: str | None = None) -> None:
        metadata: dict[str, Any] = {"name": name}
        if namespace:
            metadata["namespace"] = namespace
        self._manifest: dict[str, Any] = {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "metadata": metadata,
            "spec": {
                "replicas": {"min": 1, "max": 1},
                "globalBatchSize": 64,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "trainer",
                                "image": DEFAULT_IMAGE,
                                "resources": {"limits": {GPU_RESOURCE: 1}},
                            }
                        ]
                    }
                },
            },
        }

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._manifest["spec"]
        return spec

    @property
    def _pod_spec(self) -> dict[str, Any]:
        pod_spec: dict[str, Any] = self._spec["template"]["spec"]
        return pod_spec

    @property
    def _container(self) -> dict[str, Any]:
        container: dict[str, Any] = self._pod_spec["containers"][0]
        return container

    def replicas(self, low: int, high: int) -> Self:
        """min and max workers; the global batch follows (64 samples per worker at max) unless set."""
        self._spec["replicas"] = {"min": low, "max": high}
        self._spec["globalBatchSize"] = 64 * high
        return self

    def virtual_nodes(self, count: int) -> Self:
        self._spec["virtualNodes"] = count
        return self

    def global_batch_size(self, samples: int) -> Self:
        self._spec["globalBatchSize"] = samples
        return self

    def set(self, **fields: Any) -> Self:
        """Any other spec field by its API name, e.g. `.set(priority=10, leaveGraceSeconds=5)`."""
        self._spec.update(fields)
        return self

    def queue(self, name: str) -> Self:
        """Submit the job to a Kueue LocalQueue (its queue-name label)."""
        self._manifest["metadata"].setdefault("labels", {})[QUEUE_LABEL] = name
        return self

    def priority(self, value: int) -> Self:
        return self.set(priority=value)

    def band_limit(
        self, memory_budget_mib: int | None = None, max_compression_rate: float | None = None
    ) -> Self:
        """spec.bandLimit: band-limited convolutions; without a budget it comes from the nodes' labels."""
        band: dict[str, Any] = {}
        if memory_budget_mib is not None:
            band["memoryBudgetMiB"] = memory_budget_mib
        if max_compression_rate is not None:
            band["maxCompressionRate"] = max_compression_rate
        return self.set(bandLimit=band)

    def gpus(self, count: int | str) -> Self:
        """GPUs per worker (the trainer container's nvidia.com/gpu limit)."""
        self._container.setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = count
        return self

    def cpu(self, request: str) -> Self:
        self._container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = request
        return self

    def image(self, image: str) -> Self:
        self._container["image"] = image
        return self

    def command(self, *command: str) -> Self:
        self._container["command"] = list(command)
        return self

    def env(self, **variables: str) -> Self:
        self._container.setdefault("env", []).extend({"name": k, "value": v} for k, v in variables.items())
        return self

    def node_selector(self, selector: dict[str, str]) -> Self:
        self._pod_spec["nodeSelector"] = dict(selector)
        return self

    def toleration(self, key: str, effect: str = "", operator: str = "Exists", value: str = "") -> Self:
        toleration = {"key": key, "operator": operator}
        if effect:
            toleration["effect"] = effect
        if value:
            toleration["value"] = value
        self._pod_spec.setdefault("tolerations", []).append(toleration)
        return self

    def pod_spec(self, **fields: Any) -> Self:
        """Any other field of the worker pod spec (volumes, affinity, ...)."""
        self._pod_spec.update(fields)
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._manifest)

    def model(self) -> ElasticTrainingJob:
        return ElasticTrainingJob.model_validate(self.obj())


NOW = 1_000_000.0
SPOT = {"karpenter.sh/capacity-type": "spot"}
ON_DEMAND = {"karpenter.sh/capacity-type": "on-demand"}
NODES4 = {f"n{i}": 4 for i in range(4)}  # free GPUs by node: 16 on four nodes


def make_job(
    builder: JobBuilder,
    *,
    namespace: str = "ns",
    age: float = 3600.0,
    generation: int = 1,
    status: dict[str, Any] | None = None,
) -> Job:
    """The job as the operator parses it after the API server stored it `age` seconds before NOW."""
    raw = builder.obj()
    metadata = raw["metadata"]
    metadata.setdefault("namespace", namespace)
    metadata["uid"] = f"uid-{metadata['name']}"
    metadata["generation"] = generation
    metadata["creationTimestamp"] = format_time(NOW - age)
    raw["status"] = status or {}
    return parse_job(raw)


def make_worker(
    job: Job,
    index: int,
    node: str | None = "od-0",
    phase: str = "Running",
    age: float = 100,
    refused: float | None = None,
    **fields: Any,
) -> Pod:
    """One of `job`'s worker pods; ready when running on a node unless told otherwise. `refused`:
    seconds since the scheduler started refusing it (None: it has not refused it)."""
    values: dict[str, Any] = {
        "name": f"{job.name}-worker-{index}",
        "namespace": job.namespace,
        "uid": f"uid-{job.name}-{index}",
        "job": job.name,
        "role": contract.ROLE_WORKER,
        "owner_uid": job.uid,
        "node": node,
        "phase": phase,
        "gpus": job.gpus_per_worker,
        "created": NOW - age,
        "refused_since": None if refused is None else NOW - refused,
        "ready": phase == "Running" and node is not None,
    }
    values.update(fields)
    return Pod(**values)


def make_rendezvous(job: Job, node: str = "od-0") -> Pod:
    return Pod(
        name=f"{job.name}-rdzv",
        namespace=job.namespace,
        uid=f"uid-{job.name}-rdzv",
        job=job.name,
        role=contract.ROLE_RENDEZVOUS,
        owner_uid=job.uid,
        node=node,
        phase="Running",
        ready=True,
    )


def make_node(
    name: str, gpus: int = 4, spot: bool = False, labels: Mapping[str, str] | None = None, **fields: Any
) -> Node:
    """A Ready node advertising `gpus`, labelled spot or on-demand, plus any other `labels`."""
    return Node(name, gpus, labels={**(SPOT if spot else ON_DEMAND), **(labels or {})}, **fields)


def make_demand(
    name: str,
    lo: int,
    hi: int,
    priority: int = 0,
    created: float = 0.0,
    gpus: int = 1,
    nodes: Mapping[str, int] | None = None,
    current: tuple[str, ...] = (),
) -> Demand:
    """What job `name` in namespace "ns" asks of an allocation policy: `lo` to `hi` workers of `gpus`
    GPUs each, on any of `nodes` (NODES4 unless told), already running on `current`."""
    return Demand(
        key=("ns", name),
        min=lo,
        max=hi,
        gpus_per_worker=gpus,
        eligible=frozenset(nodes if nodes is not None else NODES4),
        priority=priority,
        created=created,
        current_nodes=current,
    )


def with_writes(plan: Plan, service_accounts: Mapping[str, str] | None = None) -> Plan:
    """`plan` carrying the writes its fields call for, as the planner emits them (a test builds the
    fields by hand)."""
    return rendered(plan, service_accounts or {})


class WorkloadBuilder:
    """A Kueue Workload slice of `job` as the operator creates it, then as Kueue leaves it:
    `WorkloadBuilder(job).admitted(4).parsed()`. Conditions carry NOW as their transition time."""

    def __init__(self, job: Job, index: int = 1, workers: int | None = None) -> None:
        count = job.spec.replicas.max if workers is None else workers
        self._gpus_per_worker = job.gpus_per_worker
        self._raw = kueue.slice_body(job, index, count, None)
        metadata = self._raw["metadata"]
        metadata |= {"uid": f"uid-{metadata['name']}", "resourceVersion": "7", "generation": 1}
        metadata["creationTimestamp"] = format_time(NOW - 100 + index)
        self._raw["status"] = {}

    def _condition(self, kind: str, status: bool, reason: str, message: str = "") -> Self:
        conditions = [c for c in self._raw["status"].get("conditions", []) if c["type"] != kind]
        conditions.append(
            {
                "type": kind,
                "status": "True" if status else "False",
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(NOW),
            }
        )
        self._raw["status"]["conditions"] = conditions
        return self

    def replacing(self, other: str) -> Self:
        """A replacement slice (Kueue's workload-slice-replacement-for annotation)."""
        self._raw["metadata"]["annotations"][kueue.REPLACEMENT_ANNOTATION] = f"ns/{other}"
        self._raw["spec"]["podSets"][0].pop("minCount", None)
        return self

    def pending(
        self, message: str = "couldn't assign flavors to pod set workers: insufficient quota"
    ) -> Self:
        return self._condition("QuotaReserved", False, "Pending", message)

    def admitted(
        self, workers: int | None = None, cluster_queue: str = "team", flavor: str = "default"
    ) -> Self:
        """Kueue reserved quota for `workers` workers (its partial admission; default: the count),
        their GPUs from `flavor`."""
        count = workers or self._raw["spec"]["podSets"][0]["count"]
        assigned = {
            "name": kueue.WORKERS,
            "count": count,
            "flavors": {GPU_RESOURCE: flavor},
            "resourceUsage": {GPU_RESOURCE: str(count * self._gpus_per_worker)},
        }
        rendezvous = {"name": kueue.RENDEZVOUS, "count": 1, "flavors": {"cpu": flavor}}
        self._raw["status"]["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [assigned, rendezvous],
        }
        self._condition("QuotaReserved", True, "QuotaReserved")
        return self._condition("Admitted", True, "Admitted")

    def lowered(self, workers: int) -> Self:
        """The workers pod set's count lowered in place (a graceful shrink of an admitted slice)."""
        self._raw["spec"]["podSets"][0]["count"] = workers
        return self

    def evicted(
        self, reason: str = "Preempted", message: str = "Preempted to accommodate a workload"
    ) -> Self:
        return self._condition("Evicted", True, reason, message)

    def finished(self, reason: str = "OutOfSync") -> Self:
        """Finished: out of sync (the operator's, for a replaced slice or an ended job) or, as
        Kueue's scheduler does right before admitting a replacement, `kueue.SLICE_REPLACED`."""
        return self._condition("Finished", True, reason)

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._raw)

    def parsed(self) -> kueue.Workload:
        return kueue.parse_workload(self.obj())


def make_cluster_queue(
    name: str = "team", gpus: int = 8, policy: str = "LowerPriority"
) -> kueue_room.ClusterQueue:
    """A ClusterQueue of `gpus` GPUs as the operator parses it (Kueue's manifest, as the tiers with
    Kueue create it: `ebbflow_devtools.kueue.cluster_queue`)."""
    raw = {
        "metadata": {"name": name},
        "spec": {
            "preemption": {"withinClusterQueue": policy},
            "resourceGroups": [
                {
                    "coveredResources": [GPU_RESOURCE, "cpu"],
                    "flavors": [
                        {
                            "name": "default",
                            "resources": [
                                {"name": GPU_RESOURCE, "nominalQuota": gpus},
                                {"name": "cpu", "nominalQuota": 1000},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    return kueue_room.parse_cluster_queue(raw, GPU_RESOURCE)


def make_local_queue(
    name: str = "team", cluster_queue: str = "team", namespace: str = "ns"
) -> kueue_room.LocalQueue:
    raw = {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}}
    return kueue_room.parse_local_queue(raw)
