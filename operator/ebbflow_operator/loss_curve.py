"""SLAQ's loss-curve model: fit a job's reported losses, predict how much more training reduces them.

Model: loss(k) = a / (k + b) + c, with a >= 0, b > 0 (k: optimiser steps done).

Why this form: SGD on convex (and, empirically, most deep-learning) objectives converges as O(1/k),
which is what SLAQ (SoCC'17) fits (its 1/(alpha k^2 + beta k + gamma) + delta family, reduced to the
first-order term that dominates after the first few steps). For a fixed b the model is linear in
(a, c), so the fit is a weighted linear least-squares solve inside a one-dimensional search over
b: stable with a handful of points, no numpy, no local minima in (a, c). It is non-increasing and
flattens to the asymptote c (the loss the job will not get below), so predicted reductions shrink
as a job converges - exactly the signal SLAQ allocates by. A power law a*k^-b + c fits the early
phase a little better but its exponent and asymptote trade off badly with few, noisy points.

Weights: recent points weigh more (w = 0.5^((k_last - k) / half_life)), since the curve's tail
is what predicts the next minutes. Losses are normalised per job by the reducible loss seen so far
(loss at the first report minus the fitted asymptote), so jobs with different loss scales compare;
this needs the history from the job's start (a down-sampled one is enough): a curve seen only from
late in training would look as steep, relative to itself, as a fresh job's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul, sub

PRIOR_B = 100.0  # steps to halve the loss of a job with no reports (early on a 1/k curve)


@dataclass(frozen=True)
class LossCurve:
    """loss(k) = a / (k + b) + c; `scale` normalises reductions (reducible loss at the first report)."""

    a: float
    b: float
    c: float
    scale: float = 1.0

    @classmethod
    def prior(cls, half_steps: float = PRIOR_B) -> LossCurve:
        """No losses yet: a normalised curve from step 0 (loss(0) = 1, asymptote 0) that halves its
        loss in `half_steps` steps. Scale-free use: pass the steps the job makes over the policy's
        horizon, so a new job is predicted to halve its loss in that time."""
        b = max(half_steps, 1e-9)
        return cls(a=b, b=b, c=0.0, scale=1.0)

    def loss(self, step: float) -> float:
        return self.a / (max(0.0, step) + self.b) + self.c

    def reduction(self, step: float, more_steps: float) -> float:
        """Predicted loss decrease from `step` after `more_steps` further steps (>= 0)."""
        if more_steps <= 0:
            return 0.0
        return self.loss(step) - self.loss(step + more_steps)

    def normalised_reduction(self, step: float, more_steps: float) -> float:
        return self.reduction(step, more_steps) / self.scale if self.scale > 0 else 0.0


def _weights(steps: Sequence[float], half_life: float) -> list[float]:
    last = max(steps)
    return [0.5 ** ((last - k) / half_life) for k in steps]


@dataclass(frozen=True)
class _Points:
    """The reports, their weights and what every `_solve` needs of them that does not depend on b
    (the weight total, the weighted mean loss and each loss's distance to it), worked out once."""

    steps: list[float]
    losses: list[float]
    weights: list[float]
    total_weight: float
    mean_loss: float
    loss_offsets: list[float]

    @classmethod
    def of(cls, steps: list[float], losses: list[float], weights: list[float]) -> _Points:
        total = sum(weights)
        mean = sum(map(mul, weights, losses)) / total
        return cls(steps, losses, weights, total, mean, list(map(sub, losses, repeat(mean))))


def _solve(points: _Points, b: float) -> tuple[float, float, float]:
    """(a, c, weighted squared error) for a fixed b; a clamped at 0 (a flat curve).

    Weighted least squares of loss on x = 1/(k + b). A fit solves this up to 86 times and the
    quality policy refits a job at each new loss report (hundreds of thousands of fits in a
    10,000-job simulation), so what does not depend on b comes from `_Points` and the sums run over
    plain lists, term by term in the textbook formula's order: the same floats as before, faster.
    """
    w, losses = points.weights, points.losses
    xs = [1.0 / (k + b) for k in points.steps]
    mx = sum(map(mul, w, xs)) / points.total_weight
    dx = [x - mx for x in xs]
    sxx = sum([v * d**2 for v, d in zip(w, dx, strict=True)])
    sxy = sum([v * d * e for v, d, e in zip(w, dx, points.loss_offsets, strict=True)])
    a = max(0.0, sxy / sxx) if sxx > 0 else 0.0
    c = points.mean_loss - a * mx
    error = sum([v * (a * x + c - y) ** 2 for v, x, y in zip(w, xs, losses, strict=True)])
    return a, c, error


def _best_b(points: _Points) -> float:
    """Coarse log grid over b (1 step .. 10x the span), then golden-section refinement in log b.

    The search asks for the same b again (a quarter of its solves on simulated jobs' reports: the
    golden-section points it reuses, when their arithmetic lands on the same float), so each b's
    error is remembered for the fit."""
    solved: dict[float, float] = {}

    def error(log_b: float) -> float:
        b = math.exp(log_b)
        if b not in solved:
            solved[b] = _solve(points, b)[2]
        return solved[b]

    steps = points.steps
    span = max(steps) - min(steps)
    lo, hi = 0.0, math.log(10.0 * span + 10.0 + max(steps))
    grid = [lo + (hi - lo) * i / 24 for i in range(25)]
    errors = [error(g) for g in grid]
    best = min(range(len(grid)), key=lambda i: errors[i])
    a, b = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(30):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if error(c) <= error(d):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2.0)


def fit_loss_curve(points: Sequence[tuple[float, float]], half_life: float | None = None) -> LossCurve | None:
    """Fits (step, loss) reports; None with fewer than 3 distinct steps (use `LossCurve.prior`).

    `half_life` (steps) defaults to half the observed span, so the newer half weighs twice the older.
    """
    clean = sorted((float(k), float(y)) for k, y in points if k >= 0 and math.isfinite(y))
    if len({k for k, _ in clean}) < 3:
        return None
    steps = [k for k, _ in clean]
    losses = [y for _, y in clean]
    span = steps[-1] - steps[0]
    weights = _weights(steps, half_life if half_life and half_life > 0 else max(1.0, span / 2.0))
    reports = _Points.of(steps, losses, weights)
    b = _best_b(reports)
    a, c, _ = _solve(reports, b)
    first = a / (steps[0] + b) + c
    scale = first - c if first - c > 1e-12 else max(abs(losses[0]), 1e-12)
    return LossCurve(a=a, b=b, c=c, scale=scale)
