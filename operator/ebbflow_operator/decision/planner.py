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
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import replace
from functools import partial
from typing import Any

from ebbflow_api import contract
from ebbflow_api.models import CleanPodPolicy, Phase

from . import kueue, manifests
from .capacity import evicts
from .declarations import declaration
from .gpu_memory import job_budget_mib
from .job_status import job_status
from .model import Job, Json, Node, Pod, format_time, parse_time
from .plan import (
    BatchUpdate,
    BudgetUpdate,
    ChildrenPlan,
    Deletion,
    Ending,
    Event,
    EventsAndConditions,
    GlobalBatchPlan,
    Hold,
    MemoryBudgetPlan,
    Observed,
    Plan,
    PlannerConfig,
    Sizing,
    Timeout,
    Workers,
    children,
)
from .status import (
    FAILED,
    SUCCEEDED,
    ConditionUpdate,
    merge_patch,
)
from .writes import AnnotatePod, ChildKind, CreateChild, DeletePod, PatchStatus, PatchWorkload, Write


def plan_job(job: Job, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    """The steps in order; each decides one thing from the observation and the small frozen values the
    steps before it returned:

        classify                 workers -> active, lost (and why), failed, succeeded, being taken
        end_of_job               exits -> Failed (a fatal exit code's reason, TooManyFailures) or
                                 Succeeded; clean-up
        pending_timeout          workers the scheduler refused for too long -> withdrawn, and a hold
        target_size              allocator's size, hold, Kueue's admission, spec.replicas.min -> how
                                 many workers to have
        resize                   the scale-down's `victims` or the policy's `movers`, `new_workers`,
                                 the world generation
        rendezvous_and_services  the rendezvous pod (replaced when it ends; under Kueue only while
                                 admitted), the job's Service and NetworkPolicy
        declaration              (declarations.py) the workers gone, for the rendezvous pod
        workload_write           (queued jobs only) the Kueue Workload slice to create or patch
        global_batch             (spec.maxGlobalBatchSize only) the policy's B -> the workers'
                                 annotations to change and status.globalBatchSize
        memory_budget            (spec.bandLimit only) the job's GPU memory budget (gpu_memory.py) ->
                                 the workers' annotations to change
        job_status               (job_status.py) `readiness` (phase, Ready), `schedulable`,
                                 `rescale_reason`, `lasting_fields`
    """
    workers = children(job, observed.pods, contract.ROLE_WORKER)
    seen = classify(workers, job.status.worker_nodes, observed.nodes, job)
    ending = end_of_job(job, workers, seen)
    ended = ending.ended
    timeout = pending_timeout(job, seen.active, ended, now, config)
    minimum, finishing = job.spec.replicas.min, bool(seen.succeeded)
    desired = (
        observed.desired if observed.admission is None else min(observed.desired, observed.admission.workers)
    )
    target = target_size(desired, minimum, timeout.hold, len(timeout.active), ended, finishing)
    disrupted = bool(seen.lost or seen.counted_failures or timeout.stuck) and not ended
    sizing = resize(job, () if ended else timeout.active, target, disrupted, observed)
    support = rendezvous_and_services(job, observed, ended, bool(sizing.active))
    delete = (*seen.taken, *ending.delete, *timeout.delete, *sizing.delete, *support.delete)
    queued = workload_write(job, observed, sizing, delete, ending.phase, now)
    batch = global_batch(job, observed.global_batch, sizing.active, ended)
    budget = memory_budget(job, sizing.active, observed.nodes, ended)
    settled = all(d.runs_nowhere for d in delete) and not sizing.create
    update = job_status(job, observed, seen, ending, timeout, sizing, settled, now, config)
    if batch.value is not None:
        update = replace(update, status={**update.status, "globalBatchSize": batch.value})
    plan = Plan(
        job=job,
        create_workers=sizing.create,
        pins=sizing.pins,
        global_batch=batch.value,
        update_global_batch=batch.update,
        memory_budget=budget.value,
        update_memory_budget=budget.update,
        delete=delete,
        create_rendezvous_pod=support.create_rendezvous_pod,
        create_service=support.create_service,
        create_network_policy=support.create_network_policy,
        declare_gone=declaration(job, observed.pods, workers, seen, observed.nodes),
        placement=observed.admission.placement if observed.admission is not None else None,
        create_workload=queued if isinstance(queued, dict) else None,
        patch_workload=queued if isinstance(queued, PatchWorkload) else None,
        status_patch=merge_patch(job.status.to_json(), update.status),
        events=update.report.events + batch.report.events + budget.report.events,
        rescale_reason=update.rescale_reason,
        preemptions=len(seen.lost),
        status=update.status,
    )
    return replace(plan, api_writes=len(write_steps(plan, config.trainer_service_accounts)))


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
        elif pod.succeeded:
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
    # A leave whose processes outlived the grace: the pod is going (deleted or preempted) either way.
    late = tuple(p for p in workers if p.exit_code == contract.EXIT_LEAVE_TIMED_OUT)
    return Workers(tuple(active), lost, tuple(failures), counted, tuple(succeeded), tuple(taken), late)


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
        return Ending(restarts=restarts, delete=replaced, report=EventsAndConditions(noted))
    why, message = fatal or (
        "TooManyFailures",
        f"{restarts} worker failures exceed spec.maxRestarts={spec.max_restarts}: {details}",
    )
    report = EventsAndConditions(
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
    report = EventsAndConditions(
        (Event("Normal", "Succeeded", message),),
        (ConditionUpdate(SUCCEEDED, True, "WorkersSucceeded", message),),
    )
    return replace(ending, phase=Phase.SUCCEEDED, report=ending.report + report)


def clean_up(job: Job, workers: Sequence[Pod], done: Set[str]) -> tuple[Deletion, ...]:
    """The workers an ended job deletes by spec.cleanPodPolicy: unfinished ones (Running; finished
    or succeeded ones stay for their logs), every one (All) or none (None). Pods in `done` are
    already going."""
    policy = job.spec.clean_pod_policy
    if policy == CleanPodPolicy.NONE:
        return ()
    keep_finished = policy != CleanPodPolicy.ALL
    return tuple(
        Deletion(p.name, p.uid, job.spec.leave_grace_seconds, "job finished")
        for p in workers
        if not p.deleting and not (keep_finished and (p.finished or p.succeeded)) and p.name not in done
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
    return Timeout(
        staying, stuck, hold, EventsAndConditions((Event("Warning", "WorkersWithdrawn", message),))
    )


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
    return _keep_a_state_holder(chosen, remaining, order)


def _keep_a_state_holder(chosen: list[Pod], remaining: list[Pod], order: Callable[[Pod], Any]) -> list[Pod]:
    """A scale-down that keeps workers keeps one that holds the job's training state: a worker that
    reported progress (rank 0 of a world it trained in). If the victims take every such worker
    while only workers that never trained stay (started together, some still joining), the last
    holder chosen stays and the first of those goes instead; otherwise the leavers would hand their
    state to nobody and the next world would start from the durable checkpoint."""
    holders = [p for p in chosen if p.progress is not None]
    if not remaining or not holders or any(p.progress is not None for p in remaining):
        return chosen
    kept, instead = holders[-1], min(remaining, key=order)
    return [instead if p is kept else p for p in chosen]


def resize(job: Job, active: Sequence[Pod], target: int, disrupted: bool, observed: Observed) -> Sizing:
    """Brings `active` to `target`: deletes the victims (bound ones get their leave grace) or adds new
    workers (pinned where the policy placed them: `growth_pins`); or, when the policy moves the job
    onto one node, deletes its workers elsewhere (`movers`) and adds new ones pinned there; adds none
    while a refused worker's back-off lasts (`Observed.refused`). A new world generation starts when
    the set of workers changes (`disrupted`: it already did this pass), so that every worker of one
    world carries the same number."""
    moving = movers(active, target, disrupted, observed.moves)
    chosen = moving or victims(active, len(active) - target, observed.nodes)
    why = "move onto one node" if moving else "scale down"
    staying = tuple(p for p in active if p not in chosen)
    # While a refused worker's back-off lasts none is created: the workers do not change, and
    # neither does the generation (a pass that changes nothing writes nothing).
    missing = 0 if observed.refused is not None else max(0, target - len(staying))
    generation = (job.status.world_generation or 0) + int(disrupted or bool(chosen) or missing > 0)
    grace = job.spec.leave_grace_seconds
    create = new_workers(job.name, missing, generation, {p.name for p in observed.pods})
    pins = (
        (observed.moves[0],) * len(create)
        if moving
        else growth_pins(observed.growth, create, chosen, disrupted)
    )
    return Sizing(
        target=target,
        active=staying,
        delete=tuple(Deletion(p.name, p.uid, grace if p.node else 0, why) for p in chosen),
        create=create,
        generation=generation,
        pins=pins,
        moved_onto=observed.moves[0] if moving else None,
    )


def growth_pins(
    growth: Sequence[str], create: Sequence[tuple[int, int]], chosen: Sequence[Pod], disrupted: bool
) -> tuple[str, ...]:
    """The nodes the new workers of a plain growth must run on: the policy's (`Allocation.growth`)
    when it placed exactly these new workers beside all of the job's workers, which nothing else
    changed this pass (the policy saw what this pass sees); otherwise none, and the scheduler
    places them (a replacement, a growth the policy did not place)."""
    if not growth or chosen or disrupted or len(growth) != len(create):
        return ()
    return tuple(growth)


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


def rendezvous_and_services(job: Job, observed: Observed, ended: bool, workers: bool) -> ChildrenPlan:
    """A running job has one rendezvous pod (replaced once it ends or its node is gone: PodGC removes
    such a pod only after a long quarantine), its Service and its NetworkPolicy; an ended job
    cleans the pod up (the rest goes with the job). A queued job has its rendezvous pod only while
    Kueue admits it, and gives it up once no worker is left (`workers`: some stay this pass)."""
    name = manifests.rendezvous_name(job.name)
    pods = [p for p in children(job, observed.pods, contract.ROLE_RENDEZVOUS) if not p.deleting]
    if ended:
        cleaning = job.spec.clean_pod_policy != CleanPodPolicy.NONE
        return ChildrenPlan(
            delete=tuple(Deletion(p.name, p.uid, 0, "job finished") for p in pods if cleaning)
        )
    if observed.admission is not None and not observed.admission.admitted:
        still = workers or any(
            p.role == contract.ROLE_WORKER and p.owner_uid == job.uid for p in observed.pods
        )
        return ChildrenPlan(
            delete=() if still else tuple(Deletion(p.name, p.uid, 0, "not admitted") for p in pods),
            create_service=manifests.service_name(job.name) not in observed.services,
            create_network_policy=manifests.network_policy_name(job.name) not in observed.network_policies,
        )
    gone = [p for p in pods if p.finished or (p.node is not None and p.node not in observed.nodes)]
    return ChildrenPlan(
        delete=tuple(Deletion(p.name, p.uid, 0, "rendezvous ended", runs_nowhere=True) for p in gone),
        create_rendezvous_pod=not pods and name not in {p.name for p in observed.pods},
        create_service=manifests.service_name(job.name) not in observed.services,
        create_network_policy=manifests.network_policy_name(job.name) not in observed.network_policies,
    )


def workload_write(
    job: Job, observed: Observed, sizing: Sizing, delete: Sequence[Deletion], final: Phase | None, now: float
) -> Json | PatchWorkload | None:
    """A queued job's Kueue Workload write this pass (`kueue.next_write`; an ended job's slices are
    finished, so that Kueue frees their quota at once); none for a job that is not queued."""
    if observed.admission is None:
        return None
    going = {d.name for d in delete}
    workers = children(job, observed.pods, contract.ROLE_WORKER)
    per_worker = job.gpus_per_worker
    room = observed.free_gpus // per_worker if per_worker else job.spec.replicas.max
    if per_worker and observed.admission.quota_gpus is not None:  # grow only into free quota
        room = min(room, observed.admission.quota_gpus // per_worker)
    return kueue.next_write(
        job,
        observed.admission,
        target=sizing.target,
        pods_left=any(p.owner_uid == job.uid and not p.finished for p in observed.pods)
        or bool(sizing.create),
        workers_leaving=any(p.deleting or p.name in going for p in workers),
        room_workers=room,
        ended=None if final is None else str(final),
        now=now,
    )


def global_batch(job: Job, chosen: int | None, active: Sequence[Pod], ended: bool) -> GlobalBatchPlan:
    """With spec.maxGlobalBatchSize: the policy's B when the spec allows it (else the one in use),
    and the active workers whose annotation differs. The trainers switch together at a step
    boundary once rank 0's projected file shows the new value."""
    spec = job.spec
    if spec.max_global_batch_size is None:
        return GlobalBatchPlan()
    before = manifests.global_batch_in_use(job)
    value = chosen if chosen is not None and spec.allows_global_batch(chosen) else before
    if ended:
        return GlobalBatchPlan(value)
    stale = tuple(BatchUpdate(p.name, p.uid, value) for p in active if p.global_batch != str(value))
    changed = (
        (Event("Normal", "GlobalBatchChanged", f"global batch {before} -> {value}"),)
        if value != before
        else ()
    )
    return GlobalBatchPlan(value, stale, EventsAndConditions(changed))


def memory_budget(
    job: Job, active: Sequence[Pod], nodes: Mapping[str, Node], ended: bool
) -> MemoryBudgetPlan:
    """With spec.bandLimit: the job's budget (`gpu_memory.job_budget_mib`, from the workers that
    stay) and the active workers whose annotation differs. A MemoryBudgetChanged event when it
    moves from what the workers carry; not again while a move is being applied (a worker already
    carries the new value), nor for the first budget a job gets (it is in the annotation)."""
    value = job_budget_mib(job, active, nodes)
    if value is None or ended:
        return MemoryBudgetPlan(value)
    stale = tuple(BudgetUpdate(p.name, p.uid, value) for p in active if p.memory_budget != str(value))
    carried = Counter(p.memory_budget for p in active if p.memory_budget is not None)
    if not carried or str(value) in carried:
        return MemoryBudgetPlan(value, stale)
    [(before, _)] = carried.most_common(1)  # what most workers carry
    message = f"memory budget {before} MiB -> {value} MiB per worker"
    return MemoryBudgetPlan(
        value, stale, EventsAndConditions((Event("Normal", "MemoryBudgetChanged", message),))
    )


def write_steps(plan: Plan, service_accounts: Mapping[str, str]) -> list[Callable[[], Write]]:
    """The writes that carry `plan` out, in order (see `writes`), each built when called: counting
    them builds no manifest, so a plan left for the next pass (`decide.this_pass`) costs no pod
    bodies. `service_accounts` names the ServiceAccount of workers whose template sets none."""
    job = plan.job
    steps: list[Callable[[], Write]] = []
    if plan.status_patch:
        steps.append(partial(PatchStatus, plan.status_patch))
    steps += [partial(DeletePod, d.name, d.uid, d.grace_seconds) for d in plan.delete]
    if plan.create_network_policy:
        steps.append(lambda: CreateChild(ChildKind.NETWORK_POLICY, manifests.network_policy(job)))
    if plan.create_workload is not None:
        steps.append(partial(CreateChild, ChildKind.WORKLOAD, plan.create_workload))
    if plan.patch_workload is not None:
        steps.append(partial(_as_is, plan.patch_workload))
    if plan.create_rendezvous_pod:
        steps.append(lambda: CreateChild(ChildKind.SECRET, manifests.rendezvous_token_secret(job)))
        steps.append(lambda: CreateChild(ChildKind.POD, manifests.rendezvous_pod(job)))
    if plan.create_service:
        steps.append(lambda: CreateChild(ChildKind.SERVICE, manifests.job_service(job)))
    steps += [
        partial(_worker, plan, position, service_accounts) for position in range(len(plan.create_workers))
    ]
    for batch in plan.update_global_batch:
        annotation = {contract.ANNOTATION_GLOBAL_BATCH_SIZE: str(batch.value)}
        steps.append(partial(AnnotatePod, batch.name, batch.uid, annotation))
    for budget in plan.update_memory_budget:
        annotation = {contract.ANNOTATION_MEMORY_BUDGET: str(budget.value)}
        steps.append(partial(AnnotatePod, budget.name, budget.uid, annotation))
    if plan.declare_gone is not None:
        steps.append(partial(_as_is, plan.declare_gone))
    return steps


def _as_is(write: Write) -> Write:
    """A write the plan already holds whole (a Workload patch, a declaration)."""
    return write


def _worker(plan: Plan, position: int, service_accounts: Mapping[str, str]) -> CreateChild:
    """The creation of the plan's new worker at `position`: its manifest with what the plan decided
    for new workers, pinned to its node if the plan pins them."""
    index, generation = plan.create_workers[position]
    body = manifests.worker_pod(
        plan.job,
        index,
        generation,
        service_accounts,
        global_batch=plan.global_batch,
        node=plan.pins[position] if plan.pins else None,
        memory_budget=plan.memory_budget,
        placement=plan.placement,
    )
    return CreateChild(ChildKind.POD, body)


def writes_of(plan: Plan, service_accounts: Mapping[str, str]) -> tuple[Write, ...]:
    """The writes that carry `plan` out, complete and in order (`write_steps`, each built)."""
    return tuple(step() for step in write_steps(plan, service_accounts))


def rendered(plan: Plan, service_accounts: Mapping[str, str]) -> Plan:
    """`plan` carrying its writes, built: what a pass applies (`decide.this_pass`)."""
    writes = writes_of(plan, service_accounts)
    return replace(plan, writes=writes, api_writes=len(writes))
