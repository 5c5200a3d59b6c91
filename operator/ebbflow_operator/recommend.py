"""The time/cost recommender (Tyagi & Sharma's question for elastic jobs): which configuration of
workers and GPU type trains a job cheapest within a deadline, or fastest within a budget. Pure.

From measured steps of one job (`Sample`: a `throughput.Measurement` on a GPU type) it fits the
Pollux step-time model (`throughput.fit`) on the type measured most (the reference), and a relative
compute speed for every other measured type (the median of reference-predicted over measured
compute seconds per micro-batch; sync is taken to be the same on every type). Types with no
measurement use the speed the price table declares. Then every offer x worker count is predicted:
step seconds at its placement (workers packed on as few nodes as the offer's node size allows),
hours for the job's remaining steps, and cost = workers x price per GPU-hour x hours.

`held_out_errors` says how far to trust it: each sample predicted by a fit of all the others.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .throughput import Measurement, Placement, ThroughputParams, fit, step_shape


@dataclass(frozen=True)
class Sample:
    """One measured configuration of the job: its step shape and times, on `gpu_type`."""

    gpu_type: str
    measurement: Measurement


@dataclass(frozen=True)
class Offer:
    """A GPU type one can rent: its price, node size, how many, and its speed if never measured."""

    gpu_type: str
    price_per_gpu_hour: float
    gpus_per_node: int = 8
    max_gpus: int = 64
    speed: float = 1.0  # relative to the reference type; used only without measurements


@dataclass(frozen=True)
class Goal:
    """The job (steps left, batch shape) and the constraint: a deadline, a budget, or neither."""

    steps: int
    global_batch: int
    virtual_nodes: int
    deadline_hours: float | None = None
    budget: float | None = None


@dataclass(frozen=True)
class Option:
    """One predicted configuration."""

    gpu_type: str
    workers: int
    nodes: int
    step_s: float
    hours: float
    cost: float


@dataclass(frozen=True)
class Model:
    """The fitted step-time model of the reference type and every measured type's compute speed."""

    params: ThroughputParams
    reference: str
    speeds: dict[str, float]

    def step_s(self, gpu_type: str, speed: float, placement: Placement, micro: float, accum: int) -> float:
        """Predicted step seconds on `gpu_type` (`speed` when it was never measured)."""
        factor = 1.0 / self.speeds.get(gpu_type, speed)
        params = replace(
            self.params, alpha_c=self.params.alpha_c * factor, beta_c=self.params.beta_c * factor
        )
        return params.step_s(placement, micro, accum)


def fit_model(samples: Sequence[Sample]) -> Model:
    """The reference type's fit plus a compute speed per other measured type."""
    if not samples:
        raise ValueError("no measurements: run the job at a few sizes first (see docs/recommender.md)")
    reference = Counter(s.gpu_type for s in samples).most_common(1)[0][0]
    params = fit([s.measurement for s in samples if s.gpu_type == reference])
    speeds = {reference: 1.0}
    for gpu_type in {s.gpu_type for s in samples} - {reference}:
        ratios = [
            params.compute_s(s.measurement.micro_batch) / s.measurement.compute_s
            for s in samples
            if s.gpu_type == gpu_type and s.measurement.compute_s > 0
        ]
        if ratios:
            speeds[gpu_type] = statistics.median(ratios)
    return Model(params, reference, speeds)


def predict(model: Model, offer: Offer, workers: int, goal: Goal) -> Option:
    """Time and cost of running the rest of the job on `workers` GPUs of `offer`."""
    nodes = math.ceil(workers / max(1, offer.gpus_per_node))
    micro, accum = step_shape(goal.global_batch, goal.virtual_nodes, workers)
    step_s = model.step_s(offer.gpu_type, offer.speed, Placement(workers, nodes), micro, accum)
    hours = goal.steps * step_s / 3600.0
    return Option(offer.gpu_type, workers, nodes, step_s, hours, workers * offer.price_per_gpu_hour * hours)


def options(model: Model, offers: Sequence[Offer], goal: Goal) -> list[Option]:
    """Every offer at every worker count up to its supply and the job's virtual nodes."""
    return [
        predict(model, offer, workers, goal)
        for offer in offers
        for workers in range(1, min(offer.max_gpus, goal.virtual_nodes) + 1)
    ]


def choose(candidates: Sequence[Option], goal: Goal) -> Option | None:
    """Cheapest within the deadline, else fastest within the budget, else fastest; None when no
    option meets the constraint."""
    if goal.deadline_hours is not None:
        fitting = [o for o in candidates if o.hours <= goal.deadline_hours]
        return min(fitting, key=lambda o: (o.cost, o.hours), default=None)
    if goal.budget is not None:
        fitting = [o for o in candidates if o.cost <= goal.budget]
        return min(fitting, key=lambda o: (o.hours, o.cost), default=None)
    return min(candidates, key=lambda o: (o.hours, o.cost), default=None)


def held_out_errors(samples: Sequence[Sample]) -> list[float]:
    """|predicted - measured| / measured step time of each sample, from a fit of all the others
    (leave one out); samples whose type has no other measurement are skipped."""
    errors = []
    for index, held in enumerate(samples):
        rest = [s for i, s in enumerate(samples) if i != index]
        if not any(s.gpu_type == held.gpu_type for s in rest):
            continue
        model = fit_model(rest)
        m = held.measurement
        predicted = model.step_s(
            held.gpu_type, 1.0, Placement(m.workers, m.nodes, m.share), m.micro_batch, m.accum_steps
        )
        errors.append(abs(predicted - m.step_s) / m.step_s)
    return errors
