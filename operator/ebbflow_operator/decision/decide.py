"""One whole pass's decision, pure: observed state, spec and now in, every job's plan out.

`decide` takes what the cache holds (nodes, pods, jobs, the jobs' Services and, under Kueue, their
Workloads), the operator's configuration and the time, and returns the plans the reconcile loop
applies: capacity, then one allocation across all jobs, then each job's plan (planner.py).

Invariants:
- Pure: no Kubernetes client, no kopf, no cache, no I/O, no clock; the same inputs give the same
  plans, so a pass can be replayed in a test from plain data.
- Nothing is carried between calls but a memo (`PlanMemo`) that reuses a plan only when everything
  it was computed from is the very same objects (an empty memo changes no decision).
- Finished jobs, and jobs whose workers have started to finish, are planned but get no allocation.
- A queued job (Kueue enabled, `Job.queue` set) is allocated at most what its admission covers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ebbflow_api import contract

from . import kueue, kueue_room
from .allocator import Demand, Policy, growth_in_room, most_used_first
from .capacity import cluster_capacity, eligible_nodes, matches_selector
from .kueue import Admission, Flavor, Workload
from .kueue_room import ClusterQueue, LocalQueue
from .model import Job, JobKey, Node, Pod, parse_toleration
from .plan import TERMINAL_PHASES, Observed, Plan, PlannerConfig, Refusal
from .planner import hold_cap, plan_job, rendered


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    node_selector: Mapping[str, str] = field(default_factory=dict)  # only these nodes are allocated
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    resync_interval: float = 30.0  # a pass at least this often
    relist_interval: float = 60.0  # full lists at least this often (the cache is fed by watches)
    debounce: float = 0.05  # gather a burst of watch events into one pass
    write_concurrency: int = 8
    max_writes_per_pass: int = 500  # the rest waits for the next pass (this_pass)
    policy: str = "goodput"  # who gets a freed GPU: policies.POLICIES (docs/operator.md)
    kueue: bool = False  # jobs labeled with a Kueue queue run only what Kueue admits (kueue.py)


@dataclass(frozen=True)
class KueueObjects:
    """Kueue's objects as the cache holds them: Workloads (the jobs' slices and the others that
    share their ClusterQueues), ResourceFlavors, ClusterQueues and LocalQueues."""

    workloads: Sequence[Workload] = ()
    flavors: Sequence[Flavor] = ()
    cluster_queues: Sequence[ClusterQueue] = ()
    local_queues: Sequence[LocalQueue] = ()

    def cluster_queues_by_name(self) -> dict[str, ClusterQueue]:
        return {queue.name: queue for queue in self.cluster_queues}

    def local_queues_by_key(self) -> dict[tuple[str, str], LocalQueue]:
        return {(queue.namespace, queue.name): queue for queue in self.local_queues}


@dataclass(frozen=True)
class ObservedValues:
    """What `plan_job` reads of a job's observation that compares by value (the rest by identity)."""

    services: frozenset[str]
    network_policies: frozenset[str]
    desired: int
    free_gpus: int
    global_batch: int | None
    moves: tuple[str, ...]
    growth: tuple[str, ...]
    admission: Admission | None  # also what other jobs of its ClusterQueue leave it (kueue_room.py)
    refused: Refusal | None


@dataclass(frozen=True)
class PlanInputs:
    """Everything `plan_job` reads for one job besides the time and the planner's configuration.
    The cache hands out the same parsed object until the API server has a new version of it, so
    objects compare by identity: equal identities mean equal content."""

    job: Job
    pods: tuple[Pod, ...]
    nodes: tuple[Node | None, ...]  # the nodes the job's pods and recorded workers name
    values: ObservedValues
    workloads: tuple[Workload, ...] = ()  # a queued job's Kueue slices

    def same_as(self, other: PlanInputs) -> bool:
        return (
            self.job is other.job
            and len(self.workloads) == len(other.workloads)
            and all(a is b for a, b in zip(self.workloads, other.workloads, strict=True))
            and len(self.pods) == len(other.pods)
            and all(a is b for a, b in zip(self.pods, other.pods, strict=True))
            and len(self.nodes) == len(other.nodes)
            and all(a is b for a, b in zip(self.nodes, other.nodes, strict=True))
            and self.values == other.values
        )


# Last pass's plans that wrote nothing and cannot change with time alone, with their inputs. Most
# passes are woken by one job's pods and leave every other job as it was: planning those again
# took over half of a pass at 1,000 jobs.
PlanMemo = Mapping[JobKey, tuple[PlanInputs, Plan]]


@dataclass(frozen=True)
class PassResult:
    plans: tuple[Plan, ...]
    total_gpus: int
    free_gpus: int
    memo: PlanMemo = field(default_factory=dict)  # for the next pass's `decide`


def decide(
    nodes: list[Node],
    pods: list[Pod],
    jobs: list[Job],
    services: Mapping[JobKey, frozenset[str]],
    network_policies: Mapping[JobKey, frozenset[str]],
    now: float,
    config: OperatorConfig,
    policy: Policy,
    memo: PlanMemo | None = None,
    kueue_objects: KueueObjects | None = None,
    refusals: Mapping[JobKey, Refusal] | None = None,
) -> PassResult:
    """Observed state in, plans out: capacity, then allocation across jobs, then each job's plan
    (from `memo`, the previous pass's `PassResult.memo`, where its inputs are the same).
    `kueue_objects`: what the cache holds of Kueue's objects (with `config.kueue`); `refusals`: the
    latest worker the API server refused to create, by job (those older than the back-off lapse)."""
    by_name = {node.name: node for node in nodes}
    selected = [node for node in nodes if matches_selector(node, config.node_selector)]
    job_pods: dict[JobKey, list[Pod]] = defaultdict(list)
    for pod in pods:
        if pod.job is not None:
            job_pods[(pod.namespace, pod.job)].append(pod)
    queued = kueue_objects or KueueObjects()
    slices = _slices_by_job(jobs, queued.workloads) if config.kueue else {}
    room = _admissions(jobs, slices, queued, now)
    admissions = room.admissions
    eligible = _eligible(selected, [_placed(job, admissions.get(job.key)) for job in jobs])
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
        # A lower-priority job making room for a new one keeps what it does not give up.
        admitted = (
            admissions[job.key].workers - room.yields.get(job.key, 0) if job.key in admissions else None
        )
        demands.append(_demand(job, held, eligible[job.key], now, admitted))
    capacity = cluster_capacity(selected, pods, movable)
    allocation = policy.decide(demands, capacity.free)
    growth = growth_in_room(allocation, demands, _room_now(capacity.free, movable))
    plans = []
    remembered: dict[JobKey, tuple[PlanInputs, Plan]] = {}
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
            growth=growth.get(job.key, ()),
            admission=admissions.get(job.key),
            refused=_recent((refusals or {}).get(job.key), now, config.planner.refusal_backoff),
        )
        inputs = _plan_inputs(job, observed, slices.get(job.key, ()))
        previous = (memo or {}).get(job.key)
        if previous is not None and previous[0].same_as(inputs):
            plan = previous[1]
        else:
            plan = plan_job(job, observed, now, config.planner)
        if _timeless(plan, observed):
            remembered[job.key] = (inputs, plan)
        plans.append(plan)
    used = sum(p.gpus for p in pods if p.holds_gpus and p.node in capacity.free)
    return PassResult(tuple(plans), capacity.total, max(0, capacity.total - used), remembered)


def this_pass(
    plans: Sequence[Plan], max_writes: int, service_accounts: Mapping[str, str]
) -> tuple[list[Plan], list[Plan]]:
    """The plans with work that this pass applies, their writes built (`planner.rendered`; workers
    whose template names no ServiceAccount get `service_accounts`'), and those left for the next pass.

    Applying is bounded so that one pass cannot hold the loop for minutes (a first pass over 1,000
    new jobs would create 20,000 pods; at the API server's 30-100 writes/s on a small control plane
    a lost node would wait that long): plans are taken whole, those with deletions first (they
    answer losses and free GPUs for the others), then in the jobs' order, until `max_writes` is
    reached; the first is always taken. What is left is planned afresh by the next pass, which
    runs at once (plans are level-triggered: nothing is lost by deferring one). A deferred plan's
    bodies are never built: at 1,000 new jobs that was most of a pass (bench/README.md)."""
    work = sorted((p for p in plans if p.has_work), key=lambda p: not p.delete)
    taken, writes = 0, 0
    for plan in work:
        if taken and writes + plan.write_count > max_writes:
            break
        taken, writes = taken + 1, writes + plan.write_count
    return [rendered(plan, service_accounts) for plan in work[:taken]], work[taken:]


def _plan_inputs(job: Job, observed: Observed, workloads: tuple[Workload, ...]) -> PlanInputs:
    # In the pods' and the status's own order: the same pods and job give the same order.
    named = [*(p.node for p in observed.pods), *job.status.worker_nodes.values()]
    values = ObservedValues(
        observed.services,
        observed.network_policies,
        observed.desired,
        observed.free_gpus,
        observed.global_batch,
        observed.moves,
        observed.growth,
        observed.admission,
        observed.refused,
    )
    nodes = observed.nodes
    located = tuple(nodes.get(n) if n else None for n in named)
    return PlanInputs(job, tuple(observed.pods), located, values, workloads)


def _timeless(plan: Plan, observed: Observed) -> bool:
    """Whether the same inputs give this plan at any later time: it writes nothing, and nothing in
    it waits on the clock (a pod not yet scheduled may time out; a hold in the status expires; a
    new queued job stops waiting for room)."""
    waiting_for_room = observed.admission is not None and observed.admission.first_workers == 0
    return (
        not plan.has_work
        and plan.job.status.hold_replicas is None
        and all(p.node is not None for p in observed.pods)
        and not waiting_for_room  # its deadline may pass (kueue_room.ROOM_DEADLINE_S)
        and observed.refused is None  # its back-off lapses
    )


def _recent(refusal: Refusal | None, now: float, backoff: float) -> Refusal | None:
    """`refusal` while its back-off lasts: until then no new worker of the job is created."""
    return refusal if refusal is not None and now - refusal.at < backoff else None


def _frozen(job: Job, workers: list[Pod]) -> bool:
    """Finished jobs and jobs whose workers have started finishing get no allocation. A deleted
    worker that exited 0 handed its state over and left (a SIGTERM, the operator's or a user's):
    its Succeeded pod does not mean the training finished."""
    return job.status.phase in TERMINAL_PHASES or any(
        p.succeeded and not p.deleting and p.owner_uid == job.uid for p in workers
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


def _demand(
    job: Job, held: Sequence[Pod], eligible: frozenset[str], now: float, admitted: int | None
) -> Demand:
    """What the job asks of the allocator: its bounds (capped by a pending-timeout hold, and by the
    workers Kueue `admitted` for a queued job) and the nodes its running workers sit on (so a
    stable job keeps its place)."""
    caps = [c for c in (hold_cap(job, now), admitted) if c is not None]
    replicas = job.spec.replicas
    return Demand(
        key=job.key,
        min=replicas.min,
        max=min([replicas.max, *caps]),
        gpus_per_worker=job.gpus_per_worker,
        eligible=eligible,
        priority=job.spec.priority,
        created=job.created,
        current_nodes=most_used_first([p.node for p in held if p.node and not p.deleting]),
    )


def _room_now(free: Mapping[str, int], workers: Sequence[Pod]) -> dict[str, int]:
    """The GPUs per node no worker holds now: `free` counts the `workers`' GPUs as free (theirs to
    hand out again), the leaving ones' included, though they hold them until their pods are gone."""
    room = dict(free)
    for pod in workers:
        if pod.node in room:
            room[pod.node] -= pod.gpus
    return room


def _slices_by_job(jobs: Sequence[Job], workloads: Sequence[Workload]) -> dict[JobKey, tuple[Workload, ...]]:
    """Each queued job's Workloads (those it owns), in the order the cache holds them."""
    by_owner: dict[str, list[Workload]] = defaultdict(list)
    for workload in workloads:
        if workload.owner_uid:
            by_owner[workload.owner_uid].append(workload)
    return {job.key: tuple(by_owner.get(job.uid, ())) for job in jobs if job.queue}


def _admissions(
    jobs: Sequence[Job], slices: Mapping[JobKey, tuple[Workload, ...]], objects: KueueObjects, now: float
) -> kueue_room.Room:
    """What Kueue admits of each queued job (those with `slices`), and the room made for new ones."""
    by_flavor = {flavor.name: flavor for flavor in objects.flavors}
    admissions = {
        job.key: kueue.admission_of(job, slices[job.key], now, by_flavor) for job in jobs if job.key in slices
    }
    by_name, by_key = objects.cluster_queues_by_name(), objects.local_queues_by_key()
    return kueue_room.make_room(admissions, jobs, objects.workloads, by_name, by_key, now)


def _placed(job: Job, admission: Admission | None) -> Job:
    """The job as the allocator must place it: with the admitted flavors' node labels and
    tolerations (Kueue's placement) added to its template's."""
    placement = admission.placement if admission is not None else None
    if placement is None or not (placement.node_labels or placement.tolerations):
        return job
    return replace(
        job,
        node_selector={**job.node_selector, **placement.node_labels},
        tolerations=(*job.tolerations, *(parse_toleration(t) for t in placement.tolerations)),
    )
