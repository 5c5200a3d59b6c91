"""Per-job plan: from what is observed now (pods, nodes, the job's recorded status) and the allocator's
size, which pods to create and delete, which events to record and what status to write. Pure.

`plan_job` runs small pure steps in order (listed there); `readiness` holds the job's lifecycle.
The job's status is the operator's durable record: `workerNodes` lists the bound workers seen in the
previous pass, so a worker that vanished without the operator deleting it was preempted.

Invariants: the plan writes status before it deletes anything, so a crash in between leaves extra
pods (deleted next pass), never a miscounted preemption; a worker is counted (as a preemption or a
restart) only while the status records it, and the status written with the count drops it, so a
repeated pass never counts it twice. The world generation moves exactly when the set of workers
changes. An ended job gets no new pods or Services; once a worker has succeeded the job neither
grows nor replaces workers.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum

from ebbflow_api import contract
from ebbflow_api.models import CleanPodPolicy, Phase

from . import manifests
from .capacity import evicts
from .gpu_memory import job_budget_mib
from .model import Job, Json, Node, Pod, format_time, parse_progress, parse_time
from .status import (
    FAILED,
    PREEMPTED,
    READY,
    SCHEDULABLE,
    SUCCEEDED,
    ConditionUpdate,
    merge_patch,
    set_conditions,
)

TERMINAL_PHASES = frozenset(phase for phase in Phase if phase.terminal)


class RescaleReason(StrEnum):
    """Why the job's size changed (status.lastRescale.reason, a metrics label)."""

    PREEMPTION = "Preemption"
    PENDING_TIMEOUT = "PendingTimeout"
    FAILURE = "WorkerFailure"
    CAPACITY_FREED = "CapacityFreed"
    CAPACITY_RECLAIMED = "CapacityReclaimed"
    SPEC_CHANGED = "SpecChanged"  # includes the first size of a new job


@dataclass(frozen=True)
class PlannerConfig:
    pending_timeout: float = 120.0  # seconds the scheduler may refuse a worker before it is withdrawn
    hold_seconds: float = 300.0  # after a withdrawal the job grows no further for this long


@dataclass(frozen=True)
class Deletion:
    name: str
    uid: str
    grace_seconds: int
    reason: str
    # The pod runs nowhere (its node is gone, or it has exited): deleting it removes an API object,
    # not a running process, so it does not keep the job from being Running (a resize lands in one pass).
    runs_nowhere: bool = False


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class BatchUpdate:
    """A worker whose global-batch-size annotation must become `value`."""

    name: str
    uid: str
    value: int


@dataclass(frozen=True)
class BudgetUpdate:
    """A worker whose memory-budget annotation must become `value` (MiB)."""

    name: str
    uid: str
    value: int


@dataclass(frozen=True)
class Plan:
    job: Job
    create_workers: tuple[tuple[int, int], ...] = ()  # (index, world generation)
    pin_node: str | None = None  # the node every new worker must run on (a move onto one node)
    global_batch: int | None = None  # B for new workers (spec.maxGlobalBatchSize only)
    update_global_batch: tuple[BatchUpdate, ...] = ()
    memory_budget: int | None = None  # MiB for new workers (spec.bandLimit only; None: not known)
    update_memory_budget: tuple[BudgetUpdate, ...] = ()
    delete: tuple[Deletion, ...] = ()
    create_rendezvous_pod: bool = False
    create_service: bool = False
    create_network_policy: bool = False
    status_patch: Json = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    rescale_reason: RescaleReason | None = None
    preemptions: int = 0
    status: Json = field(default_factory=dict)

    @property
    def has_work(self) -> bool:
        """Whether applying the plan writes anything (most passes leave most jobs alone)."""
        return self.writes > 0

    @property
    def writes(self) -> int:
        """The API writes applying the plan takes (events included)."""
        return (
            bool(self.status_patch)
            + len(self.delete)
            + len(self.create_workers)
            + self.create_rendezvous_pod
            + self.create_service
            + self.create_network_policy
            + len(self.update_global_batch)
            + len(self.update_memory_budget)
            + len(self.events)
        )

    def summary(self) -> str:
        """The plan's writes in a line, for the operator's debug log: which fields of the status
        change and what is deleted (and why) or created, to tell why a job took another pass."""
        parts = [f"status {','.join(sorted(self.status_patch))}"] if self.status_patch else []
        parts += [f"delete {d.name} ({d.reason})" for d in self.delete]
        if self.create_workers:
            parts.append(f"create {len(self.create_workers)} worker(s)")
        children = ("rendezvous pod", "service", "network policy")
        wanted = (self.create_rendezvous_pod, self.create_service, self.create_network_policy)
        parts += [f"create {child}" for child, want in zip(children, wanted, strict=True) if want]
        parts += [f"event {e.reason}" for e in self.events]
        return "; ".join(parts) or "nothing"


@dataclass(frozen=True)
class Observed:
    """Everything the planner sees of one job besides the job itself."""

    pods: Sequence[Pod]  # every pod in the job's namespace labelled with its name
    services: frozenset[str]  # names of the job's Services that exist
    nodes: Mapping[str, Node]  # every node in the cluster, by name
    desired: int  # the allocator's size for the job
    free_gpus: int  # GPUs free on nodes the job may use (for messages)
    network_policies: frozenset[str] = frozenset()  # names of the job's NetworkPolicies that exist
    global_batch: int | None = None  # the policy's B for the job (None: the policy keeps B)
    moves: tuple[str, ...] = ()  # the policy's node once per new worker there (Allocation.moves)


@dataclass(frozen=True)
class Report:
    """What a step tells people: events to record and conditions to set, in the order decided."""

    events: tuple[Event, ...] = ()
    conditions: tuple[ConditionUpdate, ...] = ()

    def __add__(self, other: Report) -> Report:
        return Report(self.events + other.events, self.conditions + other.conditions)


@dataclass(frozen=True)
class Hold:
    """After a pending timeout the job grows no bigger than `replicas` until `until` (POSIX seconds)."""

    replicas: int
    until: float


@dataclass(frozen=True)
class Workers:
    """The job's worker pods sorted by what happens to them this pass."""

    active: tuple[Pod, ...] = ()  # running, or waiting to be scheduled
    lost: Mapping[str, str] = field(default_factory=dict)  # preempted recorded worker -> why
    failures: tuple[Pod, ...] = ()  # real failures: replaced, or they fail the job
    counted_failures: tuple[Pod, ...] = ()  # the failures the status still records: new restarts
    succeeded: tuple[Pod, ...] = ()
    taken: tuple[Deletion, ...] = ()  # preempted or being evicted: deleted now


@dataclass(frozen=True)
class Ending:
    """What the workers' exits mean for the job; `phase` is set (Succeeded or Failed) once it ended."""

    phase: Phase | None = None
    restarts: int = 0
    delete: tuple[Deletion, ...] = ()  # failed workers to replace, or the ended job's clean-up
    report: Report = field(default_factory=Report)

    @property
    def ended(self) -> bool:
        return self.phase is not None


@dataclass(frozen=True)
class Timeout:
    """The workers left after the pending timeout, those it withdrew, and the hold in force."""

    active: tuple[Pod, ...] = ()
    stuck: tuple[Pod, ...] = ()  # unscheduled for longer than the pending timeout
    hold: Hold | None = None
    report: Report = field(default_factory=Report)

    @property
    def delete(self) -> tuple[Deletion, ...]:
        return tuple(Deletion(p.name, p.uid, 0, "pending timeout") for p in self.stuck)


@dataclass(frozen=True)
class Sizing:
    """The workers after this pass: who stays, who goes, who is added, and in which world."""

    target: int
    active: tuple[Pod, ...] = ()  # the workers that stay
    delete: tuple[Deletion, ...] = ()  # the scale-down's victims
    create: tuple[tuple[int, int], ...] = ()  # (index, world generation) of new workers
    generation: int = 0
    pin_node: str | None = None  # set when the job moves onto one node: where the new workers must run


@dataclass(frozen=True)
class Support:
    """What happens to the job's rendezvous pod, Service and NetworkPolicy."""

    delete: tuple[Deletion, ...] = ()
    create_rendezvous_pod: bool = False
    create_service: bool = False
    create_network_policy: bool = False


@dataclass(frozen=True)
class Batch:
    """The global batch the workers should train with, and the workers still to be told."""

    value: int | None = None  # None: the job's spec does not let B change
    update: tuple[BatchUpdate, ...] = ()
    report: Report = field(default_factory=Report)


@dataclass(frozen=True)
class Budget:
    """The GPU memory each worker may use, and the workers still to be told."""

    value: int | None = None  # MiB; None: not spec.bandLimit, or nothing says how much there is
    update: tuple[BudgetUpdate, ...] = ()
    report: Report = field(default_factory=Report)


@dataclass(frozen=True)
class StatusUpdate:
    """The status to write, the rescale it records (if any) and what the pass tells people."""

    status: Json
    rescale_reason: RescaleReason | None = None
    report: Report = field(default_factory=Report)


def plan_job(job: Job, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    """The steps in order; each decides one thing from the observation and the small frozen values the
    steps before it returned:

        classify                 workers -> active, lost (and why), failed, succeeded, being taken
        end_of_job               exits -> Failed (a fatal exit code's reason, TooManyFailures) or
                                 Succeeded; clean-up
        pending_timeout          workers the scheduler refused for too long -> withdrawn, and a hold
        target_size              allocator's size, hold, spec.replicas.min -> how many workers to have
        resize                   the scale-down's `victims` or the policy's `movers`, `new_workers`,
                                 the world generation
        rendezvous_and_services  the rendezvous pod (replaced when it ends), the job's Service and
                                 NetworkPolicy
        global_batch             (spec.maxGlobalBatchSize only) the policy's B -> the workers'
                                 annotations to change and status.globalBatchSize
        memory_budget            (spec.bandLimit only) the job's GPU memory budget (gpu_memory.py) ->
                                 the workers' annotations to change
        job_status               `readiness` (phase, Ready), `schedulable`, `rescale_reason`, `history`
    """
    workers = children(job, observed.pods, contract.ROLE_WORKER)
    seen = classify(workers, job.status.worker_nodes, observed.nodes, job)
    ending = end_of_job(job, workers, seen)
    ended = ending.ended
    timeout = pending_timeout(job, seen.active, ended, now, config)
    minimum, finishing = job.spec.replicas.min, bool(seen.succeeded)
    target = target_size(observed.desired, minimum, timeout.hold, len(timeout.active), ended, finishing)
    disrupted = bool(seen.lost or seen.counted_failures or timeout.stuck) and not ended
    sizing = resize(job, () if ended else timeout.active, target, disrupted, observed)
    support = rendezvous_and_services(job, observed, ended)
    delete = (*seen.taken, *ending.delete, *timeout.delete, *sizing.delete, *support.delete)
    batch = global_batch(job, observed.global_batch, sizing.active, ended)
    budget = memory_budget(job, sizing.active, observed.nodes, ended)
    settled = all(d.runs_nowhere for d in delete) and not sizing.create
    update = job_status(job, observed, seen, ending, timeout, sizing, settled, now, config)
    if batch.value is not None:
        update = replace(update, status={**update.status, "globalBatchSize": batch.value})
    return Plan(
        job=job,
        create_workers=sizing.create,
        pin_node=sizing.pin_node,
        global_batch=batch.value,
        update_global_batch=batch.update,
        memory_budget=budget.value,
        update_memory_budget=budget.update,
        delete=delete,
        create_rendezvous_pod=support.create_rendezvous_pod,
        create_service=support.create_service,
        create_network_policy=support.create_network_policy,
        status_patch=merge_patch(job.status.to_json(), update.status),
        events=update.report.events + batch.report.events + budget.report.events,
        rescale_reason=update.rescale_reason,
        preemptions=len(seen.lost),
        status=update.status,
    )


def children(job: Job, pods: Sequence[Pod], role: str) -> list[Pod]:
    """The job's own pods (by controller owner reference) of one role."""
    return [p for p in pods if p.owner_uid == job.uid and p.role == role]


def classify(
    workers: Sequence[Pod], recorded: Mapping[str, str], nodes: Mapping[str, Node], job: Job
) -> Workers:
    """Sorts the workers. Only workers `recorded` in the status count as lost (once: after a crash
    between the status write and the deletions, the next pass deletes them again, uncounted)."""
    present = {p.name for p in workers}
    lost = {name: lost_reason(node, nodes) for name, node in recorded.items() if name not in present and node}
    active: list[Pod] = []
    failures: list[Pod] = []
    succeeded: list[Pod] = []
    taken: list[Deletion] = []
    for pod in workers:
        if pod.deleting:
            # The operator deletes only pods it no longer records, so a recorded one is being taken.
            if recorded.get(pod.name):
                lost[pod.name] = pod.disruption or lost_reason(pod.node or "", nodes)
        elif pod.phase == "Succeeded":
            succeeded.append(pod)
        elif (taking := _preemption(pod, nodes, job)) is not None:
            why, deletion = taking
            if pod.name in recorded and (pod.node or recorded[pod.name]):
                lost[pod.name] = why
            taken.append(deletion)
        elif pod.phase == "Failed":
            failures.append(pod)
        else:
            active.append(pod)
    counted = tuple(p for p in failures if p.name in recorded)
    return Workers(tuple(active), lost, tuple(failures), counted, tuple(succeeded), tuple(taken))


def lost_reason(node_name: str, nodes: Mapping[str, Node]) -> str:
    """Why a worker on `node_name` vanished, as far as the node tells."""
    node = nodes.get(node_name)
    if node is None:
        return "NodeLost"
    if any(t.effect == "NoExecute" for t in node.taints):
        return "TaintEviction"
    return "Evicted"


def _preemption(pod: Pod, nodes: Mapping[str, Node], job: Job) -> tuple[str, Deletion] | None:
    """Why a worker is being taken from the job, and its deletion; None when it is not. A worker
    being evicted by a NoExecute taint gets its leave grace to hand its state over."""
    if pod.phase == "Failed":
        if pod.disruption or pod.exit_code in contract.PREEMPTION_EXIT_CODES:
            why = pod.disruption or f"ExitCode{pod.exit_code}"
            return why, Deletion(pod.name, pod.uid, 0, "preempted", runs_nowhere=True)
        return None
    if pod.node is not None and pod.node not in nodes:
        return "NodeLost", Deletion(pod.name, pod.uid, 0, "node gone", runs_nowhere=True)
    if pod.node is not None and evicts(nodes[pod.node], job):
        grace = job.spec.leave_grace_seconds
        return "TaintEviction", Deletion(pod.name, pod.uid, grace, "being evicted")
    return None


def report_losses(lost: Mapping[str, str], preemptions: int) -> Report:
    """The Preempted condition and a warning naming each lost worker; `preemptions` is the new total."""
    if not lost:
        return Report()
    names = ", ".join(f"{name} ({why})" for name, why in sorted(lost.items()))
    message = f"lost {names}; preemptions so far: {preemptions}"
    return Report(
        (Event("Warning", PREEMPTED, f"lost {len(lost)} worker(s): {names}"),),
        (ConditionUpdate(PREEMPTED, True, sorted(lost.values())[0], message),),
    )


def end_of_job(job: Job, workers: Sequence[Pod], seen: Workers) -> Ending:
    """A final phase stays; otherwise real failures may fail the job, and a succeeded worker with no
    active one left succeeds it. An ended job's pods are then cleaned up."""
    phase = job.status.phase
    if phase is not None and phase.terminal:
        ending = Ending(phase, job.status.restarts or 0)
    else:
        ending = _succeeded(seen, _failed(job, seen))
    if not ending.ended:
        return ending
    done = {d.name for d in (*seen.taken, *ending.delete)}
    return replace(ending, delete=ending.delete + clean_up(job, workers, done))


def _failed(job: Job, seen: Workers) -> Ending:
    """Failed workers are replaced until one exits with a code no restart can cure (it would fail
    the same way again) or the failures exceed spec.maxRestarts; then the job fails (the failed pods
    stay for their logs). Every counted failure, a fatal one too, adds to status.restarts."""
    spec = job.spec
    restarts = (job.status.restarts or 0) + len(seen.counted_failures)
    if not seen.failures:
        return Ending(restarts=restarts)
    details = ", ".join(f"{p.name} exited {p.exit_code}" for p in seen.failures)
    noted = (Event("Warning", "WorkerFailed", details),) if seen.counted_failures else ()
    fatal = fatal_exit(seen.failures)
    if fatal is None and restarts <= spec.max_restarts:
        replaced = tuple(Deletion(p.name, p.uid, 0, "failed") for p in seen.failures)
        return Ending(restarts=restarts, delete=replaced, report=Report(noted))
    why, message = fatal or (
        "TooManyFailures",
        f"{restarts} worker failures exceed spec.maxRestarts={spec.max_restarts}: {details}",
    )
    report = Report(
        (*noted, Event("Warning", "Failed", message)), (ConditionUpdate(FAILED, True, why, message),)
    )
    return Ending(Phase.FAILED, restarts, report=report)


def fatal_exit(failures: Sequence[Pod]) -> tuple[str, str] | None:
    """The Failed reason and message of the first worker that exited with a code no restart can cure
    (`contract.FATAL_EXIT_REASONS`), quoting the trainer's termination message; None if none did."""
    for pod in failures:
        reason = None if pod.exit_code is None else contract.FATAL_EXIT_REASONS.get(pod.exit_code)
        if reason is not None:
            message = f"{pod.name} exited {pod.exit_code} ({reason})"
            return reason, f"{message}: {pod.termination_message}" if pod.termination_message else message
    return None


def _succeeded(seen: Workers, ending: Ending) -> Ending:
    """Workers finish together: once one has succeeded and none is active, the job has succeeded."""
    if ending.ended or not seen.succeeded or seen.active:
        return ending
    message = f"{len(seen.succeeded)} worker(s) finished training"
    report = Report(
        (Event("Normal", "Succeeded", message),),
        (ConditionUpdate(SUCCEEDED, True, "WorkersSucceeded", message),),
    )
    return replace(ending, phase=Phase.SUCCEEDED, report=ending.report + report)


def clean_up(job: Job, workers: Sequence[Pod], done: Set[str]) -> tuple[Deletion, ...]:
    """The workers an ended job deletes by spec.cleanPodPolicy: unfinished ones (Running; finished
    ones stay for their logs), every one (All) or none (None). Pods in `done` are already going."""
    policy = job.spec.clean_pod_policy
    if policy == CleanPodPolicy.NONE:
        return ()
    keep_finished = policy != CleanPodPolicy.ALL
    return tuple(
        Deletion(p.name, p.uid, job.spec.leave_grace_seconds, "job finished")
        for p in workers
        if not p.deleting and not (keep_finished and p.finished) and p.name not in done
    )


def pending_timeout(
    job: Job, active: Sequence[Pod], ended: bool, now: float, config: PlannerConfig
) -> Timeout:
    """Withdraws workers the scheduler has refused for longer than the pending timeout and holds the
    job at the size it did get, so the allocator stops offering GPUs the scheduler refuses (e.g. for
    CPU). A worker still waiting for the scheduler's first attempt is not stuck: at thousands of new
    pods the queue alone can outlast the timeout, and withdrawing them made jobs shrink and regrow."""
    hold = current_hold(job, now)
    limit = config.pending_timeout
    stuck = (
        ()
        if ended
        else tuple(
            p
            for p in active
            if p.node is None and p.refused_since is not None and now - p.refused_since > limit
        )
    )
    if not stuck:
        return Timeout(tuple(active), hold=hold)
    staying = tuple(p for p in active if p not in stuck)
    hold = Hold(sum(p.node is not None for p in staying), now + config.hold_seconds)
    message = (
        f"withdrew {len(stuck)} worker(s) the scheduler refused for over {config.pending_timeout:.0f}s "
        f"({', '.join(p.name for p in stuck)}); at most {hold.replicas} until {format_time(hold.until)}"
    )
    return Timeout(staying, stuck, hold, Report((Event("Warning", "WorkersWithdrawn", message),)))


def current_hold(job: Job, now: float) -> Hold | None:
    """The hold a previous pending timeout recorded, while it is in force."""
    status = job.status
    until = parse_time(status.hold_until)
    if status.hold_replicas is not None and until and until > now:
        return Hold(status.hold_replicas, until)
    return None


def hold_cap(job: Job, now: float) -> int | None:
    """The pending-timeout cap on the job's size, if one is in force (for the allocator)."""
    hold = current_hold(job, now)
    return hold.replicas if hold is not None else None


def target_size(
    desired: int, minimum: int, hold: Hold | None, active: int, ended: bool, finishing: bool
) -> int:
    """How many workers the job should have: none once it ended; the `active` ones while its workers
    are finishing (it neither grows nor replaces); else the allocator's size capped by a hold, or
    none below `minimum` (a job cannot train with fewer)."""
    if ended:
        return 0
    if finishing:
        return active
    target = desired if hold is None else min(desired, hold.replicas)
    return target if target >= minimum else 0


def victims(active: Sequence[Pod], count: int, nodes: Mapping[str, Node]) -> list[Pod]:
    """The `count` workers a scale-down removes, one at a time: unscheduled ones first (they hold
    nothing), then one on the node now holding fewest of the job's workers (the rest stay together:
    fewer nodes, less cross-node sync; the allocator keeps workers in the same spirit,
    `allocator.most_used_first`), then spot before on-demand (likely taken soon anyway), then the
    newest, then the highest index."""
    on_node = Counter(p.node for p in active if p.node)

    def order(pod: Pod) -> tuple[bool, int, bool, float, int]:
        node = nodes.get(pod.node) if pod.node else None
        spot = node.spot if node else False
        together = on_node[pod.node] if pod.node else 0
        return (
            pod.node is not None,
            together,
            not spot,
            -pod.created,
            -(manifests.worker_index(pod.name) or 0),
        )

    remaining, chosen = list(active), []
    for _ in range(min(max(0, count), len(remaining))):
        victim = min(remaining, key=order)
        remaining.remove(victim)
        chosen.append(victim)
        if victim.node:
            on_node[victim.node] -= 1
    return chosen


def resize(job: Job, active: Sequence[Pod], target: int, disrupted: bool, observed: Observed) -> Sizing:
    """Brings `active` to `target`: deletes the victims (bound ones get their leave grace) or adds new
    workers; or, when the policy moves the job onto one node, deletes its workers elsewhere
    (`movers`) and adds new ones pinned there. A new world generation starts when the set of
    workers changes (`disrupted`: it already did this pass), so that every worker of one world
    carries the same number."""
    moving = movers(active, target, disrupted, observed.moves)
    chosen = moving or victims(active, len(active) - target, observed.nodes)
    why = "move onto one node" if moving else "scale down"
    staying = tuple(p for p in active if p not in chosen)
    missing = max(0, target - len(staying))
    generation = (job.status.world_generation or 0) + int(disrupted or bool(chosen) or missing > 0)
    grace = job.spec.leave_grace_seconds
    return Sizing(
        target=target,
        active=staying,
        delete=tuple(Deletion(p.name, p.uid, grace if p.node else 0, why) for p in chosen),
        create=new_workers(job.name, missing, generation, {p.name for p in observed.pods}),
        generation=generation,
        pin_node=observed.moves[0] if moving else None,
    )


def movers(active: Sequence[Pod], target: int, disrupted: bool, moves: Sequence[str]) -> list[Pod]:
    """The workers that leave when the job moves onto the policy's node: every worker not on it,
    when nothing else changed the workers this pass, all of them run on nodes, and the workers on
    that node plus the new ones make the target (the policy saw what this pass sees). Otherwise
    none: the next pass decides again from what it observes."""
    if not moves or disrupted or any(p.node is None for p in active):
        return []
    away = [p for p in active if p.node != moves[0]]
    return away if away and len(active) - len(away) + len(moves) == target else []


def new_workers(job_name: str, count: int, generation: int, taken: Set[str]) -> tuple[tuple[int, int], ...]:
    """(index, generation) of `count` new workers at the lowest indices whose pod name is free: a
    failed worker keeps its name until it is deleted, so its replacement gets a new one."""
    free = (i for i in itertools.count() if manifests.worker_name(job_name, i) not in taken)
    return tuple((index, generation) for index in itertools.islice(free, max(0, count)))


def rendezvous_and_services(job: Job, observed: Observed, ended: bool) -> Support:
    """A running job has one rendezvous pod (replaced once it ends or its node is gone: PodGC removes
    such a pod only after a long quarantine), its Service and its NetworkPolicy; an ended job
    cleans the pod up (the rest goes with the job)."""
    name = manifests.rendezvous_name(job.name)
    pods = [p for p in children(job, observed.pods, contract.ROLE_RENDEZVOUS) if not p.deleting]
    if ended:
        cleaning = job.spec.clean_pod_policy != CleanPodPolicy.NONE
        return Support(delete=tuple(Deletion(p.name, p.uid, 0, "job finished") for p in pods if cleaning))
    gone = [p for p in pods if p.finished or (p.node is not None and p.node not in observed.nodes)]
    return Support(
        delete=tuple(Deletion(p.name, p.uid, 0, "rendezvous ended", runs_nowhere=True) for p in gone),
        create_rendezvous_pod=not pods and name not in {p.name for p in observed.pods},
        create_service=manifests.service_name(job.name) not in observed.services,
        create_network_policy=manifests.network_policy_name(job.name) not in observed.network_policies,
    )


def global_batch(job: Job, chosen: int | None, active: Sequence[Pod], ended: bool) -> Batch:
    """With spec.maxGlobalBatchSize: the policy's B when the spec allows it (else the one in use),
    and the active workers whose annotation differs. The trainers switch together at a step
    boundary once rank 0's projected file shows the new value."""
    spec = job.spec
    if spec.max_global_batch_size is None:
        return Batch()
    before = manifests.global_batch_in_use(job)
    value = chosen if chosen is not None and spec.allows_global_batch(chosen) else before
    if ended:
        return Batch(value)
    stale = tuple(BatchUpdate(p.name, p.uid, value) for p in active if p.global_batch != str(value))
    changed = (
        (Event("Normal", "GlobalBatchChanged", f"global batch {before} -> {value}"),)
        if value != before
        else ()
    )
    return Batch(value, stale, Report(changed))


def memory_budget(job: Job, active: Sequence[Pod], nodes: Mapping[str, Node], ended: bool) -> Budget:
    """With spec.bandLimit: the job's budget (`gpu_memory.job_budget_mib`, from the workers that
    stay) and the active workers whose annotation differs. A MemoryBudgetChanged event when it
    moves from what the workers carry; not again while a move is being applied (a worker already
    carries the new value), nor for the first budget a job gets (it is in the annotation)."""
    value = job_budget_mib(job, active, nodes)
    if value is None or ended:
        return Budget(value)
    stale = tuple(BudgetUpdate(p.name, p.uid, value) for p in active if p.memory_budget != str(value))
    carried = Counter(p.memory_budget for p in active if p.memory_budget is not None)
    if not carried or str(value) in carried:
        return Budget(value, stale)
    [(before, _)] = carried.most_common(1)  # what most workers carry
    message = f"memory budget {before} MiB -> {value} MiB per worker"
    return Budget(value, stale, Report((Event("Normal", "MemoryBudgetChanged", message),)))


def job_status(
    job: Job,
    observed: Observed,
    seen: Workers,
    ending: Ending,
    timeout: Timeout,
    sizing: Sizing,
    settled: bool,
    now: float,
    config: PlannerConfig,
) -> StatusUpdate:
    """The status this pass writes, the rescale it records, and what the steps tell people in order."""
    status, target, stamp = job.status, sizing.target, format_time(now)
    ready = sum(p.ready and p.phase == "Running" for p in sizing.active)
    replicas = len(sizing.active) + len(sizing.create)
    minimum, finished = job.spec.replicas.min, len(seen.succeeded)
    phase, ready_condition = readiness(minimum, target, ready, replicas, settled, ending.phase, finished)
    before = status.desired_replicas or 0
    reason = rescale_reason(
        before,
        target,
        ended=ending.ended,
        lost=bool(seen.lost),
        stuck=bool(timeout.stuck),
        failed=bool(seen.failures),
        spec_changed=job.generation != status.observed_generation,
    )
    preemptions = (status.preemptions or 0) + len(seen.lost)
    scheduling = () if ending.ended else (schedulable(job, target, timeout.hold, observed.free_gpus, config),)
    rescaled: tuple[Event, ...] = (
        (Event("Normal", "Rescaled", f"{before} -> {target} workers ({reason})"),) if reason else ()
    )
    if sizing.pin_node is not None:
        message = (
            f"onto node {sizing.pin_node}: {len(sizing.create)} new workers there, the "
            f"{len(sizing.delete)} on other nodes leave; {target} workers on one node"
        )
        rescaled += (Event("Normal", "MovedOntoOneNode", message),)
    report = report_losses(seen.lost, preemptions) + ending.report + timeout.report
    report += Report(rescaled, (*scheduling, ready_condition))
    rescale = {"time": stamp, "from": before, "to": target, "reason": reason} if reason else None
    progress = latest_progress(children(job, observed.pods, contract.ROLE_WORKER))
    new_status: Json = {
        "phase": phase,
        "conditions": [
            c.to_json() for c in set_conditions(status.conditions, report.conditions, job.generation, stamp)
        ],
        "observedGeneration": job.generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "desiredReplicas": target,
        "selector": manifests.worker_selector(job.name),
        "worldGeneration": sizing.generation,
        "preemptions": preemptions,
        "restarts": ending.restarts,
        "workerNodes": {
            **{p.name: p.node or "" for p in sizing.active},
            **{manifests.worker_name(job.name, i): "" for i, _ in sizing.create},
        },
        **history(status.to_json(), phase, stamp, rescale, timeout.hold, progress),
    }
    return StatusUpdate(new_status, reason, report)


def readiness(
    minimum: int,
    target: int,
    ready: int,
    replicas: int,
    settled: bool,
    final: Phase | None,
    finished: int = 0,
) -> tuple[Phase, ConditionUpdate]:
    """The phase and the Ready condition: the job's lifecycle (status.phase, `ebbflow_api.models.Phase`),
    decided anew every pass.

        Pending    fewer than spec.replicas.min workers ready (new, no GPUs for min, held after a timeout)
        Scaling    at least min ready, but workers are still being added, removed or getting ready
        Running    every desired worker ready and nothing to create or delete, or (training over) a
                   worker has succeeded and the others are finishing
        Succeeded  a worker finished training and none is still active        (final)
        Failed     a worker exited with a code in contract.FATAL_EXIT_REASONS (InvalidConfig,
                   NonFiniteLoss: no restart can cure it), or real failures exceeded spec.maxRestarts

        Pending <-> Scaling <-> Running;  any of them -> Succeeded | Failed;  a final phase never changes.

    A final phase stays (and the job is no longer Ready); while `finished` workers have succeeded and
    the others are finishing too, the job stays Running (their ready count falling is the end of
    training, not a lack of workers); otherwise Pending below `minimum` ready workers, Running once
    all `target` workers exist and are ready with nothing left to create or delete but pods that run
    nowhere (`settled`), Scaling in between."""
    if final is not None:
        return final, ConditionUpdate(READY, False, str(final), f"the job {str(final).lower()}")
    if finished:
        message = f"{finished} worker(s) finished training; {replicas} still finishing"
        return Phase.RUNNING, ConditionUpdate(READY, True, "WorkersFinishing", message)
    enough = ready >= minimum
    message = f"{ready} of {target} desired worker(s) ready (min {minimum})"
    condition = ConditionUpdate(READY, enough, "MinimumAvailable" if enough else "WaitingForWorkers", message)
    if not enough:
        return Phase.PENDING, condition
    if ready == target and replicas == target and settled:
        return Phase.RUNNING, condition
    return Phase.SCALING, condition


def schedulable(
    job: Job, target: int, hold: Hold | None, free_gpus: int, config: PlannerConfig
) -> ConditionUpdate:
    """The Schedulable condition: the size allocated, or why the job has no workers (a pending
    timeout held it below its minimum, or too few GPUs are free on the nodes it may use)."""
    spec = job.spec
    if target > 0:
        message = f"{target} worker(s) allocated in [{spec.replicas.min}, {spec.replicas.max}]"
        return ConditionUpdate(SCHEDULABLE, True, "Allocated", message)
    if hold is not None and hold.replicas < spec.replicas.min:
        message = (
            f"only {hold.replicas} of min {spec.replicas.min} workers were scheduled within "
            f"{config.pending_timeout:.0f}s; retrying after {format_time(hold.until)}"
        )
        return ConditionUpdate(SCHEDULABLE, False, "PendingTimeout", message)
    message = (
        f"needs min {spec.replicas.min} workers x {job.gpus_per_worker} GPU(s) on nodes "
        f"it may use; {free_gpus} GPU(s) free there for it"
    )
    return ConditionUpdate(SCHEDULABLE, False, "InsufficientGPUs", message)


def rescale_reason(
    before: int, target: int, *, ended: bool, lost: bool, stuck: bool, failed: bool, spec_changed: bool
) -> RescaleReason | None:
    """Why the size moves from `before` to `target`, the first cause that applies: a preemption, a
    pending timeout, a worker failure, a spec change (or a new job), else capacity the allocator
    freed or reclaimed. None when the size stays or the job ended (that is no rescale)."""
    if ended or target == before:
        return None
    if lost:
        return RescaleReason.PREEMPTION
    if stuck:
        return RescaleReason.PENDING_TIMEOUT
    if failed:
        return RescaleReason.FAILURE
    if spec_changed:
        return RescaleReason.SPEC_CHANGED
    return RescaleReason.CAPACITY_FREED if target > before else RescaleReason.CAPACITY_RECLAIMED


def latest_progress(workers: Sequence[Pod]) -> Json | None:
    """The newest readable progress report among the workers (by its time)."""
    reports = [r for p in workers if (r := parse_progress(p.progress))]
    return max(reports, key=lambda r: str(r.get("time", ""))) if reports else None


def history(
    recorded: Json, phase: Phase, stamp: str, rescale: Json | None, hold: Hold | None, progress: Json | None
) -> Json:
    """Status fields that outlive a pass, kept from the `recorded` status unless this pass has news:
    lastRescale on a rescale, startTime at the first Running pass, completionTime at the first final
    one, progress from the newest report; the hold is written only while it is in force."""
    kept = ("lastRescale", "progress", "startTime", "completionTime")
    fields: Json = {key: recorded[key] for key in kept if key in recorded}
    if rescale is not None:
        fields["lastRescale"] = rescale
    if hold is not None:
        fields |= {"holdReplicas": hold.replicas, "holdUntil": format_time(hold.until)}
    if phase == Phase.RUNNING:
        fields.setdefault("startTime", stamp)
    if phase.terminal:
        fields.setdefault("completionTime", stamp)
    if progress is not None:
        fields["progress"] = progress
    return fields
