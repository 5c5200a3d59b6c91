"""SLAQ's loss-curve model: fit a job's reported losses, predict how much more training reduces them.

Model: loss(k) = a / (k + b) + c, with a >= 0, b > 0 (k: optimiser steps done): SGD's O(1/k)
convergence, the first-order term of SLAQ's (SoCC'17) family. For a fixed b the model is linear in
(a, c), so the fit is a weighted linear least-squares solve inside a one-dimensional search over b:
stable with a handful of points, no numpy, no local minima in (a, c). Recent points weigh more
(w = 0.5^((k_last - k) / half_life)); losses are normalised per job by the reducible loss seen so
far, so jobs with different loss scales compare.

Invariants: a fitted curve is non-increasing and flattens to its asymptote c, so predicted
reductions shrink as a job converges; normalising needs the history from the job's start (a
down-sampled one is enough). Why this form and not a power law: docs/design/throughput-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul, sub

from .search import grid_then_golden

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
    (the weight total, the weighted mean loss, each loss's distance to it and the weighted sum of
    their squares), worked out once."""

    steps: list[float]
    losses: list[float]
    weights: list[float]
    total_weight: float
    mean_loss: float
    loss_offsets: list[float]
    loss_spread: float

    @classmethod
    def of(cls, steps: list[float], losses: list[float], weights: list[float]) -> _Points:
        total = sum(weights)
        mean = sum(map(mul, weights, losses)) / total
        offsets = list(map(sub, losses, repeat(mean)))
        spread = sum(map(mul, weights, map(mul, offsets, offsets)))
        return cls(steps, losses, weights, total, mean, offsets, spread)


def _solve(points: _Points, b: float) -> tuple[float, float, float]:
    """(a, c, weighted squared error) for a fixed b; a clamped at 0 (a flat curve).

    Weighted least squares of loss on x = 1/(k + b), in centred sums: a = Sxy / Sxx, c = mean loss
    - a * mean x, and the error Syy - a * Sxy (which is also Syy when a is clamped at 0), so no pass
    over the residuals. A fit solves this 35 times and the quality policy refits a job at each
    new loss report (hundreds of thousands of fits in a 10,000-job simulation): what does not depend
    on b comes from `_Points`, and the sums run over plain lists with C-level `map`.
    """
    w = points.weights
    xs = [1.0 / (k + b) for k in points.steps]
    mx = sum(map(mul, w, xs)) / points.total_weight
    dx = list(map(sub, xs, repeat(mx)))
    wdx = list(map(mul, w, dx))
    sxx = sum(map(mul, wdx, dx))
    sxy = sum(map(mul, wdx, points.loss_offsets))
    a = max(0.0, sxy / sxx) if sxx > 0 else 0.0
    return a, points.mean_loss - a * mx, max(0.0, points.loss_spread - a * sxy)


def _best_b(points: _Points) -> float:
    """A log grid over b (1 step .. 10x the span), then golden-section refinement in log b.

    13 grid points: on 1,500 random noisy curves the fitted normalised reductions differ from a
    25-point grid's by < 1e-7 (9 points: < 1e-7 too; the error is unimodal in log b in practice)."""
    steps = points.steps
    span = max(steps) - min(steps)
    hi = math.log(10.0 * span + 10.0 + max(steps))
    grid = [hi * i / 12 for i in range(13)]
    return math.exp(grid_then_golden(lambda log_b: _solve(points, math.exp(log_b))[2], grid))


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
