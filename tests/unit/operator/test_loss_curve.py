"""SLAQ loss-curve fit: a / (k + b) + c by weighted least squares, recent points weighing more."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from ebbflow_operator.policies.loss_curve import LossCurve, _Points, _solve, fit_loss_curve

TRUE = LossCurve(a=5.0, b=40.0, c=0.3)


def sample(
    curve: LossCurve, steps: Sequence[float], noise: float = 0.0, seed: int = 0
) -> list[tuple[float, float]]:
    rnd = random.Random(seed)
    return [(float(k), curve.loss(k) * (1 + rnd.gauss(0, noise))) for k in steps]


def test_noise_free_fit_recovers_the_curve() -> None:
    fitted = fit_loss_curve(sample(TRUE, range(0, 2000, 50)))
    assert fitted is not None
    assert (fitted.a, fitted.b, fitted.c) == pytest.approx((TRUE.a, TRUE.b, TRUE.c), rel=0.01)


def test_noisy_fit_predicts_the_reduction_ahead() -> None:
    fitted = fit_loss_curve(sample(TRUE, range(0, 2000, 25), noise=0.005, seed=3))
    assert fitted is not None
    assert fitted.reduction(2000, 1000) == pytest.approx(TRUE.reduction(2000, 1000), rel=0.25)
    assert fitted.loss(3000) == pytest.approx(TRUE.loss(3000), rel=0.02)


def test_recent_points_weigh_more() -> None:
    # A learning-rate drop at step 1000: the loss falls onto a lower curve. A short half-life follows
    # the new regime; equal weights average the two.
    after = LossCurve(a=5.0, b=40.0, c=0.1)
    points = sample(TRUE, range(0, 1000, 50)) + sample(after, range(1000, 2000, 50))
    recent = fit_loss_curve(points, half_life=150.0)
    flat = fit_loss_curve(points, half_life=1e9)
    assert recent is not None and flat is not None
    assert abs(recent.loss(2500) - after.loss(2500)) < abs(flat.loss(2500) - after.loss(2500))


@pytest.mark.parametrize(
    "points",
    [
        pytest.param([], id="no reports"),
        pytest.param([(10.0, 2.0), (20.0, 1.5)], id="two reports"),
        pytest.param([(10.0, 2.0), (10.0, 1.9), (20.0, 1.5)], id="two distinct steps"),
        pytest.param([(1.0, float("nan")), (2.0, float("inf")), (3.0, 1.0)], id="non-finite losses"),
    ],
)
def test_too_few_points_give_no_fit(points: list[tuple[float, float]]) -> None:
    assert fit_loss_curve(points) is None


def test_flat_losses_predict_no_reduction() -> None:
    fitted = fit_loss_curve([(float(k), 0.7) for k in range(0, 500, 50)])
    assert fitted is not None
    assert fitted.reduction(500, 1000) == pytest.approx(0.0, abs=1e-9)


def test_rising_losses_predict_no_reduction() -> None:
    fitted = fit_loss_curve([(float(k), 1.0 + k / 1000) for k in range(0, 500, 50)])
    assert fitted is not None
    assert fitted.a == 0.0
    assert fitted.normalised_reduction(500, 1000) == pytest.approx(0.0, abs=1e-9)


def test_normalisation_makes_scales_comparable() -> None:
    small = fit_loss_curve(sample(TRUE, range(0, 2000, 50)))
    big = fit_loss_curve(sample(LossCurve(a=500.0, b=40.0, c=30.0), range(0, 2000, 50)))
    assert small is not None and big is not None
    assert big.reduction(2000, 500) == pytest.approx(100 * small.reduction(2000, 500), rel=0.02)
    expected = small.normalised_reduction(2000, 500)
    assert big.normalised_reduction(2000, 500) == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(
    ("step", "more", "expected"),
    [
        pytest.param(0.0, 0.0, 0.0, id="no steps, no reduction"),
        pytest.param(0.0, -5.0, 0.0, id="negative steps, no reduction"),
        pytest.param(0.0, 100.0, 0.5, id="prior: half the loss in its first b steps"),
        pytest.param(100.0, 200.0, 0.5 - 1 / 4, id="prior: later steps reduce less"),
    ],
)
def test_prior_and_reduction(step: float, more: float, expected: float) -> None:
    prior = LossCurve.prior()
    assert prior.loss(0) == 1.0
    assert prior.normalised_reduction(step, more) == pytest.approx(expected)


def textbook_solve(
    steps: list[float], losses: list[float], ws: list[float], b: float
) -> tuple[float, float, float]:
    """Weighted least squares of loss on 1/(k + b), written as comprehensions, the error summed over the
    residuals: `_solve`'s map chains (their sums in another order) and its error (Syy - a Sxy, an
    identity of least squares) must give the same values to rounding."""
    xs = [1.0 / (k + b) for k in steps]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = sum(w * y for w, y in zip(ws, losses, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, losses, strict=True))
    a = max(0.0, sxy / sxx) if sxx > 0 else 0.0
    c = my - a * mx
    return a, c, sum(w * (a * x + c - y) ** 2 for w, x, y in zip(ws, xs, losses, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_least_squares_are_the_textbook_ones(seed: int) -> None:
    rnd = random.Random(seed)
    truth = LossCurve(a=rnd.uniform(0.1, 50.0), b=rnd.uniform(1.0, 5000.0), c=rnd.uniform(0.0, 2.0))
    steps = sorted({0.0, *(rnd.uniform(0.0, 1e5) * rnd.random() for _ in range(rnd.randint(3, 40)))})
    losses = [y for _, y in sample(truth, steps, noise=rnd.choice((0.0, 0.01)), seed=seed)]
    ws = [0.5 ** ((steps[-1] - k) / max(1.0, steps[-1] / 2.0)) for k in steps]
    reports = _Points.of(steps, losses, ws)
    for b in (math.exp(rnd.uniform(0.0, 14.0)) for _ in range(50)):
        a, c, error = _solve(reports, b)
        want_a, want_c, want_error = textbook_solve(steps, losses, ws, b)
        assert (a, c) == (pytest.approx(want_a, rel=1e-12), pytest.approx(want_c, rel=1e-12, abs=1e-12))
        assert error == pytest.approx(want_error, rel=1e-9, abs=1e-12 * reports.loss_spread)
