"""Sharded training (``TrainingSpec.sharding="fsdp"``): PyTorch's FSDP2 under the virtual-node step.

Parameters, gradients and optimizer state live in dim-0 pieces over the world (``fully_shard`` on
each of ``spec.shard_modules`` and on the model). A worker runs a pass per virtual node it owns:
``shard_gather="per_pass"`` gathers and reduce-scatters every pass (``ceil(V/N)`` passes everywhere,
a missing virtual node's pass repeated with weight zero, so every collective has its match);
``"per_step"`` gathers in the first pass and reduce-scatters the accumulated gradient after the
last. FSDP2 divides each reduce-scatter by N, so ``apply`` multiplies the pieces by N/V.

Invariants: the step's extras (float buffers, the loss, the count of non-finite gradient values, the
shards' squared norms, compute times, the leave flag, rank 0's requests) travel in one float64
all-reduce, so every worker reaches the same skip, clip and switch decisions; reading or loading the
state is collective (``collective_state``): whole tensors are gathered for the handoff and the
checkpoint, and each worker keeps its own piece on restore. Refused at start: ``selection.sharding_problem``.
Design and what comes next: docs/design/sharded.md.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.data import to_device
from ebbflow_trainer.sharding import derived_seed
from ebbflow_trainer.step.engine import (
    NO_REQUESTS,
    Collectives,
    ReductionFailed,
    Requests,
    StepResult,
    VirtualNodeEngine,
    seed_generators,
)

# The extras' fixed values after the float buffers: the loss sum, the non-finite count, the squared norm.
LOSS, NONFINITE, SQUARED_NORM = range(3)


class ShardedEngine(VirtualNodeEngine):
    """The virtual-node step over FSDP2-sharded parameters, gradients and optimizer state."""

    collective_state = True

    def __init__(
        self, spec: TrainingSpec, config: TrainerConfig, *, message_device: torch.device | None = None
    ):
        super().__init__(spec, config, message_device=message_device)
        names = {id(param): name for name, param in spec.model.named_parameters()}
        # The optimizer's parameters by name: sharding replaces every parameter with a DTensor one.
        self._group_names = [[names[id(p)] for p in group["params"]] for group in spec.optimizer.param_groups]
        self.world_size = 1
        self.rank = 0

    @property
    def method(self) -> str:
        return "fsdp"

    @property
    def tracks_noise(self) -> bool:
        """A virtual node's whole gradient never exists here, so its norm (for adascale) is not known."""
        return False

    def join_world(self, world_size: int) -> None:
        """Shard the model over the world's process group and point the optimizer at the shards."""
        model = self.spec.model
        mesh = init_device_mesh(self.device.type, (world_size,))
        for module in self.spec.shard_modules:
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert isinstance(model, FSDPModule)
        sharded = dict(model.named_parameters())
        for group, names in zip(self.spec.optimizer.param_groups, self._group_names, strict=True):
            group["params"] = [sharded[name] for name in names]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world_size, self.rank = world_size, mesh.get_local_rank()

    # --- one worker's part of a step -------------------------------------------------------------
    def extras_size(self, world_size: int) -> int:
        return self.num_float_buffer_values + 3 + self.tail_size(world_size)

    def reduce_step(
        self,
        step: int,
        virtual_nodes: list[int],
        *,
        rank: int,
        world_size: int,
        leave: Callable[[], bool],
        comm: Collectives,
        requests: Requests = NO_REQUESTS,
    ) -> tuple[torch.Tensor, float]:
        """Compute this worker's virtual nodes (each pass reduce-scatters its gradient), then
        all-reduce the extras: the reduced extras for ``apply`` and the compute time."""
        passes = math.ceil(self.config.virtual_nodes / world_size)
        extras = torch.zeros(self.extras_size(world_size), dtype=torch.float64)
        started = time.perf_counter()
        try:
            self._passes(step, virtual_nodes, passes, extras)
        except RuntimeError as error:
            self.spec.model.zero_grad(set_to_none=True)
            if raised_by_a_collective(error):  # one of FSDP2's: a peer left or died
                raise ReductionFailed(str(error)) from error
            raise
        q = self.num_float_buffer_values
        nonfinite, squared = self._local_gradient_summary()
        extras[q + NONFINITE] = nonfinite
        extras[q + SQUARED_NORM] = squared
        seconds = time.perf_counter() - started
        tail = extras[q + 3 :]
        tail[rank] = seconds
        tail[world_size] = 1.0 if leave() else 0.0
        self._write_requests(tail[world_size + 1 :], requests)
        comm.all_reduce(extras).wait()
        return extras, seconds

    def _passes(self, step: int, virtual_nodes: list[int], passes: int, extras: torch.Tensor) -> None:
        """Forward and backward of each virtual node from the step's buffers, FSDP2 adding each pass's
        reduce-scattered gradient to the shards; padding passes (weight 0) repeat the last batch.
        The float buffers and losses of the real passes are summed into ``extras``."""
        if not virtual_nodes:
            raise ValueError("every worker of a sharded world needs a virtual node (V >= world size)")
        model = self.spec.model
        model.train()
        model.zero_grad(set_to_none=True)
        start_buffers = [b.detach().clone() for b in self.buffers]
        self.loader.prepare(step, virtual_nodes, self.position)
        per_step = self.spec.shard_gather == "per_step"
        if per_step:  # no padding passes: each unit's two collectives come once per step anyway
            passes = len(virtual_nodes)
        batch: Any = None
        try:
            for index in range(passes):
                if per_step:
                    self._gather_once(last_pass=index == passes - 1)
                started = time.perf_counter()
                real = index < len(virtual_nodes)
                k = virtual_nodes[min(index, len(virtual_nodes) - 1)]
                with torch.no_grad():
                    for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                        buffer.copy_(saved)
                if real:
                    batch = to_device(self.loader.batch(step, k), self.device)
                seed_generators(derived_seed(self.config.seed, step, k, 1), self.device)
                with self.update.autocast(self.device_type):
                    loss = self.spec.loss_fn(model, batch)
                weight = 1.0 if real else 0.0
                (self.update.scale_loss(loss) * weight).backward()  # type: ignore[no-untyped-call]
                if real:
                    self._add_buffers_and_loss_to_extras(extras, loss)
                self._simulate_device(time.perf_counter() - started)
            self._advanced_buffers = [b.detach().clone() for b in self.buffers]
        finally:
            if per_step:
                self._reshard_after_forward_as_built()
            with torch.no_grad():
                for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                    buffer.copy_(saved)

    def _gather_once(self, *, last_pass: bool) -> None:
        """FSDP2's gradient accumulation: the parameters stay whole from the first pass's gather to the
        last pass's backward, the gradient accumulates whole and is reduce-scattered after the last."""
        model = self.spec.model
        assert isinstance(model, FSDPModule)
        model.set_reshard_after_forward(False)
        model.set_reshard_after_backward(last_pass)
        model.set_requires_gradient_sync(last_pass)

    def _reshard_after_forward_as_built(self) -> None:
        """``fully_shard``'s own choice back, for evaluation and the next step: every unit reshards
        after its forward, the root (whose backward comes first) does not."""
        for module in self.spec.shard_modules:
            assert isinstance(module, FSDPModule)
            module.set_reshard_after_forward(True, recurse=False)
        model = self.spec.model
        assert isinstance(model, FSDPModule)
        model.set_reshard_after_forward(False, recurse=False)

    def _add_buffers_and_loss_to_extras(self, extras: torch.Tensor, loss: torch.Tensor) -> None:
        offset = 0
        for buffer in self.float_buffers:
            extras[offset : offset + buffer.numel()] += buffer.detach().reshape(-1).cpu().double()
            offset += buffer.numel()
        extras[offset + LOSS] += float(loss.detach())

    def _local_shards(self) -> list[torch.Tensor]:
        """This worker's pieces of the step's gradient (a parameter no pass used has none)."""
        shards = []
        for param in self.params:
            grad = param.grad
            if grad is not None:
                shards.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        return shards

    @property
    def _correction(self) -> float:
        """What turns the accumulated shards into the mean gradient: N/V (FSDP2 divided each pass's
        sum by N), times the inverse loss scale under fp16."""
        inverse = self.update.scaler.inverse if self.update.scaler is not None else 1.0
        return inverse * self.world_size / self.config.virtual_nodes

    def _local_gradient_summary(self) -> tuple[float, float]:
        """Non-finite values in this worker's gradient pieces, and the squared norm of its part of the
        mean gradient."""
        nonfinite, squared = 0, 0.0
        for shard in self._local_shards():
            nonfinite += int((~torch.isfinite(shard)).sum())
            squared += float(shard.double().pow(2).sum())
        return float(nonfinite), squared * self._correction**2

    # --- the update ------------------------------------------------------------------------------
    def apply(self, message: torch.Tensor, world_size: int) -> StepResult:
        """Turn the reduced extras and the gradient shards into the step's update, the same on every
        worker (each updates its own pieces)."""
        message = message.cpu()
        v, q = self.config.virtual_nodes, self.num_float_buffer_values
        loss = float(message[q + LOSS]) / v
        finite_gradient = float(message[q + NONFINITE]) == 0
        tail = message[q + 3 :]
        verdict = self.update.judge_finite(loss, finite_gradient)
        self.nonfinite_streak = self.nonfinite_streak + 1 if verdict.counted else 0
        factor = lr = grad_norm = None
        if not verdict.skipped:
            correction = self._correction
            if correction != 1.0:
                for shard in self._local_shards():
                    shard.mul_(correction)
            self.set_buffers((message[:q] / v).to(self.device))
            factor = self._scale_learning_rate(0.0, torch.empty(0))
            grad_norm = self._clip(float(message[q + SQUARED_NORM]))
            lr = float(self.spec.optimizer.param_groups[0]["lr"])
            self.spec.optimizer.step()
        self.spec.model.zero_grad(set_to_none=True)
        self.base_lrs = self.update.schedule(self.base_lrs)
        return StepResult(
            loss=loss,
            compute_seconds=[float(t) for t in tail[:world_size]],
            leave_requested=bool(tail[world_size] > 0),
            lr_factor=factor,
            skipped=verdict.skipped,
            overflow=verdict.overflow,
            lr=lr,
            grad_norm=grad_norm,
            loss_scale=self.update.loss_scale,
            requests=self._read_requests(tail[world_size + 1 :]),
        )

    def _clip(self, squared_norm: float) -> float | None:
        """``clip_grad_norm_`` over the whole gradient, whose squared norm the world summed."""
        limit = self.spec.clip_grad_norm
        if limit is None:
            return None
        norm = math.sqrt(squared_norm)
        coefficient = limit / (norm + 1e-6)
        if coefficient < 1.0:
            for shard in self._local_shards():
                shard.mul_(coefficient)
        return norm

    # --- the state: whole tensors on the CPU, gathered and scattered ------------------------------
    def model_state(self) -> dict[str, Any]:
        """The model's whole state, gathered on every worker (collective: every worker calls it)."""
        return {name: _whole(value) for name, value in self.spec.model.state_dict().items()}

    def shard_state(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[Any]]]:
        """This worker's pieces of the model and optimizer state, copied to the CPU (no collective),
        and which entries are pieces: ``{"model": [names], "optimizer": [[index, key]]}``."""
        model, names = {}, []
        for name, value in self.spec.model.state_dict().items():
            model[name] = _own_copy(value)
            if isinstance(value, DTensor):
                names.append(name)
        saved = self.spec.optimizer.state_dict()
        state, entries = {}, []
        for index, values in saved["state"].items():
            state[index] = {key: _own_copy(value) for key, value in values.items()}
            entries += [[index, key] for key, value in values.items() if isinstance(value, DTensor)]
        optimizer = {"state": state, "param_groups": copy.deepcopy(saved["param_groups"])}
        return model, optimizer, {"model": names, "optimizer": entries}

    def load_model_state(self, saved: Mapping[str, Any]) -> None:
        current = self.spec.model.state_dict()
        pieces = {name: self._piece_like(value, current[name]) for name, value in saved.items()}
        self.spec.model.load_state_dict(pieces)

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state in the replicated format (whole tensors by parameter index)."""
        saved = self.spec.optimizer.state_dict()
        state = {
            index: {key: _whole(value) for key, value in entries.items()}
            for index, entries in saved["state"].items()
        }
        return {"state": state, "param_groups": saved["param_groups"]}

    def load_optimizer_state(self, saved: Mapping[str, Any]) -> None:
        flat = [param for group in self.spec.optimizer.param_groups for param in group["params"]]
        state = {
            index: {key: self._piece_like(value, flat[index]) for key, value in entries.items()}
            for index, entries in saved["state"].items()
        }
        self.spec.optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})

    def load_shard_state(
        self, model: Mapping[str, Any], optimizer: Mapping[str, Any], sharded: Mapping[str, list[Any]]
    ) -> None:
        """Load this worker's own pieces (already in this world's layout; ``sharded`` names them)."""
        current = self.spec.model.state_dict()
        pieces = set(sharded["model"])
        self.spec.model.load_state_dict(
            {
                name: _local_as(value, current[name]) if name in pieces else value
                for name, value in model.items()
            }
        )
        flat = [param for group in self.spec.optimizer.param_groups for param in group["params"]]
        entries = {(index, key) for index, key in sharded["optimizer"]}
        state = {
            index: {
                key: _local_as(value, flat[index]) if (index, key) in entries else value
                for key, value in values.items()
            }
            for index, values in optimizer["state"].items()
        }
        self.spec.optimizer.load_state_dict({"state": state, "param_groups": optimizer["param_groups"]})

    def _piece_like(self, whole: Any, like: Any) -> Any:
        """This worker's piece of ``whole`` when ``like`` is a sharded tensor of its shape (FSDP2's
        layout: rank r holds ``torch.chunk(whole, N)[r]``, empty past the last chunk); else ``whole``."""
        if not (isinstance(like, DTensor) and isinstance(whole, torch.Tensor) and whole.shape == like.shape):
            return whole
        chunks = torch.chunk(whole, self.world_size, dim=0)
        local = chunks[self.rank] if self.rank < len(chunks) else whole.new_empty((0, *whole.shape[1:]))
        return _local_as(local, like)


def raised_by_a_collective(error: BaseException) -> bool:
    """Whether ``error`` came out of a c10d collective (gloo raises a plain RuntimeError when a peer is
    gone, from the Work's wait in distributed_c10d), not out of the model or the loss."""
    if isinstance(error, torch.distributed.DistError):
        return True
    innermost = error.__traceback__
    while innermost is not None and innermost.tb_next is not None:
        innermost = innermost.tb_next
    return innermost is not None and innermost.tb_frame.f_code.co_filename.endswith("distributed_c10d.py")


def _local_as(local: torch.Tensor, like: DTensor) -> DTensor:
    """``local`` as this worker's piece of a sharded tensor laid out like ``like``."""
    local = local.to(device=like.device, dtype=like.dtype).contiguous()
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    )


def _own_copy(value: Any) -> Any:
    """This worker's piece of a sharded tensor, or a tensor, copied to the CPU; anything else as it is."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    return value


def _whole(value: Any) -> Any:
    """A sharded tensor gathered whole (collective), on the CPU; anything else as it is."""
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value
