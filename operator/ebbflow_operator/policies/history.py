"""What the trainers reported about each job, kept for the goodput and quality policies. Pure.

Rank 0 of a job puts its newest progress report (contract.PROGRESS_FIELDS) on its pod; every pass
`record` turns a report the history has not seen yet (by its time) into one step `Measurement`
(world size, micro-batch, accumulation, step and compute seconds, on how many nodes and under which
time-slicing share the job's workers ran; none from a report stamped before the job's last rescale,
which timed another world) and one (step, loss) point, and keeps the newest
MAX_MEASUREMENTS shapes (one per distinct shape: a new report of a known shape replaces the old one,
so a long calm run cannot push out what the job measured at other sizes) and MAX_LOSSES losses
(the first one and the newest: the quality policy normalises a job's loss by where it started).

It lives in the operator's memory (`History`, owned by the reconciler), never in the API: a
restarted operator starts from the priors plus each job's status.progress and refills as reports
arrive (every 5 s); the policies use what is there (no measurement: the prior model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ebbflow_api import contract
from ebbflow_api.models import parse_time

from ..decision.job_status import latest_progress
from ..decision.model import (
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_REPLICAS,
    Job,
    JobKey,
    Json,
    Node,
    Pod,
)
from .job_metrics import DEFAULT_RESCALE_PAUSE_S, JobMetrics
from .packing import NodeDevices
from .throughput import Measurement, compute_speeds

MAX_MEASUREMENTS = 16
MAX_LOSSES = 64


@dataclass(frozen=True)
class JobHistory:
    """One job's recent reports: step shapes (newest last, one per shape) and losses by step."""

    measurements: tuple[Measurement, ...] = ()
    losses: tuple[tuple[float, float], ...] = ()
    last_report: str = ""  # the newest recorded report's time: a report is recorded once
    step: float | None = None
    noise_scale: float | None = None
    rescale_pause_s: float | None = None


@dataclass(frozen=True)
class Where:
    """Where a job's workers ran when they reported: how many nodes, the time-slicing share of the
    most contended one, their GPU type ("" when unknown or mixed), and since when (the job's last
    rescale, POSIX seconds; 0 when unknown): a report stamped before then describes an older world."""

    nodes: int = 1
    share: float = 1.0
    gpu_type: str = ""
    since: float = 0.0


def measurement_of(report: Json, where: Where) -> Measurement | None:
    """The step shape a report describes; None when it lacks one (an older trainer, no step yet) or
    was made in an older world than `where` (stamped no later than the second of the job's last
    rescale: its step time belongs to workers and nodes that are not the job's now)."""
    shape = [report.get(key) for key in ("worldSize", "microBatch", "stepSeconds", "computeSeconds")]
    if not all(isinstance(value, int | float) and value > 0 for value in shape):
        return None
    if where.since and _stamp(report) <= where.since:
        return None
    workers, micro_batch, step_s, compute_s = (float(value) for value in shape)  # type: ignore[arg-type]
    return Measurement(
        workers=int(workers),
        micro_batch=micro_batch,
        step_s=step_s,
        compute_s=compute_s,
        nodes=max(1, where.nodes),
        accum_steps=max(0, int(report.get("accumulationSteps") or 0)),
        share=max(1.0, where.share),
        gpu_type=where.gpu_type,
    )


def _stamp(report: Json) -> float:
    """The report's time in POSIX seconds; +inf when unreadable (nothing says it is old)."""
    try:
        return parse_time(str(report.get("time") or "")) or math.inf
    except ValueError:
        return math.inf


def _same_shape(a: Measurement, b: Measurement) -> bool:
    return replace(a, step_s=0.0, compute_s=0.0) == replace(b, step_s=0.0, compute_s=0.0)


def record(history: JobHistory, report: Json, where: Where) -> JobHistory:
    """`history` with `report` added (unchanged when the report was recorded already)."""
    stamp = str(report.get("time") or "")
    if not stamp or stamp == history.last_report:
        return history
    updated = replace(history, last_report=stamp)
    measured = measurement_of(report, where)
    if measured is not None:
        kept = tuple(m for m in history.measurements if not _same_shape(m, measured))
        updated = replace(updated, measurements=(*kept, measured)[-MAX_MEASUREMENTS:])
    step, loss = report.get("step"), report.get("loss")
    if isinstance(step, int | float):
        updated = replace(updated, step=float(step))
        if isinstance(loss, int | float) and (not history.losses or step > history.losses[-1][0]):
            updated = replace(updated, losses=_keep_first(history.losses, (float(step), float(loss))))
    noise, pause = _non_negative(report, "noiseScale"), _non_negative(report, "rescalePauseSeconds")
    return replace(
        updated,
        noise_scale=history.noise_scale if noise is None else noise,
        rescale_pause_s=history.rescale_pause_s if pause is None else pause,
    )


def _keep_first(
    losses: tuple[tuple[float, float], ...], point: tuple[float, float]
) -> tuple[tuple[float, float], ...]:
    """The first point and the newest: the quality policy normalises by the loss at the job's start."""
    kept = (*losses, point)
    return kept if len(kept) <= MAX_LOSSES else (kept[0], *kept[-(MAX_LOSSES - 1) :])


def _non_negative(report: Json, key: str) -> float | None:
    value = report.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def node_devices(nodes: Iterable[Node], speeds: Mapping[str, float] | None = None) -> dict[str, NodeDevices]:
    """Physical GPUs behind each node's advertised `nvidia.com/gpu` (GPU feature discovery's
    labels; without them every advertised GPU is taken for a physical one), whether it is spot, and
    its GPU type with that type's relative speed (1 when not known)."""
    devices = {}
    for node in nodes:
        physical = node.gpus
        replicas, count = _label_int(node, LABEL_GPU_REPLICAS), _label_int(node, LABEL_GPU_COUNT)
        if count:
            physical = count
        elif replicas and replicas > 1:
            physical = max(1, node.gpus // replicas)
        gpu_type = node.labels.get(LABEL_GPU_PRODUCT, "").removesuffix("-SHARED")
        devices[node.name] = NodeDevices(
            physical=min(physical, node.gpus) or node.gpus,
            replicas=node.gpus,
            spot=node.spot,
            gpu_type=gpu_type,
            speed=(speeds or {}).get(gpu_type, 1.0),
        )
    return devices


def _label_int(node: Node, key: str) -> int | None:
    value = node.labels.get(key, "")
    return int(value) if value.isdigit() else None


def placement_of(
    workers: Sequence[Pod], pods: Sequence[Pod], devices: Mapping[str, NodeDevices], since: float = 0.0
) -> Where:
    """Where the job's running workers are: how many nodes, the time-slicing share of the most
    contended one (GPUs held there by any pod over its physical GPUs, at least 1), their GPU type,
    and `since` (the job's last rescale) passed through."""
    nodes = {p.node for p in workers if p.node and p.holds_gpus}
    share = 1.0
    for node in nodes:
        device = devices.get(node)
        if device and device.physical:
            used = sum(p.gpus for p in pods if p.node == node and p.holds_gpus)
            share = max(share, used / device.physical)
    types = {devices[n].gpu_type if n in devices else "" for n in nodes}
    return Where(len(nodes), share, types.pop() if len(types) == 1 else "", since)


class History:
    """Every job's `JobHistory`, in the operator's memory; forgets jobs that are gone."""

    def __init__(self) -> None:
        self.jobs: dict[JobKey, JobHistory] = {}

    def update(self, jobs: Sequence[Job], pods: Sequence[Pod], devices: Mapping[str, NodeDevices]) -> None:
        """Records each job's newest report: from its workers' annotations, else its status."""
        by_job: dict[JobKey, list[Pod]] = {}
        for pod in pods:
            if pod.job is not None and pod.role == contract.ROLE_WORKER:
                by_job.setdefault((pod.namespace, pod.job), []).append(pod)
        for job in jobs:
            workers = [p for p in by_job.get(job.key, []) if p.owner_uid == job.uid]
            report = latest_progress(workers) or _status_report(job)
            previous = self.jobs.get(job.key, JobHistory())
            if report is None:
                self.jobs[job.key] = previous
                continue
            rescaled = job.status.last_rescale
            since = (parse_time(rescaled.time) or 0.0) if rescaled else 0.0
            self.jobs[job.key] = record(previous, report, placement_of(workers, pods, devices, since))
        alive = {job.key for job in jobs}
        self.jobs = {key: h for key, h in self.jobs.items() if key in alive}

    def speeds(self) -> dict[str, float]:
        """Each GPU type's relative compute speed, pooled over every job measured on two types."""
        return compute_speeds(h.measurements for h in self.jobs.values())

    def metrics(self, jobs: Sequence[Job], speeds: Mapping[str, float]) -> dict[JobKey, JobMetrics]:
        """What the policies read for each job: its batch shape and its history, each measurement
        carrying its GPU type's speed."""
        found = {}
        for job in jobs:
            history = self.jobs.get(job.key, JobHistory())
            found[job.key] = JobMetrics(
                global_batch=job.spec.global_batch_size,
                virtual_nodes=job.spec.resolved_virtual_nodes,
                max_batch=job.spec.max_global_batch_size,
                current_batch=job.status.global_batch_size,
                measurements=tuple(
                    replace(m, speed=speeds.get(m.gpu_type, 1.0)) for m in history.measurements
                ),
                noise_scale=history.noise_scale,
                rescale_pause_s=history.rescale_pause_s or DEFAULT_RESCALE_PAUSE_S,
                rescales=job.status.world_generation or 0,
                losses=history.losses,
                step=history.step,
            )
        return found


def _status_report(job: Job) -> Json | None:
    progress = job.status.progress
    return progress.model_dump(by_alias=True, exclude_none=True) if progress is not None else None
