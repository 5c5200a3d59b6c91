"""The quality policy (SLAQ): each GPU goes to the job whose normalised loss would fall most over
the next horizon. Pure: demands, free GPUs, metrics -> counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..decision.allocator import (
    Allocation,
    Demand,
)
from ..decision.model import JobKey
from .greedy import (
    PassJobs,
    allocate_greedily,
    breakpoints_of,
    growth_nodes,
)
from .job_metrics import JobMetrics, metrics_of
from .loss_curve import LossCurve, fit_loss_curve
from .packing import NodeDevices, SlicedPacking
from .throughput import JobModel, Placement


@lru_cache(maxsize=4096)
def _curve(losses: tuple[tuple[float, float], ...]) -> LossCurve | None:
    """The job's fitted curve, memoised across passes; None below 3 reports."""
    return fit_loss_curve(losses)


@dataclass(frozen=True)
class QualityPolicy:
    """SLAQ: give each GPU to the job whose normalised loss would fall most over the next `horizon_s`.

    A job's utility at a placement is its fitted loss curve's normalised reduction over the steps
    it would make in the horizon (steps/s from the throughput model, time-slicing included). Jobs
    with fewer than 3 loss reports use `LossCurve.prior` from step 0, set to halve the loss over
    the horizon on the job's minimum (at least one worker): new jobs are early, with big
    reductions, as SLAQ observes, but more GPUs still help them by a finite amount.
    """

    metrics: Mapping[JobKey, JobMetrics] = field(default_factory=dict)
    devices: Mapping[str, NodeDevices] = field(default_factory=dict)
    now: float = 0.0  # unused: the curves carry their own steps; kept so both policies build alike
    horizon_s: float = 300.0
    name: str = field(default="quality")

    def decide(self, demands: Sequence[Demand], free: Mapping[str, int]) -> Allocation:
        """The counts and where each growing job's new workers go (`Allocation.growth`)."""
        info = metrics_of(demands, self.metrics)
        objective = _QualityObjective(self, info)
        packing = SlicedPacking(free, self.devices)
        counts = allocate_greedily(demands, packing, objective.utility, breakpoints_of(info))
        return Allocation(counts, growth=growth_nodes(demands, counts, packing, ()))

    def allocate(self, demands: Sequence[Demand], free: Mapping[str, int]) -> dict[JobKey, int]:
        return self.decide(demands, free).counts

    def _curve(self, demand: Demand, metrics: JobMetrics, model: JobModel) -> tuple[LossCurve, float]:
        """(curve, the step the job is at): fitted, or the prior from step 0."""
        fitted = _curve(metrics.losses)
        if fitted is not None:
            return fitted, metrics.steps_done()
        half = self.horizon_s / model.step_s(Placement(max(1, demand.min)))
        return LossCurve.prior(half), 0.0


class _QualityObjective(PassJobs[tuple[JobModel, LossCurve, float]]):
    """One pass's quality objective: per job (model, loss curve, the step it is at), and the
    normalised loss reduction over the policy's horizon at a placement."""

    def __init__(self, policy: QualityPolicy, info: Mapping[JobKey, JobMetrics]) -> None:
        super().__init__()
        self.policy, self.info = policy, info

    def _make(self, demand: Demand) -> tuple[JobModel, LossCurve, float]:
        model = self.info[demand.key].model()
        return model, *self.policy._curve(demand, self.info[demand.key], model)

    def utility(self, demand: Demand, placement: Placement) -> float:
        if placement.workers <= 0:
            return 0.0
        model, curve, step = self.job(demand)
        return curve.normalised_reduction(step, self.policy.horizon_s / model.step_s(placement))
