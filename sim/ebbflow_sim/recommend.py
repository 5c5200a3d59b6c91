"""The time/cost recommender (Tyagi & Sharma's question for elastic jobs): which configuration of
workers and GPU type trains a job cheapest within a deadline, or fastest within a budget. Pure.

From measured steps of one job (`throughput.Measurement`s, each on a `gpu_type`) it learns a
relative compute speed per measured type (`throughput.compute_speeds`: the type measured most is
the reference, speed 1; sync is taken to be the same on every type), fits the Pollux step-time
model to all measurements normalised to the reference (`throughput.fit`), and predicts every
offer x worker count: step seconds at its placement (workers packed on as few nodes as the
offer's node size allows, compute divided by the type's speed; types never measured use the speed
the price table declares), hours for the job's remaining steps, and cost = workers x price per
GPU-hour x hours.

`held_out_errors` says how far to trust it: each measurement predicted by a fit of all the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ebbflow_operator.policies.throughput import (
    Measurement,
    Placement,
    ThroughputParams,
    compute_speeds,
    fit,
    step_shape,
)


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
    """The fitted step-time model (reference type) and every measured type's compute speed."""

    params: ThroughputParams
    speeds: dict[str, float]

    @property
    def reference(self) -> str:
        return next((t for t, speed in self.speeds.items() if speed == 1.0), "")

    def step_s(
        self, gpu_type: str, speed: float, placement: Placement, micro: float, accum: int, tail: float = 1.0
    ) -> float:
        """Predicted step seconds on `gpu_type` (`speed` when it was never measured); `tail` as in
        `throughput.slowdown`."""
        placed = placement.with_speed(self.speeds.get(gpu_type, speed))
        return self.params.step_s(placed, micro, accum, tail)


def fit_model(measurements: Sequence[Measurement]) -> Model:
    """Speeds per type, then one fit of every measurement normalised by its type's speed."""
    if not measurements:
        raise ValueError("no measurements: run the job at a few sizes first (see docs/recommender.md)")
    speeds = compute_speeds([measurements]) or {"": 1.0}
    known = [m for m in measurements if m.gpu_type in speeds]
    params = fit([replace(m, speed=speeds[m.gpu_type]) for m in known])
    return Model(params, speeds)


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


def held_out_errors(measurements: Sequence[Measurement]) -> list[float]:
    """|predicted - measured| / measured step time of each measurement, from a fit of all the
    others (leave one out); one whose type has no other measurement is skipped."""
    errors = []
    for index, held in enumerate(measurements):
        rest = [m for i, m in enumerate(measurements) if i != index]
        if not any(m.gpu_type == held.gpu_type for m in rest):
            continue
        model = fit_model(rest)
        placement = Placement(held.workers, held.nodes, held.share)
        predicted = model.step_s(held.gpu_type, 1.0, placement, held.micro_batch, held.accum_steps, held.tail)
        errors.append(abs(predicted - held.step_s) / held.step_s)
    return errors
