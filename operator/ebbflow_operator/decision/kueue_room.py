"""Room for a higher-priority queued job, made gracefully (pure; docs/operator.md, "Under Kueue").

Kueue preempts by evicting whole Workloads: a lower-priority job in the way of a new one would
empty. The operator creates its jobs' Workloads itself, so it can first do gracefully what Kueue's
preemption would do by force: before a queued job's first slice exists, lower-priority queued jobs
of the same ClusterQueue shrink (never below their minimum) until the new job's slice fits the
quota left, and only then is the slice created; Kueue admits it without preempting anyone.

Invariants: room is made only where the ClusterQueue itself preempts lower priorities
(`withinClusterQueue`), only in GPUs (the resource the operator allocates), only from jobs the
operator runs, and only when shrinking can make room for at least the new job's minimum; otherwise,
or once ROOM_DEADLINE_S has passed since the job was created, the slice is created as before and
Kueue decides. Quota in use is summed from the Workloads themselves at their current counts, so a
slice lowered in place counts at once. Victims go lowest priority first, then newest admission.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .kueue import Admission, Workload
from .model import Job, JobKey
from .plan import TERMINAL_PHASES

# Kueue's `withinClusterQueue` policies under which a higher priority takes quota from a lower one.
PREEMPTING_POLICIES = frozenset({"LowerPriority", "LowerOrNewerEqualPriority"})
# How long a new job waits for lower-priority jobs to shrink before its slice is created anyway.
ROOM_DEADLINE_S = 120.0


@dataclass(frozen=True)
class ClusterQueue:
    """What room-making needs of a Kueue ClusterQueue."""

    name: str
    nominal_gpus: int  # spec: the GPUs' nominal quota over every flavor
    policy: str = "Never"  # spec.preemption.withinClusterQueue

    @property
    def preempts_lower(self) -> bool:
        return self.policy in PREEMPTING_POLICIES


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str


def parse_cluster_queue(raw: Mapping[str, Any], gpu_resource: str) -> ClusterQueue:
    spec = raw.get("spec") or {}
    nominal = 0
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if resource.get("name") == gpu_resource:
                    nominal += int(str(resource.get("nominalQuota", 0)))
    policy = str((spec.get("preemption") or {}).get("withinClusterQueue") or "Never")
    return ClusterQueue(raw["metadata"]["name"], nominal, policy)


def parse_local_queue(raw: Mapping[str, Any]) -> LocalQueue:
    metadata = raw["metadata"]
    return LocalQueue(
        metadata.get("namespace", ""), metadata["name"], (raw.get("spec") or {}).get("clusterQueue", "")
    )


@dataclass(frozen=True)
class Room:
    """What this pass does to make room: the workers each lower-priority job gives up, and each
    queued job's admission with its first slice's count and the quota it may grow into."""

    yields: Mapping[JobKey, int] = field(default_factory=dict)
    admissions: Mapping[JobKey, Admission] = field(default_factory=dict)


@dataclass
class _Member:
    """A queued job of the ClusterQueue, with the workers it keeps as the pass decides."""

    job: Job
    admission: Admission
    keeps: int = 0

    @property
    def gpus(self) -> int:
        return self.job.gpus_per_worker

    def reclaimable(self) -> int:
        return max(0, self.keeps - self.job.spec.replicas.min) * self.gpus


def make_room(
    admissions: Mapping[JobKey, Admission],
    jobs: Sequence[Job],
    workloads: Sequence[Workload],
    cluster_queues: Mapping[str, ClusterQueue],
    local_queues: Mapping[tuple[str, str], LocalQueue],
    now: float,
) -> Room:
    """Each ClusterQueue's new jobs, highest priority first: the first slice's count, or the
    lower-priority jobs' graceful shrink that makes room for it first (the module's rules)."""
    by_queue: dict[str, list[_Member]] = defaultdict(list)
    for job in jobs:
        admission = admissions.get(job.key)
        local = local_queues.get((job.namespace, job.queue or ""))
        if admission is not None and local is not None and local.cluster_queue in cluster_queues:
            by_queue[local.cluster_queue].append(_Member(job, admission, admission.workers))
    yields: dict[JobKey, int] = {}
    updated = dict(admissions)
    for name, members in by_queue.items():
        queue = cluster_queues[name]
        free = queue.nominal_gpus - reserved_gpus(workloads, name)
        asks = _Asks(members, queue.nominal_gpus)
        for new in sorted((m for m in members if _new(m)), key=_first_served):
            claimed, updated[new.job.key] = _first_slice(new, queue, members, free - asks.ahead_of(new), now)
            free -= claimed
        for member in members:
            given = member.admission.workers - member.keeps
            if given:
                yields[member.job.key] = given
            if member.admission.admitted:
                room = max(0, free - asks.ahead_of(member))
                updated[member.job.key] = replace(updated[member.job.key], quota_gpus=room)
    return Room(yields, updated)


def reserved_gpus(workloads: Sequence[Workload], cluster_queue: str) -> int:
    """The GPUs the ClusterQueue's Workloads hold, each at its current counts."""
    return sum(w.reserved_gpus for w in workloads if w.cluster_queue == cluster_queue and not w.finished)


class _Asks:
    """The GPUs that the ClusterQueue's slices waiting for quota ask, by priority: Kueue admits them
    before lower priorities. A slice whose minimum exceeds the whole quota never fits; it is left out."""

    def __init__(self, members: Sequence[_Member], nominal_gpus: int) -> None:
        self.by_priority: dict[int, int] = defaultdict(int)
        self.own: dict[int, int] = {}
        for member in members:
            if member.job.spec.replicas.min * member.gpus <= nominal_gpus:
                self.own[id(member)] = _pending_gpus(member)
                self.by_priority[member.job.spec.priority] += self.own[id(member)]

    def ahead_of(self, member: _Member) -> int:
        """What the other slices of at least `member`'s priority ask."""
        priority = member.job.spec.priority
        ahead = sum(gpus for other, gpus in self.by_priority.items() if other >= priority)
        return ahead - self.own.get(id(member), 0)


def _pending_gpus(member: _Member) -> int:
    live = member.admission.live
    if not live or live[-1].admitted_workers is not None or live[-1].evicted:
        return 0
    return live[-1].workers * member.gpus


def _new(member: _Member) -> bool:
    """A job whose first slice is not created yet."""
    return not member.admission.live and member.job.status.phase not in TERMINAL_PHASES


def _first_served(member: _Member) -> tuple[int, float, str]:
    return (-member.job.spec.priority, member.job.created, member.job.name)


def _first_slice(
    new: _Member, queue: ClusterQueue, members: Sequence[_Member], free: int, now: float
) -> tuple[int, Admission]:
    """The new job's admission with its first slice's count (`first_workers`; 0 while room is
    made), and the GPUs of `free` it claims."""
    spec, gpus = new.job.spec.replicas, new.gpus
    ask_max = spec.max * gpus
    if gpus == 0 or free >= ask_max:
        return ask_max, replace(new.admission, first_workers=spec.max)
    victims = _victims(new, queue, members) if queue.preempts_lower else []
    reclaimable = sum(v.reclaimable() for v in victims)
    late = now - new.job.created > ROOM_DEADLINE_S
    if free + reclaimable < spec.min * gpus or late:
        return max(0, free), replace(new.admission, first_workers=spec.max)  # Kueue decides
    wanted = min(spec.max, (free + reclaimable) // gpus)
    if free >= wanted * gpus:
        return wanted * gpus, replace(new.admission, first_workers=wanted)
    need, shrinking = wanted * gpus - free, []
    for victim in victims:
        if need <= 0:
            break
        give = min(victim.keeps - victim.job.spec.replicas.min, -(-need // victim.gpus))
        if give > 0:
            shrinking.append(f"{victim.job.name} {victim.keeps} -> {victim.keeps - give}")
            victim.keeps -= give
            need -= give * victim.gpus
    message = (
        f"lower-priority jobs of ClusterQueue {queue.name} are shrinking to make room for "
        f"{wanted} worker(s): {', '.join(shrinking) or 'their workers are leaving'}"
    )
    return max(0, free), replace(new.admission, first_workers=0, reason="MakingRoom", message=message)


def _victims(new: _Member, queue: ClusterQueue, members: Sequence[_Member]) -> list[_Member]:
    """The admitted jobs Kueue could preempt for `new`, in the order it would: lowest priority
    first, then the most recently admitted."""
    priority = new.job.spec.priority

    def below(member: _Member) -> bool:
        other = member.job.spec.priority
        newer_equal = queue.policy == "LowerOrNewerEqualPriority" and other == priority
        return other < priority or (newer_equal and member.job.created > new.job.created)

    candidates = [m for m in members if m is not new and m.admission.admitted and below(m)]
    return sorted(candidates, key=lambda m: (m.job.spec.priority, -_admitted_since(m.admission)))


def _admitted_since(admission: Admission) -> float:
    running = admission.running
    reserved = running.conditions.get("QuotaReserved") if running is not None else None
    return (reserved.since if reserved is not None else None) or (running.created if running else 0.0)
