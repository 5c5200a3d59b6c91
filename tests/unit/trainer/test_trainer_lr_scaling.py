"""Learning-rate scaling rules against values worked out by hand."""

from __future__ import annotations

import math

import pytest
from ebbflow_trainer.lr_scaling import (
    GradientNoiseScale,
    adascale_gain,
    linear_factor,
    lr_factor,
    noise_estimates,
    sqrt_factor,
)


def test_linear_and_square_root_rules() -> None:
    assert linear_factor(512, 256) == 2.0
    assert linear_factor(64, 256) == 0.25
    assert sqrt_factor(1024, 256) == 2.0
    assert sqrt_factor(128, 512) == 0.5


def test_adascale_gain_hand_computed() -> None:
    # sigma^2 = 300, mu^2 = 1, B0 = 100, B = 400: (300/100 + 1) / (300/400 + 1) = 4 / 1.75
    assert adascale_gain(300.0, 1.0, batch=400, base_batch=100) == pytest.approx(4 / 1.75)
    # Pure noise: the gain is the full scale S = 4; no noise: no gain.
    assert adascale_gain(1.0, 0.0, batch=400, base_batch=100) == pytest.approx(4.0)
    assert adascale_gain(0.0, 2.0, batch=400, base_batch=100) == pytest.approx(1.0)
    # Same batch: no change whatever the statistics.
    assert adascale_gain(300.0, 1.0, batch=100, base_batch=100) == pytest.approx(1.0)


def test_adascale_gain_is_clamped_to_its_theoretical_range() -> None:
    # Noisy estimates can be negative; the gain still lies in [1, S].
    assert adascale_gain(-5.0, 1.0, batch=400, base_batch=100) == 1.0
    assert adascale_gain(5.0, -1.0, batch=400, base_batch=100) == pytest.approx(4.0)


def test_noise_estimates_recover_a_known_gradient_distribution() -> None:
    # Per-sample gradients with true squared norm |G|^2 = 2 and variance tr(S) = 64 give
    # E|g_b|^2 = |G|^2 + tr(S) / b: b = 8 -> 10, B = 32 -> 4.
    variance, sq_norm = noise_estimates(10.0, 8, 4.0, 32)
    assert variance == pytest.approx(64.0)
    assert sq_norm == pytest.approx(2.0)
    with pytest.raises(ValueError):
        noise_estimates(10.0, 32, 4.0, 32)


def test_noise_scale_smoothing_and_policy_dispatch() -> None:
    noise = GradientNoiseScale(smoothing=0.5)
    assert noise.noise_scale == math.inf
    noise.update(64.0, 2.0)
    noise.update(32.0, 2.0)
    assert (noise.variance, noise.sq_norm, noise.noise_scale) == (48.0, 2.0, 24.0)
    # gain = (48/32 + 2) / (48/64 + 2) = 3.5 / 2.75
    assert lr_factor("adascale", batch=64, base_batch=32, noise=noise) == pytest.approx(3.5 / 2.75)
    assert lr_factor("linear", batch=64, base_batch=32) == 2.0
    assert lr_factor("sqrt", batch=64, base_batch=32) == pytest.approx(math.sqrt(2))
    assert lr_factor("none", batch=64, base_batch=32) == 1.0
    assert lr_factor("adascale", batch=64, base_batch=32, noise=GradientNoiseScale()) == 1.0
