"""Learning-rate scaling when the global batch B differs from the batch B0 the learning rate was tuned for.

The virtual-node design keeps B fixed while workers come and go, so scaling is off by default; it
matters when a job is resumed with a different ``globalBatchSize``, and when the operator's goodput
policy changes B during the run (``spec.maxGlobalBatchSize``, which requires adascale). Rules:

- linear: lr = lr0 * B / B0 (Goyal et al.)
- sqrt:   lr = lr0 * sqrt(B / B0) (Krizhevsky; Hoffer et al.)
- adascale: lr = lr0 * r, with the AdaScale gain r = (sigma^2 / B0 + mu^2) / (sigma^2 / B + mu^2), where
  sigma^2 is the per-sample gradient variance (trace of the covariance) and mu^2 the squared norm of the
  true gradient, both estimated like Pollux does from gradients at two batch sizes (McCandlish et al.).

At a switch of B (see :mod:`ebbflow_trainer.global_batch`) the base batch B0 stays the one the learning
rate was tuned for (``globalBatchSize``, or ``--base-batch-size``). The engine computes the factor at
every step from the batch that step was computed with, so the first step at the new B already uses
the gain at the new B: sigma^2 and mu^2 are per-sample quantities that do not depend on B, so the
smoothed estimates stay valid across the switch, and that step's own estimate (from its batch sizes
B/V and B) joins the moving average. Optimizer state and the LR schedule carry on unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def linear_factor(batch: int, base_batch: int) -> float:
    return batch / base_batch


def sqrt_factor(batch: int, base_batch: int) -> float:
    return math.sqrt(batch / base_batch)


def adascale_gain(variance: float, sq_norm: float, *, batch: int, base_batch: int) -> float:
    """AdaScale gain r in [1, B / B0] for B >= B0 (and [B / B0, 1] when the batch shrank)."""
    scale = batch / base_batch
    low, high = min(1.0, scale), max(1.0, scale)
    variance, sq_norm = max(variance, 0.0), max(sq_norm, 0.0)
    if variance + sq_norm == 0.0:
        return 1.0
    gain = (variance / base_batch + sq_norm) / (variance / batch + sq_norm)
    return min(max(gain, low), high)


def noise_estimates(
    small_sq_norm: float, small_batch: int, big_sq_norm: float, big_batch: int
) -> tuple[float, float]:
    """Unbiased (variance, squared-norm) estimates from mean |g_small|^2 and |g_big|^2 (Pollux, McCandlish).

    |G|^2 = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(S) = (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)
    """
    if big_batch <= small_batch:
        raise ValueError("the big batch must be larger than the small batch")
    sq_norm = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    variance = (small_sq_norm - big_sq_norm) / (1 / small_batch - 1 / big_batch)
    return variance, sq_norm


@dataclass
class GradientNoiseScale:
    """Smoothed (variance, squared-norm) estimates, updated once per step; part of the training state."""

    smoothing: float = 0.9
    variance: float = 0.0
    sq_norm: float = 0.0
    updates: int = 0

    def update(self, variance: float, sq_norm: float) -> None:
        a = 0.0 if self.updates == 0 else self.smoothing
        self.variance = a * self.variance + (1 - a) * variance
        self.sq_norm = a * self.sq_norm + (1 - a) * sq_norm
        self.updates += 1

    @property
    def noise_scale(self) -> float:
        """B_noise = tr(S) / |G|^2: the batch size beyond which larger batches stop paying off."""
        return self.variance / self.sq_norm if self.sq_norm > 0 else math.inf


def lr_factor(policy: str, *, batch: int, base_batch: int, noise: GradientNoiseScale | None = None) -> float:
    """Multiplier on the tuned learning rate for one step under ``policy`` (a contract LR policy)."""
    if policy == "none" or batch == base_batch:
        return 1.0
    if policy == "linear":
        return linear_factor(batch, base_batch)
    if policy == "sqrt":
        return sqrt_factor(batch, base_batch)
    if policy == "adascale":
        if noise is None or noise.updates == 0:
            return 1.0
        return adascale_gain(noise.variance, noise.sq_norm, batch=batch, base_batch=base_batch)
    raise ValueError(f"unknown learning-rate scaling policy {policy!r}")
