"""The optimizer step of one global step: mixed precision, the skip decision, clipping, the LR schedule.

Everything here works on the combined (all-reduced) gradient or on state every worker holds alike,
so every worker reaches the same decision and the same update for any world size. fp16 unscales the
combined gradient and updates the loss scale as ``torch.amp.GradScaler`` does; clipping uses the
combined gradient's norm; the scheduler owns each group's base LR and is stepped after every global
step, skipped ones included.

Invariants: a non-finite loss, or a non-finite gradient without a loss scale, counts toward the
non-finite streak; an overflow under a loss scale is skipped without counting; the scheduler's
position always equals the step count. Details: docs/design/step.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ebbflow_trainer.api import LossScaling, TrainingSpec

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Verdict:
    """What a step's combined loss and gradient mean for the update."""

    skipped: bool  # nothing is updated (parameters, buffers, optimizer state)
    counted: bool  # counts toward the non-finite streak (the run may have diverged)
    overflow: bool  # an fp16 overflow: skipped, the loss scale backed off, not counted


class LossScaler:
    """The fp16 dynamic loss scale, held in float32 like GradScaler's (each update is computed in
    double and rounded to float32, as ``torch._amp_update_scale_`` does)."""

    def __init__(self, settings: LossScaling):
        self.settings = settings
        self.scale = _float32(settings.init_scale)
        self.growth_tracker = 0

    def update(self, found_inf: bool) -> None:
        """``torch._amp_update_scale_``: back off on an overflow, grow after growth_interval good steps."""
        settings = self.settings
        if found_inf:
            self.scale = _float32(self.scale * settings.backoff_factor)
            self.growth_tracker = 0
            return
        successful = self.growth_tracker + 1
        if successful == settings.growth_interval:
            grown = _float32(self.scale * settings.growth_factor)
            if math.isfinite(grown):
                self.scale = grown
            self.growth_tracker = 0
        else:
            self.growth_tracker = successful

    @property
    def inverse(self) -> float:
        """The float32 reciprocal GradScaler unscales with (computed in double, then rounded)."""
        return _float32(1.0 / self.scale)


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite. The sum is non-finite whenever a value is (NaN and infinities
    propagate), and one pass of a sum costs a fraction of ``isfinite``'s; only a sum that overflows
    (or a value that is not finite) needs the element-wise check."""
    if math.isfinite(float(values.sum())):
        return True
    return bool(torch.isfinite(values).all())


def _float32(value: float) -> float:
    """``value`` rounded to float32 (inf when it overflows), as GradScaler's float32 scale tensor holds it."""
    return float(torch.tensor(value, dtype=torch.float64).to(torch.float32))


class OptimizerStep:
    """Loss scale, skip decision, clipping and scheduler of a spec; part of the handed-over state."""

    def __init__(self, spec: TrainingSpec):
        self.spec = spec
        self.scaler = LossScaler(spec.loss_scaling) if spec.precision == "fp16" else None

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.scale if self.scaler is not None else None

    def autocast(self, device_type: str) -> torch.autocast:
        """The autocast context for the spec's precision (disabled for fp32)."""
        dtype = AUTOCAST_DTYPES.get(self.spec.precision)
        return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if self.scaler is None:
            return loss
        return loss * torch.tensor(self.scaler.scale, dtype=torch.float32, device=loss.device)

    def unscale(self, gradient: torch.Tensor) -> torch.Tensor:
        """The true gradient from a scaled one (the same tensor when there is no loss scale)."""
        if self.scaler is None:
            return gradient
        return gradient * torch.tensor(self.scaler.inverse, dtype=torch.float32, device=gradient.device)

    def judge(self, loss: float, gradient: torch.Tensor) -> Verdict:
        """Skip or not, and whether it counts; updates the loss scale. ``gradient`` is unscaled."""
        return self.judge_finite(loss, all_finite(gradient))

    def judge_finite(self, loss: float, finite_gradient: bool) -> Verdict:
        """``judge`` where the world already counted the gradient's non-finite values (sharded)."""
        finite_loss = math.isfinite(loss)
        skipped = not (finite_loss and finite_gradient)
        if self.scaler is None:
            return Verdict(skipped=skipped, counted=skipped, overflow=False)
        self.scaler.update(found_inf=not finite_gradient)
        return Verdict(skipped=skipped, counted=not finite_loss, overflow=finite_loss and not finite_gradient)

    def clip(self, params: Sequence[torch.Tensor]) -> float | None:
        """Clip the gradients in ``.grad`` to ``clip_grad_norm``; their norm before clipping, or None."""
        if self.spec.clip_grad_norm is None:
            return None
        return float(torch.nn.utils.clip_grad_norm_(params, self.spec.clip_grad_norm))

    def schedule(self, base_lrs: list[float]) -> list[float]:
        """Step the scheduler from the unscaled LRs ``base_lrs``; the next step's base LRs."""
        scheduler = self.spec.scheduler
        if scheduler is None:
            return base_lrs
        groups = self.spec.optimizer.param_groups
        for group, base_lr in zip(groups, base_lrs, strict=True):
            group["lr"] = base_lr
        with warnings.catch_warnings():
            # Torch warns when the first scheduler step comes before any optimizer step: here that is
            # a skipped first step, and the schedule advancing past it is intended.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            scheduler.step()
        return [float(group["lr"]) for group in groups]

    def state_dict(self) -> dict[str, Any]:
        scheduler = self.spec.scheduler
        return {
            "loss_scale": (
                {"scale": self.scaler.scale, "growth_tracker": self.scaler.growth_tracker}
                if self.scaler is not None
                else None
            ),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        loss_scale = state.get("loss_scale")
        if self.scaler is not None and loss_scale is not None:
            self.scaler.scale = float(loss_scale["scale"])
            self.scaler.growth_tracker = int(loss_scale["growth_tracker"])
        scheduler = self.spec.scheduler
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
