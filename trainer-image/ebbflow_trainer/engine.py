"""One training step over virtual nodes: local gradient computation, the message to reduce, the update.

Each virtual node k computes, from the step's starting parameters and buffers, the gradient of the
mean loss over its B/V samples. The step's gradient is the plain mean of the V virtual-node gradients,
so a step means the same thing for any number of workers.

The reduced message carries one row per virtual node in ``deterministic`` mode (each row is filled by
exactly one worker and zero elsewhere, so the sum reproduces it exactly) and the rows are added in
virtual-node order: parameters are bitwise identical for every world size. ``fast`` mode sums a
worker's rows locally and all-reduces one row: less traffic, equal within float rounding.

Buffers (BatchNorm running statistics and the like) follow the same rule as gradients: every virtual
node starts from the step's buffers, and the step's new floating-point buffers are the mean over
virtual nodes of their updated values. BatchNorm therefore normalizes with the statistics of a
virtual node's B/V samples (like per-GPU BatchNorm in DDP), independent of the world size. Integer
buffers (``num_batches_tracked``) advance identically on every virtual node and are kept as computed.

The message also carries, per worker, its compute time (for dynamic batching) and one "leave" flag
(any worker asked to stop at this step boundary), so neither costs an extra collective.

A step whose reduced loss or gradient is not finite (NaN or infinity in any virtual node spreads
through the sum) is skipped: parameters, buffers, optimizer state and the learning-rate
estimates stay those of the last finite step. Every worker reads the same reduced message, so every
worker skips the same steps. ``nonfinite_streak`` counts the skipped steps in a row; it is part of the
handed-over state, so a world that re-forms in the middle of a streak keeps counting.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.lr_scaling import GradientNoiseScale, lr_factor, noise_estimates
from ebbflow_trainer.sharding import derived_seed, virtual_node_indices


@dataclass
class StepResult:
    loss: float
    compute_seconds: list[float]
    leave_requested: bool
    lr_factor: float | None  # None when the step was skipped
    skipped: bool = False  # the step's loss or gradient was not finite: nothing was updated


class VirtualNodeEngine:
    """Computes virtual-node gradients and applies the combined update to the model and optimizer."""

    def __init__(self, spec: TrainingSpec, config: TrainerConfig):
        self.spec = spec
        self.config = config
        self.params = [p for p in spec.model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise TypeError(f"all trainable parameters must share one floating-point dtype, found {dtypes}")
        self.dtype = next(iter(dtypes))
        buffers = list(spec.model.buffers())
        self.float_buffers = [b for b in buffers if b.is_floating_point()]
        self.buffers = buffers
        self.num_params = sum(p.numel() for p in self.params)
        self.num_float_buffer_values = sum(b.numel() for b in self.float_buffers)
        # Row layout: gradient | floating-point buffers | loss | squared gradient norm.
        self.row_size = self.num_params + self.num_float_buffer_values + 2
        self.base_lrs = [float(group["lr"]) for group in spec.optimizer.param_groups]
        self.base_batch_size = config.base_batch_size or config.global_batch_size
        self.noise = GradientNoiseScale()
        self.nonfinite_streak = 0
        self._advanced_buffers: list[torch.Tensor] = []

    # --- local work ------------------------------------------------------------------------------
    def compute_rows(self, step: int, virtual_nodes: list[int]) -> tuple[dict[int, torch.Tensor], float]:
        """Rows for this worker's virtual nodes at ``step``, and the (possibly simulated) compute time."""
        config, model = self.config, self.spec.model
        model.train()
        start_buffers = [b.detach().clone() for b in self.buffers]
        rows: dict[int, torch.Tensor] = {}
        started = time.perf_counter()
        for k in virtual_nodes:
            vnode_started = time.perf_counter()
            with torch.no_grad():
                for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                    buffer.copy_(saved)
            # Randomness inside the model (dropout) depends on (seed, step, k) only.
            torch.manual_seed(derived_seed(config.seed, step, k, 1))
            indices = virtual_node_indices(
                seed=config.seed,
                step=step,
                virtual_node=k,
                num_samples=len(self.spec.dataset),
                global_batch_size=config.global_batch_size,
                virtual_nodes=config.virtual_nodes,
            )
            model.zero_grad(set_to_none=True)
            loss = self.spec.loss_fn(model, self.spec.batch(indices))
            loss.backward()  # type: ignore[no-untyped-call]
            gradient = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                    for p in self.params
                ]
            )
            parts = [gradient]
            parts += [b.detach().reshape(-1).to(self.dtype) for b in self.float_buffers]
            parts.append(loss.detach().reshape(1).to(self.dtype))
            parts.append(gradient.dot(gradient).reshape(1))
            rows[k] = torch.cat(parts)
            self._simulate_device(time.perf_counter() - vnode_started)
        model.zero_grad(set_to_none=True)
        # Integer buffers advanced the same way on every virtual node; keep that value for apply().
        self._advanced_buffers = [b.detach().clone() for b in self.buffers]
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                buffer.copy_(saved)
        return rows, time.perf_counter() - started

    def _simulate_device(self, real_seconds: float) -> None:
        """Model a slower (or busier) accelerator: tests and benchmarks on CPU need stable speeds."""
        extra = self.config.simulated_vnode_seconds * self.config.slowdown
        extra += (self.config.slowdown - 1.0) * real_seconds
        if extra > 0:
            time.sleep(extra)

    # --- the reduced message ---------------------------------------------------------------------
    def message_size(self, world_size: int) -> int:
        rows = self.config.virtual_nodes if self.config.mode == "deterministic" else 1
        return rows * self.row_size + world_size + 1

    def pack(
        self,
        rows: dict[int, torch.Tensor],
        *,
        rank: int,
        world_size: int,
        compute_seconds: float,
        leave: bool,
    ) -> torch.Tensor:
        message = torch.zeros(self.message_size(world_size), dtype=self.dtype)
        row_area = message[: self.message_size(world_size) - world_size - 1]
        if self.config.mode == "deterministic":
            table = row_area.view(self.config.virtual_nodes, self.row_size)
            for k, row in rows.items():
                table[k].copy_(row)
        else:
            for k in sorted(rows):
                row_area += rows[k]
        tail = message[row_area.numel() :]
        tail[rank] = compute_seconds
        tail[world_size] = 1.0 if leave else 0.0
        return message

    # --- the update ------------------------------------------------------------------------------
    def apply(self, message: torch.Tensor, world_size: int) -> StepResult:
        """Turn the all-reduced message into the step's update; identical on every worker."""
        mean, tail = self._unpack(message)
        p, q = self.num_params, self.num_float_buffer_values
        gradient, buffer_values = mean[:p], mean[p : p + q]
        loss, small_sq_norm = float(mean[p + q]), float(mean[p + q + 1])
        # Buffers may hold infinities by design (attention masks), so only the loss and gradient count.
        skipped = not (math.isfinite(loss) and bool(torch.isfinite(gradient).all()))
        self.nonfinite_streak = self.nonfinite_streak + 1 if skipped else 0
        factor = None
        if not skipped:
            self._set_gradient_and_buffers(gradient, buffer_values)
            factor = self._scale_learning_rate(small_sq_norm, float(gradient.dot(gradient)))
            self.spec.optimizer.step()
            self.spec.model.zero_grad(set_to_none=True)
        return StepResult(
            loss=loss,
            compute_seconds=[float(t) for t in tail[:world_size]],
            leave_requested=bool(tail[world_size] > 0),
            lr_factor=factor,
            skipped=skipped,
        )

    def _unpack(self, message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean row over the V virtual nodes, and the per-worker tail of the message."""
        v = self.config.virtual_nodes
        row_count = v * self.row_size if self.config.mode == "deterministic" else self.row_size
        if self.config.mode == "deterministic":
            # Adding +0.0 turns -0.0 into +0.0, as a reduction over several workers does.
            table = message[:row_count].view(v, self.row_size) + 0.0
            total = table[0].clone()
            for k in range(1, v):
                total += table[k]
        else:
            total = message[:row_count].clone()
        return total / v, message[row_count:]

    def _set_gradient_and_buffers(self, gradient: torch.Tensor, buffer_values: torch.Tensor) -> None:
        offset = 0
        for param in self.params:
            param.grad = gradient[offset : offset + param.numel()].view_as(param).clone()
            offset += param.numel()
        offset = 0
        with torch.no_grad():
            for buffer, advanced in zip(self.buffers, self._advanced_buffers, strict=True):
                if not buffer.is_floating_point():
                    buffer.copy_(advanced)
            for buffer in self.float_buffers:
                values = buffer_values[offset : offset + buffer.numel()].view_as(buffer)
                buffer.copy_(values.to(buffer.dtype))
                offset += buffer.numel()

    def _scale_learning_rate(self, small_sq_norm: float, big_sq_norm: float) -> float:
        config = self.config
        if config.lr_scaling == "none":
            return 1.0
        if config.virtual_nodes > 1:
            variance, sq_norm = noise_estimates(
                small_sq_norm, config.samples_per_virtual_node, big_sq_norm, config.global_batch_size
            )
            self.noise.update(variance, sq_norm)
        factor = lr_factor(
            config.lr_scaling,
            batch=config.global_batch_size,
            base_batch=self.base_batch_size,
            noise=self.noise,
        )
        for group, base_lr in zip(self.spec.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        return factor
