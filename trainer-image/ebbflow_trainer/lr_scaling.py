"""Learning-rate scaling when the global batch B differs from the batch B0 the learning rate was tuned for.

Rules: linear (lr0 * B / B0), sqrt (lr0 * sqrt(B / B0)) and adascale (lr0 * r, AdaScale's gain from
the per-sample gradient variance and the true gradient's squared norm, estimated as Pollux does).
Momentum correction (``spec.momentumCorrection``) makes one step at B worth r steps at B0 for SGD
with momentum: m = m0^r, lr = lr0 x r x (1 - m) / (1 - m0), the velocity rescaled when m changes.

Invariants: at B = B0 every rule is the identity; B0 stays the batch the learning rate was tuned for
across switches of B; the factor is computed at every step from the batch that step used, and
optimizer state and LR schedule carry on unchanged. Derivations and references: docs/design/batch.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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


def corrected_momentum(base_momentum: float, factor: float) -> float:
    """m0^r: the momentum of a step worth ``factor`` steps at the base batch (module docstring)."""
    return float(base_momentum**factor)


def momentum_lr_multiplier(base_momentum: float, factor: float) -> float:
    """r x (1 - m0^r) / (1 - m0): the learning rate's factor that keeps lr / (1 - m) at r times its
    tuned value once the momentum is m0^r."""
    return factor * (1.0 - corrected_momentum(base_momentum, factor)) / (1.0 - base_momentum)


def momentum_correction_problem(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer`` cannot have its momentum corrected (None when it can): the rule is SGD's."""
    if type(optimizer) is not torch.optim.SGD:
        return f"the optimizer is {type(optimizer).__name__}; momentum correction is for torch.optim.SGD"
    if any(not 0.0 < float(group["momentum"]) < 1.0 for group in optimizer.param_groups):
        return "a parameter group of the SGD optimizer has no momentum (momentum must be in (0, 1))"
    return None


class MomentumCorrection:
    """Sets an SGD optimizer's momentum for each step's LR factor r and rescales its velocity when
    the momentum changes (module docstring). The tuned momenta are read at construction, before
    any training state is loaded; the current ones live in the optimizer's param groups, which the
    training state carries, so a worker that joins continues from the same values."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        problem = momentum_correction_problem(optimizer)
        if problem:
            raise ValueError(problem)
        self.optimizer = optimizer
        self.base_momenta = [float(group["momentum"]) for group in optimizer.param_groups]

    def apply(self, factor: float) -> list[float]:
        """Set each group's momentum for a step worth ``factor`` base steps and rescale its
        velocity if that changed it; each group's learning-rate multiplier."""
        multipliers = []
        for group, base in zip(self.optimizer.param_groups, self.base_momenta, strict=True):
            before, after = float(group["momentum"]), corrected_momentum(base, factor)
            if after != before:
                with torch.no_grad():
                    for param in group["params"]:
                        velocity = self.optimizer.state.get(param, {}).get("momentum_buffer")
                        if velocity is not None:
                            velocity.mul_((1.0 - before) / (1.0 - after))
                group["momentum"] = after
            multipliers.append(momentum_lr_multiplier(base, factor))
        return multipliers
