"""The job's status as one pass decides it: the phase and conditions (`readiness` holds the job's
lifecycle), the events and fields that outlive the pass, and what the trainers last reported. Pure.

Invariant: the status written with a worker's count drops it from `workerNodes`, so a repeated pass
never counts it twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ebbflow_api import contract
from ebbflow_api.models import Condition, Phase

from . import manifests
from .model import Job, Json, Pod, format_time, parse_progress
from .plan import (
    Ending,
    Event,
    EventsAndConditions,
    Hold,
    Observed,
    PlannerConfig,
    RescaleReason,
    Sizing,
    StatusUpdate,
    Timeout,
    Workers,
    children,
)
from .status import (
    ADMITTED,
    LEAVE_TIMED_OUT,
    PREEMPTED,
    READY,
    SCHEDULABLE,
    ConditionUpdate,
    set_conditions,
)


def report_losses(lost: Mapping[str, str], preemptions: int) -> EventsAndConditions:
    """The Preempted condition and a warning naming each lost worker; `preemptions` is the new total."""
    if not lost:
        return EventsAndConditions()
    names = ", ".join(f"{name} ({why})" for name, why in sorted(lost.items()))
    message = f"lost {names}; preemptions so far: {preemptions}"
    return EventsAndConditions(
        (Event("Warning", PREEMPTED, f"lost {len(lost)} worker(s): {names}"),),
        (ConditionUpdate(PREEMPTED, True, sorted(lost.values())[0], message),),
    )


def report_late_leaves(late: Sequence[Pod], conditions: Iterable[Condition]) -> EventsAndConditions:
    """The LeaveTimedOut condition and a warning for each worker killed past its leave grace, quoting
    its termination message; one the condition names already (an earlier pass saw it) is not
    reported again."""
    current = next((c.message for c in conditions if c.type == LEAVE_TIMED_OUT), "")
    report = EventsAndConditions()
    for pod in late:
        why = pod.termination_message or "killed past its leave grace"
        message = f"{pod.name} exited {pod.exit_code}: {why}"
        if message != current:
            condition = ConditionUpdate(LEAVE_TIMED_OUT, True, "GraceExceeded", message)
            report += EventsAndConditions((Event("Warning", LEAVE_TIMED_OUT, message),), (condition,))
    return report


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
    scheduling: tuple[ConditionUpdate, ...] = (
        () if ending.ended else (schedulable(job, target, timeout.hold, observed, config),)
    )
    admission = observed.admission
    if admission is not None and not ending.ended:
        scheduling += (ConditionUpdate(ADMITTED, admission.admitted, admission.reason, admission.message),)
    rescaled: tuple[Event, ...] = (
        (Event("Normal", "Rescaled", f"{before} -> {target} workers ({reason})"),) if reason else ()
    )
    if sizing.moved_onto is not None:
        message = (
            f"onto node {sizing.moved_onto}: {len(sizing.create)} new workers there, the "
            f"{len(sizing.delete)} on other nodes leave; {target} workers on one node"
        )
        rescaled += (Event("Normal", "MovedOntoOneNode", message),)
    report = report_losses(seen.lost, preemptions) + ending.report + timeout.report
    report += report_late_leaves(seen.left_late, status.conditions)
    report += EventsAndConditions(rescaled, (*scheduling, ready_condition))
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
        **lasting_fields(status.to_json(), phase, stamp, rescale, timeout.hold, progress),
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
    job: Job, target: int, hold: Hold | None, observed: Observed, config: PlannerConfig
) -> ConditionUpdate:
    """The Schedulable condition: the size allocated, or why the job has no workers (the API server
    refused one, Kueue has not admitted it, a pending timeout held it below its minimum, or too few
    GPUs are free on the nodes it may use)."""
    spec = job.spec
    if observed.refused is not None:
        refused = observed.refused
        message = (
            f"the API server refused to create worker {refused.pod}: {refused.message}; change "
            f"spec.template (or the namespace's policy) to comply; tried again "
            f"no sooner than {config.refusal_backoff:.0f} s after {format_time(refused.at)}"
        )
        return ConditionUpdate(SCHEDULABLE, False, "WorkerRefused", message)
    if target > 0:
        message = f"{target} worker(s) allocated in [{spec.replicas.min}, {spec.replicas.max}]"
        return ConditionUpdate(SCHEDULABLE, True, "Allocated", message)
    if observed.admission is not None and not observed.admission.admitted:
        message = f"waiting for Kueue to admit it: {observed.admission.message}"
        return ConditionUpdate(SCHEDULABLE, False, "WaitingForAdmission", message)
    if hold is not None and hold.replicas < spec.replicas.min:
        message = (
            f"only {hold.replicas} of min {spec.replicas.min} workers were scheduled within "
            f"{config.pending_timeout:.0f}s; retrying after {format_time(hold.until)}"
        )
        return ConditionUpdate(SCHEDULABLE, False, "PendingTimeout", message)
    message = (
        f"needs min {spec.replicas.min} workers x {job.gpus_per_worker} GPU(s) on nodes "
        f"it may use; {observed.free_gpus} GPU(s) free there for it"
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


def lasting_fields(
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
