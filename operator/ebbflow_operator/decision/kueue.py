"""Kueue admission, pure: what a queued job's Workloads let it run, and the writes that keep them in
step with the job (docs/operator.md, "Under Kueue").

A job labeled `kueue.x-k8s.io/queue-name` is queued when the operator runs with Kueue enabled. Kueue
accounts it through Workload "slices" the job owns (Kueue's ElasticJobsViaWorkloadSlices), named
`<job>-<n>`: pod set `workers` (count spec.replicas.max, minCount spec.replicas.min: Kueue may admit
fewer) and pod set `rendezvous` (one pod). A bigger slice replaces the admitted one when the job
could grow; a graceful shrink lowers the admitted slice's count in place; an evicted slice is
released once the job has emptied, and Kueue queues it again (`next_write`: one write a pass).

Invariants: a queued job runs no pod before a slice is admitted and never more workers than the
admission counts (decide.py caps its demand there); every write names the Workload's uid and
resourceVersion (a JSON patch `test`), so a pass that saw a stale version changes nothing; slice
names are deterministic, so a repeated create is AlreadyExists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ebbflow_api import contract
from ebbflow_api.models import GPU_RESOURCE

from . import manifests
from .model import Job, Json, Placement, format_time, parse_time
from .writes import PatchWorkload

ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"  # Kueue's workloadslicing.EnabledAnnotationKey
REPLACEMENT_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
WORKERS = "workers"
RENDEZVOUS = "rendezvous"
API_VERSION = "kueue.x-k8s.io/v1beta2"
# Kueue's eviction reasons after which it sets Requeued True (its job integrations do the same).
REQUEUED_EVICTIONS = frozenset({"Preempted", "NodeFailures"})
# Kueue's scheduler finishes a replaced slice (this reason) *before* it writes its replacement's
# admission; for this long the job keeps the replaced slice's count while the admission is not seen.
SLICE_REPLACED = "WorkloadSliceReplaced"
REPLACEMENT_WINDOW_S = 30.0


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""
    since: float | None = None  # lastTransitionTime


@dataclass(frozen=True)
class Workload:
    """What the decisions need of one Kueue Workload."""

    name: str
    namespace: str
    uid: str
    version: str  # metadata.resourceVersion: the writes apply only to this version
    owner_uid: str | None
    created: float
    generation: int
    workers: int  # spec.podSets[workers].count
    admitted_workers: int | None  # status.admission's count for workers; None without a reservation
    cluster_queue: str = ""
    reserved_gpus: int = 0  # the GPUs its quota reservation holds at its current counts
    worker_flavors: tuple[str, ...] = ()  # the ResourceFlavors the admission assigned to the workers
    replacement_for: str | None = None
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    raw_conditions: tuple[Json, ...] = ()  # as the API holds them, for a status patch

    def condition(self, kind: str) -> bool:
        found = self.conditions.get(kind)
        return found is not None and found.status

    @property
    def finished(self) -> bool:
        return self.condition("Finished")

    @property
    def evicted(self) -> bool:
        return self.condition("Evicted")

    @property
    def admitted(self) -> bool:
        """Kueue reserved its quota and every admission check passed: its pods may run."""
        return self.admitted_workers is not None and self.condition("Admitted") and not self.evicted


def parse_workload(raw: Mapping[str, Any]) -> Workload:
    metadata, spec, status = raw["metadata"], raw.get("spec", {}), raw.get("status") or {}
    owner = next((o for o in metadata.get("ownerReferences") or [] if o.get("controller")), None)
    counts = {ps["name"]: int(ps.get("count", 1)) for ps in spec.get("podSets") or []}
    admission = status.get("admission")
    admitted, flavors, reserved = None, (), 0
    if admission:
        assigned = {a["name"]: a for a in admission.get("podSetAssignments") or []}
        reserved = sum(_held_gpus(a, counts.get(name)) for name, a in assigned.items())
        workers = assigned.get(WORKERS) or {}
        # An admission never changes; a slice's count lowered in place since (a graceful shrink) is
        # what stays admitted.
        admitted = min(int(workers.get("count") or counts.get(WORKERS, 0)), counts.get(WORKERS, 0))
        flavors = tuple(sorted(set((workers.get("flavors") or {}).values())))
    conditions = tuple(status.get("conditions") or [])
    return Workload(
        name=metadata["name"],
        namespace=metadata.get("namespace", ""),
        uid=metadata.get("uid", ""),
        version=str(metadata.get("resourceVersion", "")),
        owner_uid=owner.get("uid") if owner else None,
        created=parse_time(metadata.get("creationTimestamp")) or 0.0,
        generation=int(metadata.get("generation") or 0),
        workers=counts.get(WORKERS, 0),
        admitted_workers=admitted,
        cluster_queue=str((admission or {}).get("clusterQueue", "")),
        reserved_gpus=reserved,
        worker_flavors=flavors,
        replacement_for=(metadata.get("annotations") or {}).get(REPLACEMENT_ANNOTATION),
        conditions={
            c["type"]: Condition(
                c["type"],
                c.get("status") == "True",
                c.get("reason", ""),
                c.get("message", ""),
                parse_time(c.get("lastTransitionTime")),
            )
            for c in conditions
        },
        raw_conditions=conditions,
    )


def _held_gpus(assignment: Mapping[str, Any], count: int | None) -> int:
    """A pod set's GPUs under its admission, at the pod set's current count (it may have been
    lowered in place since: Kueue then counts the lower one)."""
    used = int(str((assignment.get("resourceUsage") or {}).get(GPU_RESOURCE, 0)))
    assigned = int(assignment.get("count") or 0)
    if not assigned or count is None or count >= assigned:
        return used
    return used * count // assigned


@dataclass(frozen=True)
class Flavor:
    """A Kueue ResourceFlavor: the node labels and tolerations its admitted pods get."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Json, ...] = ()


def parse_flavor(raw: Mapping[str, Any]) -> Flavor:
    spec = raw.get("spec") or {}
    return Flavor(
        raw["metadata"]["name"],
        dict(spec.get("nodeLabels") or {}),
        tuple(dict(t) for t in spec.get("tolerations") or []),
    )


@dataclass(frozen=True)
class Admission:
    """What Kueue lets a queued job run (`workers`: the admitted slice's count, 0 when none is
    admitted), where its flavors put the workers, its slices, and the job's Admitted condition."""

    workers: int
    admitted: bool
    reason: str
    message: str
    live: tuple[Workload, ...] = ()  # the slices Kueue has not finished, oldest first
    running: Workload | None = None  # the admitted one
    placement: Placement = field(default_factory=Placement)
    # Set by kueue_room.make_room where the ClusterQueue is known: the first slice's count (0: not
    # yet, lower-priority jobs are making room; None: spec.replicas.max), and the GPUs of quota
    # free for the job to grow into (None: no limit known).
    first_workers: int | None = None
    quota_gpus: int | None = None


def slice_name(job: str, index: int) -> str:
    return f"{job}-{index}"


def _slice_index(job: str, name: str) -> int:
    prefix = f"{job}-"
    tail = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else 0


def live_slices(job: Job, workloads: Sequence[Workload]) -> list[Workload]:
    """The job's slices Kueue has not finished, oldest first."""
    own = [w for w in workloads if w.owner_uid == job.uid and not w.finished]
    return sorted(own, key=lambda w: (_slice_index(job.name, w.name), w.created))


def admission_of(
    job: Job, workloads: Sequence[Workload], now: float, flavors: Mapping[str, Flavor] | None = None
) -> Admission:
    """The job's admission as its slices tell (`workloads`: any in its namespace; `flavors`: the
    ResourceFlavors by name). A slice Kueue has just replaced still counts while its replacement's
    admission is not seen (`REPLACEMENT_WINDOW_S`), with no slice to write to meanwhile."""
    live = tuple(live_slices(job, workloads))
    running = next((w for w in live if w.admitted), None)
    if running is not None:
        count = running.admitted_workers or 0
        message = f"{running.name} admitted by ClusterQueue {running.cluster_queue}: {count} worker(s)"
        placement = placement_of(running.worker_flavors, flavors or {})
        return Admission(count, True, "Admitted", message, live, running, placement)
    replaced = _just_replaced(live, workloads, now)
    if replaced is not None:
        count = replaced.admitted_workers or 0
        message = (
            f"{replaced.name} replaced by {live[-1].name}, whose admission is on its way: {count} worker(s)"
        )
        placement = placement_of(replaced.worker_flavors, flavors or {})
        return Admission(count, True, "Admitted", message, live, None, placement)
    if not live:
        return Admission(0, False, "Creating", "creating the job's Kueue Workload")
    newest = live[-1]
    evicted = newest.conditions.get("Evicted")
    if evicted is not None and evicted.status:
        return Admission(0, False, f"Evicted{evicted.reason}", f"{newest.name}: {evicted.message}", live)
    pending = newest.conditions.get("QuotaReserved")
    message = pending.message if pending is not None and pending.message else "waiting for Kueue"
    return Admission(0, False, "Pending", f"{newest.name}: {message}", live)


def _just_replaced(live: Sequence[Workload], workloads: Sequence[Workload], now: float) -> Workload | None:
    """The admitted slice that the newest live one replaces, if Kueue finished it for that within
    REPLACEMENT_WINDOW_S: its replacement is being admitted."""
    if not live or live[-1].replacement_for is None:
        return None
    namespace, _, name = live[-1].replacement_for.rpartition("/")
    for workload in workloads:
        finished = workload.conditions.get("Finished")
        if (
            (workload.namespace, workload.name) == (namespace, name)
            and workload.admitted_workers is not None
            and finished is not None
            and finished.status
            and finished.reason == SLICE_REPLACED
            and now - (finished.since or 0.0) < REPLACEMENT_WINDOW_S
        ):
            return workload
    return None


def placement_of(names: Sequence[str], flavors: Mapping[str, Flavor]) -> Placement:
    """The node labels and tolerations of the flavors assigned to the workers (Kueue assigns one
    flavor per resource group; their labels and tolerations all apply)."""
    labels: dict[str, str] = {}
    tolerations: list[Json] = []
    for name in names:
        flavor = flavors.get(name)
        if flavor is not None:
            labels |= flavor.node_labels
            tolerations += [t for t in flavor.tolerations if t not in tolerations]
    return Placement(labels, tuple(tolerations))


def next_write(
    job: Job,
    admission: Admission,
    *,
    target: int,
    pods_left: bool,
    workers_leaving: bool,
    room_workers: int,
    ended: str | None,
    now: float,
) -> Json | PatchWorkload | None:
    """The one Workload write this pass needs (a new slice's body, or a patch), as Kueue's own
    EnsureWorkloadSlices decides for its Job integration:

        the job ended                 its live slices are finished, one a pass: the quota goes back
        no live slice                 slice 1 asking for spec.replicas.max (Kueue may admit down to min)
        two live slices               `_settle_replacement`
        one, evicted, job emptied     `_release`: its reservation goes, Kueue queues it again
        one, admitted, none leaving   `_resize`: shrink in place, or a bigger slice to replace it

    `target`: the workers the job keeps this pass; `pods_left`: some pod of the job is still
    there; `workers_leaving`: some worker is still on its way out; `room_workers`: how many more
    workers the free GPUs on its nodes could take; `ended`: the job's final phase, if it has one."""
    live, running = admission.live, admission.running
    if ended is not None:
        return _finish(live[0], now, ended, f"the job {ended.lower()}") if live else None
    if not live:
        first = job.spec.replicas.max if admission.first_workers is None else admission.first_workers
        return slice_body(job, 1, first, None) if first else None
    if len(live) >= 2:
        return _settle_replacement(job, live[0], live[-1], room_workers, now)
    if live[0].evicted:
        return _release(live[0], now) if not pods_left and live[0].admitted_workers is not None else None
    if running is None or workers_leaving:
        return None
    return _resize(job, running, target, room_workers)


def _settle_replacement(
    job: Job, old: Workload, new: Workload, room_workers: int, now: float
) -> PatchWorkload | None:
    """Two live slices: the older is finished once the newer has quota (Kueue admitted it as the
    replacement) or the older lost its own (Kueue's EnsureWorkloadSlices does the same); while the
    newer waits, its count follows the room there is (it holds no quota, so any count may change)."""
    if new.admitted_workers is not None or old.admitted_workers is None or old.evicted:
        return _finish(old, now)
    wanted = _grown(job, old.admitted_workers, room_workers)
    if wanted > old.admitted_workers and wanted != new.workers:
        return PatchWorkload(new.name, (*_guard(new), _replace("/spec/podSets/0/count", wanted)))
    return None


def _grown(job: Job, admitted: int, room_workers: int) -> int:
    return min(job.spec.replicas.max, admitted + max(0, room_workers))


def _resize(job: Job, running: Workload, target: int, room_workers: int) -> Json | PatchWorkload | None:
    """An admitted slice and no worker leaving: a shrink lowers its count to what stays, so the
    quota goes back to the queue (Kueue allows an admitted slice's count to fall, nothing else to
    change); a job using all of its admission, with room for more workers, asks for a bigger slice
    that replaces this one (all or nothing: a partial admission could replace it with its own size)."""
    admitted, spec = running.admitted_workers or 0, job.spec.replicas
    keep = max(target, spec.min)
    if keep < running.workers and keep < admitted:
        count = _replace("/spec/podSets/0/count", keep)  # slice_body puts the workers pod set first
        return PatchWorkload(running.name, (*_guard(running), count))
    wanted = _grown(job, admitted, room_workers)
    if target >= admitted and wanted > admitted:
        return slice_body(job, _slice_index(job.name, running.name) + 1, wanted, running)
    return None


def _guard(workload: Workload) -> tuple[Json, ...]:
    return (
        {"op": "test", "path": "/metadata/uid", "value": workload.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": workload.version},
    )


def _replace(path: str, value: object) -> Json:
    return {"op": "replace", "path": path, "value": value}


def _with_conditions(workload: Workload, updates: Sequence[Json], now: float) -> list[Json]:
    """The Workload's conditions with `updates` set (Kueue's SetStatusCondition: the transition time
    moves only when the status does)."""
    stamp = format_time(now)
    merged = {c["type"]: dict(c) for c in workload.raw_conditions}
    for update in updates:
        before = merged.get(update["type"])
        since = before["lastTransitionTime"] if before and before.get("status") == update["status"] else stamp
        merged[update["type"]] = {
            **update,
            "observedGeneration": workload.generation,
            "lastTransitionTime": since,
        }
    return list(merged.values())


def _condition(kind: str, status: bool, reason: str, message: str) -> Json:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
    }


def _finish(
    workload: Workload,
    now: float,
    reason: str = "OutOfSync",
    message: str = "The workload slice is out of sync with its parent job",
) -> PatchWorkload:
    """Mark a slice Finished: replaced (Kueue's WorkloadFinishedReasonOutOfSync), or its job ended."""
    conditions = _with_conditions(workload, [_condition("Finished", True, reason, message)], now)
    ops = (*_guard(workload), _replace("/status/conditions", conditions))
    return PatchWorkload(workload.name, ops, status=True)


def _release(workload: Workload, now: float) -> PatchWorkload:
    """Release an evicted slice's quota reservation once the job has emptied, as Kueue's job
    integrations do: Requeued (True after a preemption), QuotaReserved False, Admitted False."""
    evicted = workload.conditions["Evicted"]
    updates = [
        _condition("Requeued", evicted.reason in REQUEUED_EVICTIONS, evicted.reason, evicted.message),
        _condition("QuotaReserved", False, "Pending", evicted.message),
    ]
    if workload.condition("Admitted"):
        updates.append(_condition("Admitted", False, "NoReservation", "The workload has no reservation"))
    conditions = _with_conditions(workload, updates, now)
    ops = (
        *_guard(workload),
        _replace("/status/conditions", conditions),
        {"op": "remove", "path": "/status/admission"},
    )
    return PatchWorkload(workload.name, ops, status=True)


def _with_requests(pod_spec: Json) -> Json:
    """Kueue counts a pod set's requests; a container that sets only limits (GPUs usually do) gets
    them as requests, as the API server defaults them for a real pod."""
    spec = copy.deepcopy(pod_spec)
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        resources = container.setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        for name, value in (resources.get("limits") or {}).items():
            requests.setdefault(name, value)
    return spec


def slice_body(job: Job, index: int, workers: int, replacing: Workload | None) -> Json:
    """A Workload slice for the job: `workers` workers and the rendezvous pod. The first slice lets
    Kueue admit down to spec.replicas.min; a replacement (`replacing`) is all or nothing."""
    worker_spec = manifests.worker_pod(job, 0, 0, {})["spec"]
    rendezvous_spec = manifests.rendezvous_pod(job)["spec"]
    worker_set: Json = {"name": WORKERS, "count": workers, "template": {"spec": _with_requests(worker_spec)}}
    if replacing is None and job.spec.replicas.min < workers:
        worker_set["minCount"] = job.spec.replicas.min
    annotations = {ELASTIC_ANNOTATION: "true"}
    if replacing is not None:
        annotations[REPLACEMENT_ANNOTATION] = f"{replacing.namespace}/{replacing.name}"
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": slice_name(job.name, index),
            "namespace": job.namespace,
            "labels": {contract.LABEL_JOB_NAME: job.name},
            "annotations": annotations,
            "ownerReferences": [manifests.owner_reference(job)],
        },
        "spec": {
            "queueName": job.queue or "",
            "priority": job.spec.priority,
            "podSets": [
                worker_set,
                {"name": RENDEZVOUS, "count": 1, "template": {"spec": _with_requests(rendezvous_spec)}},
            ],
        },
    }
