"""Learning-rate scaling when the global batch B differs from the batch B0 the learning rate was tuned for.

The virtual-node design keeps B fixed while workers come and go, so scaling is off by default; it
matters when a job is resumed with a different ``globalBatchSize``, and when the operator's goodput
policy changes B during the run (``spec.maxGlobalBatchSize``, which requires adascale). Rules:

- linear: lr = lr0 * B / B0 (Goyal et al.)
- sqrt:   lr = lr0 * sqrt(B / B0) (Krizhevsky; Hoffer et al.)
- adascale: lr = lr0 * r, with the AdaScale gain r = (sigma^2 / B0 + mu^2) / (sigma^2 / B + mu^2), where
  sigma^2 is the per-sample gradient variance (trace of the covariance) and mu^2 the squared norm of the
  true gradient, both estimated like Pollux does from gradients at two batch sizes (McCandlish et al.).

Momentum (``spec.momentumCorrection``, :class:`MomentumCorrection`): the rules above scale a step
as if it were worth r steps at B0 (r = B / B0 for linear, sqrt(B / B0), or AdaScale's gain).
SGD's momentum must follow, or its memory stretches over r times as many samples and the
effective learning rate lr / (1 - m) is no longer the one the rule meant. In exponential-average
form, u <- m u + (1 - m) g and w <- w - (lr / (1 - m)) u (torch's velocity is v = u / (1 - m)),
r steps at B0 with a slowly changing gradient decay u by m0^r and move w by r lr0 / (1 - m0) u. One
step at B does the same with

    m = m0^r,    lr = lr0 x r x (1 - m) / (1 - m0),    v <- v x (1 - m_before) / (1 - m) at a change,

the last keeping u (what momentum remembers) unchanged when m changes. At B = B0 (r = 1) this is
the identity. Goyal et al. (2017, "momentum correction") rescale the velocity for an LR change in
the form where the LR sits inside the velocity; torch's form needs no correction for the LR alone,
only for the change of m. Keeping 1 / (1 - m) in samples constant follows Smith, Kindermans, Ying
and Le (2018), who show the SGD noise scale is lr N / (B (1 - m)).

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
