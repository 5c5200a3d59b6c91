"""What the trainers reported about one job, as the goodput and quality policies read it, and the
priors of a job that reported nothing. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..decision.allocator import Demand
from ..decision.model import JobKey
from .throughput import JobModel, Measurement, ThroughputParams, fit_cached

DEFAULT_RESCALE_PAUSE_S = 30.0
NO_WORKERS_PENALTY = 1e9  # 1/speedup of a job with no workers: any first worker beats any growth


@dataclass(frozen=True)
class JobMetrics:
    """What the trainers reported for one job (all optional but the batch shape)."""

    global_batch: int  # B0: the spec's globalBatchSize (the batch the learning rate was tuned for)
    virtual_nodes: int
    measurements: tuple[Measurement, ...] = ()
    noise_scale: float | None = None  # gradient noise scale phi
    rescale_pause_s: float = DEFAULT_RESCALE_PAUSE_S  # measured pause of one rescale
    rescales: int = 0  # how many times the job was resized so far
    losses: tuple[tuple[float, float], ...] = ()  # (step, loss)
    step: float | None = None  # steps done; defaults to the last loss report's step
    max_batch: int | None = None  # the spec's maxGlobalBatchSize: B may move in [B0, this]; None fixed
    current_batch: int | None = None  # the B the job runs at now (status.globalBatchSize), if chosen

    def model(self) -> JobModel:
        params = fit_cached(self.measurements) if self.measurements else ThroughputParams.prior()
        return JobModel(
            params, self.global_batch, self.virtual_nodes, self.noise_scale, max_batch=self.max_batch
        )

    def steps_done(self) -> float:
        if self.step is not None:
            return self.step
        return max((k for k, _ in self.losses), default=0.0)


def metrics_of(demands: Sequence[Demand], metrics: Mapping[JobKey, JobMetrics]) -> dict[JobKey, JobMetrics]:
    """Each job's metrics, the defaults built only for the jobs that reported none."""
    return {d.key: m if (m := metrics.get(d.key)) is not None else default_metrics(d) for d in demands}


def default_metrics(demand: Demand) -> JobMetrics:
    """A job that reported nothing: one virtual node per possible worker, prior models."""
    virtual = max(1, demand.max, demand.min)
    return JobMetrics(global_batch=32 * virtual, virtual_nodes=virtual)
