"""Per-job plan: from what is observed now (pods, nodes, the job's recorded status) and the allocator's
size, which pods to create and delete, which events to record and what status to write. Pure.

The job's status is the operator's durable record: `workerNodes` lists the bound workers seen in the
previous pass, so a worker that vanished without the operator deleting it was preempted (its node
deleted, a NoExecute taint, an eviction). The plan writes status before it deletes anything, so a
crash in between leaves extra pods (deleted next pass), never a miscounted preemption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ebbflow_api import contract
from ebbflow_api.models import Condition, Phase

from . import manifests
from .capacity import evicts
from .model import Job, Json, Node, Pod, format_time, parse_progress, parse_time
from .status import FAILED, PREEMPTED, READY, SCHEDULABLE, SUCCEEDED, merge_patch, set_condition

TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})

# Rescale reasons (status.lastRescale.reason, metrics label).
PREEMPTION = "Preemption"
PENDING_TIMEOUT = "PendingTimeout"
FAILURE = "WorkerFailure"
CAPACITY_FREED = "CapacityFreed"
CAPACITY_RECLAIMED = "CapacityReclaimed"
SPEC_CHANGED = "SpecChanged"  # includes the first size of a new job


@dataclass(frozen=True)
class PlannerConfig:
    pending_timeout: float = 120.0  # seconds a worker may stay unscheduled before it is withdrawn
    hold_seconds: float = 300.0  # after a withdrawal the job grows no further for this long


@dataclass(frozen=True)
class Deletion:
    name: str
    uid: str
    grace_seconds: int
    reason: str


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    job: Job
    create_workers: tuple[tuple[int, int], ...] = ()  # (index, world generation)
    delete: tuple[Deletion, ...] = ()
    create_rendezvous_pod: bool = False
    create_services: tuple[str, ...] = ()  # names of missing Services
    status_patch: Json = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    rescale_reason: str | None = None
    preemptions: int = 0
    status: Json = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """Everything the planner sees of one job besides the job itself."""

    pods: Sequence[Pod]  # every pod in the job's namespace labelled with its name
    services: frozenset[str]  # names of the job's Services that exist
    nodes: Mapping[str, Node]  # every node in the cluster, by name
    desired: int  # the allocator's size for the job
    free_gpus: int  # GPUs free on nodes the job may use (for messages)


def _lost_reason(node_name: str, nodes: Mapping[str, Node]) -> str:
    node = nodes.get(node_name)
    if node is None:
        return "NodeLost"
    if any(t.effect == "NoExecute" for t in node.taints):
        return "TaintEviction"
    return "Evicted"


def _victim_order(pod: Pod, nodes: Mapping[str, Node]) -> tuple[bool, bool, float, int]:
    """Unscheduled first, then spot before on-demand, then newest first."""
    node = nodes.get(pod.node) if pod.node else None
    spot = node.spot if node else False
    return (pod.node is not None, not spot, -pod.created, -(manifests.worker_index(pod.name) or 0))


def plan_job(job: Job, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    spec, status = job.spec, job.status
    stamp = format_time(now)
    mine = [p for p in observed.pods if p.owner_uid == job.uid]
    workers = [p for p in mine if p.role == contract.ROLE_WORKER]
    taken = {p.name for p in observed.pods}
    events: list[Event] = []
    deletions: list[Deletion] = []

    # --- classify workers ------------------------------------------------------------------------
    # Only workers recorded in status count (once): after a crash between the status write and the
    # deletions, the next pass deletes the same pods again without counting them again.
    recorded = status.worker_nodes
    present = {p.name for p in workers}
    lost = {
        name: _lost_reason(node, observed.nodes)
        for name, node in recorded.items()
        if name not in present and node
    }
    active: list[Pod] = []
    failures: list[Pod] = []  # real failures, to be deleted and replaced
    succeeded: list[Pod] = []

    def take(pod: Pod, why: str, grace: int, what: str) -> None:
        if recorded.get(pod.name) is not None and (pod.node or recorded[pod.name]):
            lost[pod.name] = why
        deletions.append(Deletion(pod.name, pod.uid, grace, what))

    for pod in workers:
        if pod.deleting:
            # The operator deletes only pods it no longer records, so a recorded one is being taken.
            if recorded.get(pod.name):
                lost[pod.name] = pod.disruption or _lost_reason(pod.node or "", observed.nodes)
        elif pod.phase == "Succeeded":
            succeeded.append(pod)
        elif pod.phase == "Failed":
            if pod.disruption or pod.exit_code in contract.PREEMPTION_EXIT_CODES:
                take(pod, pod.disruption or f"ExitCode{pod.exit_code}", 0, "preempted")
            else:
                failures.append(pod)
        elif pod.node is not None and pod.node not in observed.nodes:
            take(pod, "NodeLost", 0, "node gone")
        elif pod.node is not None and evicts(observed.nodes[pod.node], job):
            take(pod, "TaintEviction", spec.leave_grace_seconds, "being evicted")
        else:
            active.append(pod)
    counted_failures = [p for p in failures if p.name in recorded]

    preemptions = (status.preemptions or 0) + len(lost)
    restarts = status.restarts or 0
    conditions: tuple[Condition, ...] = tuple(status.conditions)
    phase = status.phase

    def condition(type_: str, ok: bool, why: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, ok, why, message, job.generation, stamp)

    if lost:
        names = ", ".join(f"{name} ({why})" for name, why in sorted(lost.items()))
        events.append(Event("Warning", PREEMPTED, f"lost {len(lost)} worker(s): {names}"))
        condition(
            PREEMPTED, True, sorted(lost.values())[0], f"lost {names}; preemptions so far: {preemptions}"
        )

    # --- the end: success, failure, clean-up -------------------------------------------------------
    terminal = phase in TERMINAL_PHASES
    if not terminal and failures:
        restarts += len(counted_failures)
        details = ", ".join(f"{p.name} exited {p.exit_code}" for p in failures)
        invalid = [p for p in failures if p.exit_code == contract.EXIT_INVALID_CONFIG]
        if counted_failures:
            events.append(Event("Warning", "WorkerFailed", details))
        if invalid or restarts > spec.max_restarts:
            why = "InvalidConfig" if invalid else "TooManyFailures"
            message = (
                f"{invalid[0].name} exited {contract.EXIT_INVALID_CONFIG} (invalid trainer configuration)"
                if invalid
                else f"{restarts} worker failures exceed spec.maxRestarts={spec.max_restarts}: {details}"
            )
            phase, terminal = Phase.FAILED, True
            condition(FAILED, True, why, message)
            events.append(Event("Warning", "Failed", message))
        else:  # replaced below, under a new name: the failed pod stays until deleted
            deletions += [Deletion(p.name, p.uid, 0, "failed") for p in failures]
    if not terminal and succeeded and not active:
        phase, terminal = Phase.SUCCEEDED, True
        message = f"{len(succeeded)} worker(s) finished training"
        condition(SUCCEEDED, True, "WorkersSucceeded", message)
        events.append(Event("Normal", "Succeeded", message))
    completing = bool(succeeded) and not terminal

    # --- pending timeout -----------------------------------------------------------------------------
    hold_replicas = hold_cap(job, now)
    hold_until = parse_time(status.hold_until) if hold_replicas is not None else None
    stuck = [p for p in active if p.node is None and now - p.created > config.pending_timeout]
    if stuck and not terminal:
        active = [p for p in active if p not in stuck]
        deletions += [Deletion(p.name, p.uid, 0, "pending timeout") for p in stuck]
        hold_replicas, hold_until = sum(p.node is not None for p in active), now + config.hold_seconds
        message = (
            f"withdrew {len(stuck)} worker(s) unscheduled for over {config.pending_timeout:.0f}s "
            f"({', '.join(p.name for p in stuck)}); at most {hold_replicas} until {format_time(hold_until)}"
        )
        events.append(Event("Warning", "WorkersWithdrawn", message))

    # --- target size and the pods to add or remove ------------------------------------------------------
    if terminal:
        target = 0
    elif completing:
        target = len(active)
    else:
        target = observed.desired
        if hold_replicas is not None:
            target = min(target, hold_replicas)
        if target < spec.replicas.min:
            target = 0
    victims: list[Pod] = []
    cleaning = terminal and spec.clean_pod_policy != "None"
    if terminal:
        keep_finished = spec.clean_pod_policy != "All"
        deleting = {d.name for d in deletions}
        doomed = [p for p in workers if not p.deleting and not (keep_finished and p.finished)]
        deletions += [
            Deletion(p.name, p.uid, spec.leave_grace_seconds, "job finished")
            for p in (doomed if cleaning else [])
            if p.name not in deleting
        ]
        active = []
    elif len(active) > target:
        victims = sorted(active, key=lambda p: _victim_order(p, observed.nodes))[: len(active) - target]
        deletions += [
            Deletion(p.name, p.uid, spec.leave_grace_seconds if p.node else 0, "scale down") for p in victims
        ]
        active = [p for p in active if p not in victims]
    missing = max(0, target - len(active))
    generation = status.world_generation or 0
    if not terminal and (lost or counted_failures or stuck or victims or missing):
        generation += 1
    creations: list[tuple[int, int]] = []
    index = 0
    while len(creations) < missing:
        if manifests.worker_name(job.name, index) not in taken:
            creations.append((index, generation))
        index += 1

    # --- rendezvous pod and Services -------------------------------------------------------------------
    rendezvous = [p for p in mine if p.role == contract.ROLE_RENDEZVOUS and not p.deleting]
    rdzv_name = manifests.rendezvous_name(job.name)
    create_rendezvous = False
    if terminal:
        if cleaning:
            deletions += [Deletion(p.name, p.uid, 0, "job finished") for p in rendezvous]
    else:
        # Its node gone, a pod is only removed by PodGC after a long quarantine: replace it now.
        ended = [p for p in rendezvous if p.finished or (p.node is not None and p.node not in observed.nodes)]
        deletions += [Deletion(p.name, p.uid, 0, "rendezvous ended") for p in ended]
        create_rendezvous = not rendezvous and rdzv_name not in taken
    services = tuple(
        name
        for name in (rdzv_name, manifests.headless_service_name(job.name))
        if name not in observed.services and not terminal
    )

    # --- status --------------------------------------------------------------------------------------
    replicas = len(active) + len(creations)
    ready = sum(p.ready and p.phase == "Running" for p in active)
    if not terminal:
        if target == 0:
            if hold_replicas is not None and hold_replicas < spec.replicas.min:
                why = "PendingTimeout"
                message = (
                    f"only {hold_replicas} of min {spec.replicas.min} workers were scheduled within "
                    f"{config.pending_timeout:.0f}s; retrying after {format_time(hold_until or now)}"
                )
            else:
                why = "InsufficientGPUs"
                message = (
                    f"needs min {spec.replicas.min} workers x {job.gpus_per_worker} GPU(s) on nodes "
                    f"it may use; {observed.free_gpus} GPU(s) free there for it"
                )
            condition(SCHEDULABLE, False, why, message)
        else:
            condition(
                SCHEDULABLE,
                True,
                "Allocated",
                f"{target} worker(s) allocated in [{spec.replicas.min}, {spec.replicas.max}]",
            )
        enough = ready >= spec.replicas.min
        condition(
            READY,
            enough,
            "MinimumAvailable" if enough else "WaitingForWorkers",
            f"{ready} of {target} desired worker(s) ready (min {spec.replicas.min})",
        )
        if not enough:
            phase = Phase.PENDING
        elif ready == target and replicas == target and not creations and not deletions:
            phase = Phase.RUNNING
        else:
            phase = Phase.SCALING
    else:
        condition(READY, False, str(phase), f"the job {str(phase).lower()}")
    reason: str | None = None
    desired_before = status.desired_replicas or 0
    if target != desired_before and not terminal:
        if lost:
            reason = PREEMPTION
        elif stuck:
            reason = PENDING_TIMEOUT
        elif failures:
            reason = FAILURE
        elif job.generation != status.observed_generation:
            reason = SPEC_CHANGED
        else:
            reason = CAPACITY_FREED if target > desired_before else CAPACITY_RECLAIMED
        events.append(Event("Normal", "Rescaled", f"{desired_before} -> {target} workers ({reason})"))

    new_status: Json = {
        "phase": phase,
        "conditions": [c.to_json() for c in conditions],
        "observedGeneration": job.generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "desiredReplicas": target,
        "selector": manifests.worker_selector(job.name),
        "worldGeneration": generation,
        "preemptions": preemptions,
        "restarts": restarts,
        "workerNodes": {
            **{p.name: p.node or "" for p in active},
            **{manifests.worker_name(job.name, i): "" for i, _ in creations},
        },
    }
    recorded_status = status.to_json()
    for key in ("lastRescale", "progress", "startTime", "completionTime"):
        if key in recorded_status:
            new_status[key] = recorded_status[key]
    if reason is not None:
        new_status["lastRescale"] = {
            "time": stamp,
            "from": desired_before,
            "to": target,
            "reason": reason,
        }
    if hold_replicas is not None and hold_until is not None:
        new_status["holdReplicas"] = hold_replicas
        new_status["holdUntil"] = format_time(hold_until)
    if phase == "Running" and "startTime" not in new_status:
        new_status["startTime"] = stamp
    if terminal and "completionTime" not in new_status:
        new_status["completionTime"] = stamp
    reports = [r for p in workers if (r := parse_progress(p.progress))]
    if reports:
        new_status["progress"] = max(reports, key=lambda r: str(r.get("time", "")))

    return Plan(
        job=job,
        create_workers=tuple(creations),
        delete=tuple(deletions),
        create_rendezvous_pod=create_rendezvous,
        create_services=services,
        status_patch=merge_patch(recorded_status, new_status),
        events=tuple(events),
        rescale_reason=reason,
        preemptions=len(lost),
        status=new_status,
    )


def hold_cap(job: Job, now: float) -> int | None:
    """The pending-timeout cap on the job's size, if one is in force."""
    status = job.status
    until = parse_time(status.hold_until)
    if status.hold_replicas is not None and until and until > now:
        return status.hold_replicas
    return None
