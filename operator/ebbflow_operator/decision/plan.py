"""What a job's plan is made of: the `Plan` the planner returns, what it sees of the job (`Observed`),
and the small frozen values its steps hand each other. Pure data, no decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ebbflow_api.models import Phase

from .kueue import Admission
from .model import Job, Json, Node, Placement, Pod
from .status import (
    ConditionUpdate,
)
from .writes import DeclareGone, PatchWorkload, Write

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
    # After the API server refused a new worker (admission: Pod Security, a quota, a webhook), no
    # worker of the job is created for this long: a refusal repeats until someone changes something.
    refusal_backoff: float = 30.0
    hold_seconds: float = 300.0  # after a withdrawal the job grows no further for this long
    # ServiceAccount of workers whose template names none, by namespace ("" = every namespace).
    trainer_service_accounts: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """The API server refused to create one of the job's workers (the reconciler's record)."""

    pod: str
    message: str  # the API server's words: which policy, which field
    at: float  # POSIX seconds


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
    pins: tuple[str, ...] = ()  # the node each new worker must run on, in create_workers' order (none: any)
    global_batch: int | None = None  # B for new workers (spec.maxGlobalBatchSize only)
    update_global_batch: tuple[BatchUpdate, ...] = ()
    memory_budget: int | None = None  # MiB for new workers (spec.bandLimit only; None: not known)
    update_memory_budget: tuple[BudgetUpdate, ...] = ()
    delete: tuple[Deletion, ...] = ()
    create_rendezvous_pod: bool = False
    create_service: bool = False
    create_network_policy: bool = False
    declare_gone: DeclareGone | None = None  # workers gone, for the rendezvous (declarations.py)
    placement: Placement | None = None  # new workers' Kueue flavors (queued jobs)
    create_workload: Json | None = None  # a Kueue Workload slice (kueue.next_write)
    patch_workload: PatchWorkload | None = None
    status_patch: Json = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    rescale_reason: RescaleReason | None = None
    preemptions: int = 0
    status: Json = field(default_factory=dict)
    # How many writes carry the fields above out (`planner.write_steps`, counted without a body built).
    api_writes: int = 0
    # Those writes, in order: built only for the plans a pass applies (`planner.rendered`).
    writes: tuple[Write, ...] = ()

    @property
    def has_work(self) -> bool:
        """Whether applying the plan writes anything (most passes leave most jobs alone)."""
        return self.write_count > 0

    @property
    def write_count(self) -> int:
        """The API writes applying the plan takes (events included)."""
        return self.api_writes + len(self.events)

    def summary(self) -> str:
        """The plan's writes in a line, for the operator's debug log: which fields of the status
        change and what is deleted (and why) or created, to tell why a job took another pass."""
        parts = [f"status {','.join(sorted(self.status_patch))}"] if self.status_patch else []
        if self.declare_gone is not None:
            parts.append(f"declare {','.join(name for name, _ in self.declare_gone.pods)} gone")
        parts += [f"delete {d.name} ({d.reason})" for d in self.delete]
        if self.create_workers:
            parts.append(f"create {len(self.create_workers)} worker(s)")
        children = ("rendezvous pod", "service", "network policy")
        wanted = (self.create_rendezvous_pod, self.create_service, self.create_network_policy)
        parts += [f"create {child}" for child, want in zip(children, wanted, strict=True) if want]
        if self.create_workload is not None:
            parts.append(f"create workload {self.create_workload['metadata']['name']}")
        if self.patch_workload is not None:
            parts.append(f"patch workload {self.patch_workload.name}")
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
    growth: tuple[str, ...] = ()  # the policy's node for each new worker of a growth (Allocation.growth)
    admission: Admission | None = None  # what Kueue admits of a queued job (None: not queued)
    refused: Refusal | None = None  # a new worker refused within PlannerConfig.refusal_backoff


@dataclass(frozen=True)
class EventsAndConditions:
    """What a step tells people: events to record and conditions to set, in the order decided."""

    events: tuple[Event, ...] = ()
    conditions: tuple[ConditionUpdate, ...] = ()

    def __add__(self, other: EventsAndConditions) -> EventsAndConditions:
        return EventsAndConditions(self.events + other.events, self.conditions + other.conditions)


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
    left_late: tuple[Pod, ...] = ()  # left, killed past the leave grace (contract.EXIT_LEAVE_TIMED_OUT)


@dataclass(frozen=True)
class Ending:
    """What the workers' exits mean for the job; `phase` is set (Succeeded or Failed) once it ended."""

    phase: Phase | None = None
    restarts: int = 0
    delete: tuple[Deletion, ...] = ()  # failed workers to replace, or the ended job's clean-up
    report: EventsAndConditions = field(default_factory=EventsAndConditions)

    @property
    def ended(self) -> bool:
        return self.phase is not None


@dataclass(frozen=True)
class Timeout:
    """The workers left after the pending timeout, those it withdrew, and the hold in force."""

    active: tuple[Pod, ...] = ()
    stuck: tuple[Pod, ...] = ()  # unscheduled for longer than the pending timeout
    hold: Hold | None = None
    report: EventsAndConditions = field(default_factory=EventsAndConditions)

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
    pins: tuple[str, ...] = ()  # the node each new worker must run on, in `create`'s order (none: any)
    moved_onto: str | None = None  # set when the job moves onto one node


@dataclass(frozen=True)
class ChildrenPlan:
    """What happens to the job's rendezvous pod, Service and NetworkPolicy."""

    delete: tuple[Deletion, ...] = ()
    create_rendezvous_pod: bool = False
    create_service: bool = False
    create_network_policy: bool = False


@dataclass(frozen=True)
class GlobalBatchPlan:
    """The global batch the workers should train with, and the workers still to be told."""

    value: int | None = None  # None: the job's spec does not let B change
    update: tuple[BatchUpdate, ...] = ()
    report: EventsAndConditions = field(default_factory=EventsAndConditions)


@dataclass(frozen=True)
class MemoryBudgetPlan:
    """The GPU memory each worker may use, and the workers still to be told."""

    value: int | None = None  # MiB; None: not spec.bandLimit, or nothing says how much there is
    update: tuple[BudgetUpdate, ...] = ()
    report: EventsAndConditions = field(default_factory=EventsAndConditions)


@dataclass(frozen=True)
class StatusUpdate:
    """The status to write, the rescale it records (if any) and what the pass tells people."""

    status: Json
    rescale_reason: RescaleReason | None = None
    report: EventsAndConditions = field(default_factory=EventsAndConditions)


def children(job: Job, pods: Sequence[Pod], role: str) -> list[Pod]:
    """The job's own pods (by controller owner reference) of one role."""
    return [p for p in pods if p.owner_uid == job.uid and p.role == role]
