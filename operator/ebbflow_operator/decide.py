"""One whole pass's decision, pure: observed state, spec and now in, every job's plan out.

`decide` takes what the cache holds (nodes, pods, jobs and the jobs' Services), the operator's
configuration and the time, and returns the plans the reconcile loop applies. It computes capacity,
then one allocation across all jobs, then each job's plan (planner.py).

Invariants:
- Pure: no Kubernetes client, no kopf, no cache, no I/O, no clock; the same inputs give the same
  plans, so a pass can be replayed in a test from plain data.
- Nothing is carried between calls: whatever a decision depends on is in the inputs (the jobs'
  recorded status included), which is what lets a restarted operator pick up where it stopped.
- Finished jobs, and jobs whose workers have started to finish, are planned but get no allocation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ebbflow_api import contract

from .allocator import Demand, Policy, allocate, most_used_first
from .capacity import cluster_capacity, eligible_nodes, matches_selector
from .model import Job, JobKey, Node, Pod
from .planner import TERMINAL_PHASES, Observed, Plan, PlannerConfig, hold_cap, plan_job


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    node_selector: Mapping[str, str] = field(default_factory=dict)  # only these nodes are allocated
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    resync_interval: float = 30.0  # a pass at least this often
    relist_interval: float = 60.0  # full lists at least this often (the cache is fed by watches)
    debounce: float = 0.05  # gather a burst of watch events into one pass
    write_concurrency: int = 8
    # ServiceAccount of workers whose template names none, by namespace ("" = every namespace).
    trainer_service_accounts: Mapping[str, str] = field(default_factory=dict)
    policy: str = "fair"  # who gets a freed GPU: policies.POLICIES


@dataclass(frozen=True)
class PassResult:
    plans: tuple[Plan, ...]
    total_gpus: int
    free_gpus: int


def decide(
    nodes: list[Node],
    pods: list[Pod],
    jobs: list[Job],
    services: Mapping[JobKey, frozenset[str]],
    network_policies: Mapping[JobKey, frozenset[str]],
    now: float,
    config: OperatorConfig,
    policy: Policy,
) -> PassResult:
    """Observed state in, plans out: capacity, then allocation across jobs, then each job's plan."""
    by_name = {node.name: node for node in nodes}
    selected = [node for node in nodes if matches_selector(node, config.node_selector)]
    job_pods: dict[JobKey, list[Pod]] = defaultdict(list)
    for pod in pods:
        if pod.job is not None:
            job_pods[(pod.namespace, pod.job)].append(pod)
    eligible = _eligible(selected, jobs)
    demands: list[Demand] = []
    movable: list[Pod] = []
    for job in jobs:
        workers = [p for p in job_pods[job.key] if p.role == contract.ROLE_WORKER]
        if _frozen(job, workers):
            continue
        held = [p for p in workers if p.owner_uid == job.uid and p.holds_gpus and p.node in by_name]
        # Workers this job is already giving up are about to free their GPUs: count them as the
        # job's to hand out, or the next pass sees a transient shortage and takes a lower-priority
        # job below its minimum (to 0) while its shrink is still in flight.
        movable += held
        demands.append(_demand(job, held, eligible[job.key], now))
    capacity = cluster_capacity(selected, pods, movable)
    allocation = allocate(policy, demands, capacity.free)
    plans = []
    # Free GPUs per set of eligible nodes: jobs of one shape share the set, so each is summed once
    # (summing per job costs jobs x nodes, most of a pass at 1,000 jobs on 5,000 nodes).
    free_in: dict[frozenset[str], int] = {}
    for job in jobs:
        nodes_of_job = eligible[job.key]
        if nodes_of_job not in free_in:
            free_in[nodes_of_job] = sum(capacity.free.get(name, 0) for name in nodes_of_job)
        observed = Observed(
            pods=job_pods[job.key],
            services=services.get(job.key, frozenset()),
            nodes=by_name,
            desired=allocation.counts.get(job.key, 0),
            free_gpus=free_in[nodes_of_job],
            network_policies=network_policies.get(job.key, frozenset()),
            global_batch=allocation.global_batch.get(job.key),
            moves=allocation.moves.get(job.key, ()),
        )
        plans.append(plan_job(job, observed, now, config.planner))
    used = sum(p.gpus for p in pods if p.holds_gpus and p.node in capacity.free)
    return PassResult(tuple(plans), capacity.total, max(0, capacity.total - used))


def _frozen(job: Job, workers: list[Pod]) -> bool:
    """Finished jobs and jobs whose workers have started finishing get no allocation. A deleted
    worker that exited 0 handed its state over and left (a SIGTERM, the operator's or a user's):
    its Succeeded pod does not mean the training finished."""
    return job.status.phase in TERMINAL_PHASES or any(
        p.phase == "Succeeded" and not p.deleting and p.owner_uid == job.uid for p in workers
    )


def _eligible(selected: Sequence[Node], jobs: Sequence[Job]) -> dict[JobKey, frozenset[str]]:
    """The nodes each job may use; jobs with the same selector and tolerations share the answer
    (thousands of jobs usually come in a handful of shapes)."""
    shapes: dict[object, frozenset[str]] = {}
    eligible: dict[JobKey, frozenset[str]] = {}
    for job in jobs:
        shape = (tuple(sorted(job.node_selector.items())), job.tolerations)
        if shape not in shapes:
            shapes[shape] = eligible_nodes(selected, job)
        eligible[job.key] = shapes[shape]
    return eligible


def _demand(job: Job, held: Sequence[Pod], eligible: frozenset[str], now: float) -> Demand:
    """What the job asks of the allocator: its bounds (capped by a pending-timeout hold) and the
    nodes its running workers sit on (so a stable job keeps its place)."""
    cap = hold_cap(job, now)
    replicas = job.spec.replicas
    return Demand(
        key=job.key,
        min=replicas.min,
        max=replicas.max if cap is None else min(cap, replicas.max),
        gpus_per_worker=job.gpus_per_worker,
        eligible=eligible,
        priority=job.spec.priority,
        created=job.created,
        current_nodes=most_used_first([p.node for p in held if p.node and not p.deleting]),
    )
