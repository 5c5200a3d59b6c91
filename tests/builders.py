"""Test-object builders shared by every tier (Kueue style): jobs, pods and nodes as the decision
layer sees them, and the demands its allocation policies weigh, built from a few arguments with the
rest defaulted to something valid.

Jobs go through the real parsing path (`JobBuilder` manifest -> `parse_job`), so a test can never
hold a job the API server would not accept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ebbflow_api import contract
from ebbflow_api.builders import JobBuilder
from ebbflow_operator.allocator import Demand
from ebbflow_operator.model import Job, Node, Pod, format_time, parse_job

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
