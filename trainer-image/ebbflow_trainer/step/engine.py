"""One training step over virtual nodes: local gradient computation, the message to reduce, the update.

Each virtual node k computes, from the step's starting parameters and buffers, the gradient of the
mean loss over its B/V samples; the step's gradient is the plain mean of the V virtual-node
gradients, so a step means the same thing for any number of workers. ``deterministic`` mode gives
bitwise identical parameters for every world size and assignment of virtual nodes (exact sums,
:mod:`ebbflow_trainer.step.exact`, or a row table for small models); ``fast`` mode all-reduces one
floating-point message in buckets while the backward pass runs, as DDP does.

Invariants: floating-point buffers are averaged over virtual nodes like gradients; every worker reads
the same reduced message, so every worker switches batch size or compression rate at the same step
and skips the same non-finite steps (counted in ``nonfinite_streak``, part of the handed-over state).
How each mode works and what the message carries: docs/design/step.md.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ebbflow_trainer import global_batch
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.data import VirtualNodeLoader, to_device
from ebbflow_trainer.evaluation import Evaluation
from ebbflow_trainer.lr_scaling import GradientNoiseScale, MomentumCorrection, lr_factor, noise_estimates
from ebbflow_trainer.sharding import DataPosition, derived_seed
from ebbflow_trainer.step import exact, memory_budget
from ebbflow_trainer.step.bandlimit import band_limit, set_compression_rate
from ebbflow_trainer.step.buckets import GradientBuckets, Pending
from ebbflow_trainer.step.update import OptimizerStep


@dataclass(frozen=True)
class Requests:
    """What rank 0 asks every worker to switch to after a step, carried in that step's message: a
    global batch (:mod:`.global_batch`; 0: none) and a compression rate (:mod:`.memory_budget`'s
    message value; 0: none)."""

    batch: int = 0
    rate: int = 0


NO_REQUESTS = Requests()


@dataclass
class StepResult:
    loss: float
    compute_seconds: list[float]
    leave_requested: bool
    lr_factor: float | None  # None when the step was skipped
    skipped: bool = False  # the step's loss or gradient was not finite: nothing was updated
    overflow: bool = False  # skipped for an fp16 gradient overflow: not counted toward the streak
    lr: float | None = None  # the first parameter group's LR the step used; None when skipped
    grad_norm: float | None = None  # the combined gradient's norm before clipping (when clipping)
    loss_scale: float | None = None  # the fp16 loss scale for the next step
    requests: Requests = field(default_factory=lambda: NO_REQUESTS)  # rank 0's, from the next step on


class ReductionFailed(Exception):
    """A collective failed (a peer left or died): the step cannot complete in this world."""


class Collectives(Protocol):
    """The world's collectives as the engine needs them (see ``collectives.DistCollectives``)."""

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        """Start a sum all-reduce of ``tensor`` in place; the result is there once ``wait`` returns."""
        ...

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        """A max all-reduce of ``tensor`` in place, blocking."""
        ...


class _Done:
    def wait(self) -> None:
        return None


class WorldOfOne:
    """Collectives of a world with a single worker: every reduction leaves its tensor as it is. Also
    how tests and benchmarks drive a worker's share of a step without a process group."""

    def all_reduce(self, tensor: torch.Tensor) -> Pending:
        return _Done()

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        return None


class VirtualNodeEngine:
    """Computes virtual-node gradients and applies the combined update to the model and optimizer."""

    def __init__(
        self, spec: TrainingSpec, config: TrainerConfig, *, message_device: torch.device | None = None
    ):
        """The model must already be on its device. ``message_device``: where the reduced message lives
        (the model's GPU for nccl, which cannot reduce CPU tensors; the CPU, the default, for gloo)."""
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
        # Deterministic mode's fixed-point grid: blocks per segment (gradient, buffers, loss and norm).
        self.layout = exact.BlockLayout([self.num_params, self.num_float_buffer_values, 2])
        self._gradient_blocks = self.layout.segment_blocks[0]
        self._agreement: torch.Tensor | None = None
        self.base_lrs = [float(group["lr"]) for group in spec.optimizer.param_groups]
        self.momentum = MomentumCorrection(spec.optimizer) if config.momentum_correction else None
        self.base_batch_size = config.base_batch_size or config.global_batch_size
        # Where the current global batch began in the sample stream (see .sharding); its B is the step's.
        self.num_samples = len(spec.dataset)
        self.position = DataPosition(config.global_batch_size)
        self.request_digits = global_batch.digits(config)
        # spec.bandLimit: the Conv2d layers become band-limited (exact at rate 0); one message value
        # carries rank 0's rate request. The footprint is measured once, by rank 0, when first needed.
        self.rates = memory_budget.allowed_rates(config.max_compression_rate) if config.band_limit else ()
        self.compression_rate = 0.0
        self.footprint: memory_budget.Footprint | None = None
        if config.band_limit:  # the trainer owns the rate: it starts at 0 whatever the script set
            band_limit(spec.model)
            self.switch_rate(0.0)
        self.noise = GradientNoiseScale()
        self.nonfinite_streak = 0
        self._advanced_buffers: list[torch.Tensor] = []
        self.device = self.params[0].device
        self.device_type = self.device.type
        self.message_device = message_device or torch.device("cpu")
        self.update = OptimizerStep(spec)
        self.evaluation = Evaluation(spec, lambda: self.update.autocast(self.device_type))
        pin = self.device_type == "cuda" and torch.cuda.is_available()
        self.loader = VirtualNodeLoader(spec, config, pin_memory=pin)
        self.buckets: GradientBuckets | None = None
        self._fast_message: torch.Tensor | None = None
        offsets = [0]
        for param in self.params[:-1]:
            offsets.append(offsets[-1] + param.numel())
        if self.method == "sum":
            self.buckets = GradientBuckets(self.params, config.bucket_bytes, track_norm=self.tracks_noise)
            offsets = self.buckets.plan.offsets
        # Where each parameter's gradient starts in the message (reverse order in fast mode's buckets).
        self.gradient_offsets = offsets

    # Whether reading or loading the state below is a collective every worker joins (sharded state).
    collective_state = False

    def join_world(self, world_size: int) -> None:
        """Called once this process's world of ``world_size`` has its process group."""

    def model_state(self) -> dict[str, Any]:
        """The model's whole state as the handoff and checkpoints hold it."""
        return self.spec.model.state_dict()

    def load_model_state(self, saved: Mapping[str, Any]) -> None:
        self.spec.model.load_state_dict(saved)

    def optimizer_state(self) -> dict[str, Any]:
        return self.spec.optimizer.state_dict()

    def load_optimizer_state(self, saved: Mapping[str, Any]) -> None:
        self.spec.optimizer.load_state_dict(dict(saved))

    def close(self) -> None:
        """Stop background work (the data loader's processes) and unhook the parameters."""
        self.loader.close()
        if self.buckets is not None:
            self.buckets.close()

    @property
    def global_batch_size(self) -> int:
        """B of the steps computed from now on."""
        return self.position.global_batch_size

    @property
    def samples_per_virtual_node(self) -> int:
        return self.global_batch_size // self.config.virtual_nodes

    def switch_rate(self, rate: float) -> None:
        """Compute the steps from now on with the band-limited layers at ``rate``."""
        set_compression_rate(self.spec.model, rate)
        self.compression_rate = rate

    def measured_footprint(self) -> memory_budget.Footprint:
        """The footprint of this job's virtual nodes at every allowed rate: measured the first time."""
        if self.footprint is None:
            self.footprint = memory_budget.measure(
                self.spec,
                self.samples_per_virtual_node,
                self.rates,
                self.device,
                lambda: self.update.autocast(self.device_type),
            )
        return self.footprint

    def switch_batch(self, step: int, batch: int) -> None:
        """From ``step`` on, compute steps of ``batch`` samples; they continue the sample stream where
        step ``step - 1`` stopped."""
        self.position = self.position.switched(step, batch, self.num_samples)

    @property
    def tracks_noise(self) -> bool:
        """Whether steps need each virtual node's squared gradient norm (the gradient-noise estimate
        of LR scaling); fast mode adds it up only then."""
        return self.config.lr_scaling != "none" and self.config.virtual_nodes > 1

    # --- one worker's part of a step -------------------------------------------------------------
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
        """Compute this worker's virtual nodes of ``step`` and all-reduce them with the world: the
        reduced message for ``apply`` and the compute time. ``leave`` is read once computing is done;
        ``requests``: rank 0's (none from every other rank)."""
        if self.buckets is not None:
            return self._overlapped_step(step, virtual_nodes, rank, world_size, leave, comm, requests)
        rows, seconds = self.compute_rows(step, virtual_nodes)
        agreement = self.agreement(rows)
        if agreement is not None:
            agreement = agreement.to(self.message_device)
            comm.all_reduce_max(agreement)
        message = self.pack(
            rows,
            rank=rank,
            world_size=world_size,
            compute_seconds=seconds,
            leave=leave(),
            agreement=agreement,
            requests=requests,
        )
        comm.all_reduce(message).wait()
        return message, seconds

    def _overlapped_step(
        self,
        step: int,
        virtual_nodes: list[int],
        rank: int,
        world_size: int,
        leave: Callable[[], bool],
        comm: Collectives,
        requests: Requests,
    ) -> tuple[torch.Tensor, float]:
        """Fast mode: gradients go into the message as backward produces them (see :mod:`.buckets`);
        the extras (buffers, loss, squared norms, compute time, leave flag, requests) are added
        after each virtual node and ride in the last bucket."""
        buckets = self.buckets
        assert buckets is not None
        size = self.message_size(world_size)
        if self._fast_message is None or self._fast_message.numel() != size:
            self._fast_message = torch.zeros(size, dtype=self.dtype, device=self.device)
        message = self._fast_message
        p, q = self.num_params, self.num_float_buffer_values
        started = time.perf_counter()
        buckets.begin(message, comm.all_reduce)
        try:
            with contextlib.closing(self._virtual_nodes(step, virtual_nodes)) as computed:
                for _, loss in computed:
                    self._add_buffers_and_loss(message, loss)
            if self.tracks_noise:
                inverse = self.update.scaler.inverse if self.update.scaler is not None else 1.0
                message[p + q + 1] = buckets.squared_norm * (inverse * inverse)
            seconds = time.perf_counter() - started
            message[self.row_size + rank] = seconds
            message[self.row_size + world_size] = 1.0 if leave() else 0.0
            self._write_requests(message[self.row_size + world_size + 1 :], requests)
            buckets.finish()
            return buckets.wait(), seconds
        except ReductionFailed:
            buckets.abandon()
            raise

    def _add_buffers_and_loss(self, message: torch.Tensor, loss: torch.Tensor) -> None:
        """Fast mode: add one virtual node's float buffers and loss to the step's message extras."""
        offset = self.num_params
        for buffer in self.float_buffers:
            message[offset : offset + buffer.numel()] += buffer.detach().reshape(-1).to(self.dtype)
            offset += buffer.numel()
        message[offset] += loss.detach().to(self.dtype)

    def compute_rows(self, step: int, virtual_nodes: list[int]) -> tuple[dict[int, torch.Tensor], float]:
        """Deterministic mode: rows for this worker's virtual nodes at ``step``, and the (possibly
        simulated) compute time."""
        rows: dict[int, torch.Tensor] = {}
        started = time.perf_counter()
        for k, loss in self._virtual_nodes(step, virtual_nodes):
            gradient = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                    for p in self.params
                ]
            )
            unscaled = self.update.unscale(gradient)  # the row keeps the scaled gradient (fp16)
            parts = [gradient]
            parts += [b.detach().reshape(-1).to(self.dtype) for b in self.float_buffers]
            parts.append(loss.detach().reshape(1).to(self.dtype))
            parts.append(unscaled.dot(unscaled).reshape(1))
            rows[k] = torch.cat(parts)
        return rows, time.perf_counter() - started

    def _virtual_nodes(self, step: int, virtual_nodes: list[int]) -> Generator[tuple[int, torch.Tensor]]:
        """Forward and backward of each virtual node from the step's buffers, yielding (k, its loss)
        while its gradient and updated buffers are in place. Fast mode's buckets overlap the last
        backward pass. Afterwards the buffers are back at the step's values and the advanced integer
        buffers are kept for ``apply``."""
        config, model = self.config, self.spec.model
        model.train()
        start_buffers = [b.detach().clone() for b in self.buffers]
        self.loader.prepare(step, virtual_nodes, self.position)
        try:
            for position, k in enumerate(virtual_nodes):
                started = time.perf_counter()
                with torch.no_grad():
                    for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                        buffer.copy_(saved)
                batch = to_device(self.loader.batch(step, k), self.device)
                # Randomness inside the model (dropout) depends on (seed, step, k) only.
                seed_generators(derived_seed(config.seed, step, k, 1), self.device)
                model.zero_grad(set_to_none=True)
                with self.update.autocast(self.device_type):
                    loss = self.spec.loss_fn(model, batch)
                if self.buckets is not None and position == len(virtual_nodes) - 1:
                    self.buckets.overlap()
                self.update.scale_loss(loss).backward()  # type: ignore[no-untyped-call]
                yield k, loss
                self._simulate_device(time.perf_counter() - started)
            # Integer buffers advanced the same way on every virtual node; keep that value for apply().
            self._advanced_buffers = [b.detach().clone() for b in self.buffers]
        finally:
            # Also when a collective fails mid-step (a fast-mode bucket launched from inside backward):
            # the state a worker then hands over is the step's, not one its forward passes moved.
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for buffer, saved in zip(self.buffers, start_buffers, strict=True):
                    buffer.copy_(saved)

    def _simulate_device(self, real_seconds: float) -> None:
        """Model a slower (or busier) accelerator: tests and benchmarks on CPU need stable speeds."""
        extra = self.config.simulated_vnode_seconds * self.config.slowdown
        extra += (self.config.slowdown - 1.0) * real_seconds
        if extra > 0:
            time.sleep(extra)

    # --- the reduced message ---------------------------------------------------------------------
    @property
    def table_bytes(self) -> int:
        """The size of a row table: V rows."""
        return self.config.virtual_nodes * self.row_size * self.dtype.itemsize

    @property
    def method(self) -> str:
        """How virtual nodes are combined: "sum" (fast mode's buckets), "table" or "exact" (deterministic
        mode, by size)."""
        if self.config.mode != "deterministic":
            return "sum"
        return "table" if self.table_bytes <= self.config.row_table_limit else "exact"

    def agreement(self, rows: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """Exact sums: this worker's share of the step's fixed-point grid (see :mod:`.exact`), to
        all-reduce with MAX before ``pack``. None for the other methods, which need no agreement."""
        if self.method != "exact":
            return None
        return exact.local_agreement(self.layout, [rows[k] for k in sorted(rows)])

    def message_size(self, world_size: int, coded_values: int = 0) -> int:
        """Values in the all-reduced message: V rows (table) or one row (sum; exact, as int64 grid
        values plus ``coded_values`` non-finite counts of flagged buffer or loss blocks), then the tail."""
        rows = self.config.virtual_nodes if self.method == "table" else 1
        return rows * self.row_size + coded_values + self.tail_size(world_size)

    def tail_size(self, world_size: int) -> int:
        """The message's tail: compute times (one per worker), the leave flag, the batch request's
        digits (maxGlobalBatchSize only) and the rate request (bandLimit only)."""
        return world_size + 1 + self.request_digits + (1 if self.rates else 0)

    def _write_requests(self, values: torch.Tensor, requests: Requests) -> None:
        """Rank 0's requests into the tail after the leave flag (every other rank writes zeros)."""
        digits = global_batch.encode(requests.batch, self.request_digits)
        rate = [requests.rate] if self.rates else []
        if digits or rate:
            values.copy_(torch.tensor(digits + rate, dtype=values.dtype))

    def _read_requests(self, values: torch.Tensor) -> Requests:
        reduced = values.tolist()
        rate = round(reduced[self.request_digits]) if self.rates else 0
        return Requests(global_batch.decode(reduced[: self.request_digits]), rate)

    def message_bytes(self, world_size: int) -> int:
        """Bytes all-reduced per step when every value is finite, the grid agreement included."""
        if self.method != "exact":
            return self.message_size(world_size) * self.dtype.itemsize
        agreement = 2 * self.layout.num_blocks * torch.int32.itemsize
        return self.message_size(world_size) * torch.int64.itemsize + agreement

    def _coded_positions(self, agreement: torch.Tensor) -> torch.Tensor:
        """Values whose non-finite counts travel: flagged blocks outside the gradient (a non-finite
        gradient skips the step whatever its values, so its flag is all that is needed)."""
        flagged = agreement[1] > 0
        flagged[self._gradient_blocks.start : self._gradient_blocks.stop] = False
        return self.layout.positions(flagged)

    def pack(
        self,
        rows: dict[int, torch.Tensor],
        *,
        rank: int,
        world_size: int,
        compute_seconds: float,
        leave: bool,
        agreement: torch.Tensor | None = None,
        requests: Requests = NO_REQUESTS,
    ) -> torch.Tensor:
        """This worker's message. Exact sums need the MAX-reduced ``agreement`` (a lone worker may
        omit it)."""
        if self.method == "exact":
            return self._pack_exact(rows, rank, world_size, (compute_seconds, leave, requests), agreement)
        message = torch.zeros(self.message_size(world_size), dtype=self.dtype, device=self.message_device)
        row_area = message[: message.numel() - self.tail_size(world_size)]
        if self.method != "table":
            raise ValueError("fast mode reduces through reduce_step's buckets, not rows")
        table = row_area.view(self.config.virtual_nodes, self.row_size)
        for k, row in rows.items():
            table[k].copy_(row)
        tail = message[row_area.numel() :]
        tail[rank] = compute_seconds
        tail[world_size] = 1.0 if leave else 0.0
        self._write_requests(tail[world_size + 1 :], requests)
        return message

    def _pack_exact(
        self,
        rows: dict[int, torch.Tensor],
        rank: int,
        world_size: int,
        extras: tuple[float, bool, Requests],
        agreement: torch.Tensor | None,
    ) -> torch.Tensor:
        """``extras``: this worker's compute seconds, leave flag and requests."""
        compute_seconds, leave, requests = extras
        if agreement is None:
            if world_size != 1:
                raise ValueError("exact sums: all-reduce agreement(rows) with MAX and pass it to pack")
            agreement = self.agreement(rows)
            assert agreement is not None
        agreement = agreement.cpu()  # reduced on the message's device; a few bytes per block
        self._agreement = agreement
        ordered = [rows[k] for k in sorted(rows)]
        positions = self._coded_positions(agreement)
        size = self.message_size(world_size, positions.numel())
        message = torch.zeros(size, dtype=torch.int64, device=self.message_device)
        exact.encode(self.layout, ordered, agreement, self.config.virtual_nodes, out=message[: self.row_size])
        counts = exact.count_nonfinite(ordered, positions)
        message[self.row_size : self.row_size + positions.numel()] = counts.to(message.device)
        tail = message[self.row_size + positions.numel() :]
        # A float's bits plus zeros from every other worker: the sum is that float, exactly.
        tail[rank] = int(torch.tensor([compute_seconds], dtype=torch.float64).view(torch.int64)[0])
        tail[world_size] = 1 if leave else 0
        self._write_requests(tail[world_size + 1 :], requests)
        return message

    # --- the update ------------------------------------------------------------------------------
    def apply(self, message: torch.Tensor, world_size: int) -> StepResult:
        """Turn the all-reduced message into the step's update; identical on every worker."""
        mean, tail = self._unpack(message)
        mean, tail = mean.to(self.device), tail.cpu()  # gloo reduces on the CPU, nccl on the GPU
        p, q = self.num_params, self.num_float_buffer_values
        gradient, buffer_values = mean[:p], mean[p : p + q]
        loss, small_sq_norm = float(mean[p + q]), float(mean[p + q + 1])
        gradient = self.update.unscale(gradient)
        # Buffers may hold infinities by design (attention masks), so only the loss and gradient count.
        verdict = self.update.judge(loss, gradient)
        self.nonfinite_streak = self.nonfinite_streak + 1 if verdict.counted else 0
        factor = lr = grad_norm = None
        if not verdict.skipped:
            self._set_gradient_and_buffers(gradient, buffer_values)
            factor = self._scale_learning_rate(small_sq_norm, gradient)
            grad_norm = self.update.clip(self.params)
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

    def _unpack(self, message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean row over the V virtual nodes, and the tail of the message (compute times, the
        leave flag, the requests)."""
        v = self.config.virtual_nodes
        if self.method == "exact":
            return self._unpack_exact(message)
        if self.method == "sum":  # the message is the engine's own buffer: divide it in place
            return message[: self.row_size].div_(v), message[self.row_size :]
        # Adding +0.0 turns -0.0 into +0.0, as a reduction over several workers does.
        table = message[: v * self.row_size].view(v, self.row_size) + 0.0
        total = table[0].clone()
        for k in range(1, v):
            total += table[k]
        return total / v, message[v * self.row_size :]

    def _unpack_exact(self, message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        agreement = self._agreement
        assert agreement is not None, "pack() sets the step's grid agreement"
        positions = self._coded_positions(agreement)
        mean = exact.decode_mean(self.layout, message[: self.row_size], agreement, self.config.virtual_nodes)
        exact.restore_nonfinite(mean, positions, message[self.row_size : self.row_size + positions.numel()])
        # A gradient block some virtual node had a NaN or an infinity in: its values are NaN (the step
        # is skipped whatever they are, so their counts never travel).
        flagged = agreement[1, self._gradient_blocks.start : self._gradient_blocks.stop] > 0
        for piece in self.layout.pieces if bool(flagged.any()) else ():
            if piece.first_block in self._gradient_blocks:
                first = piece.first_block - self._gradient_blocks.start
                blocks = flagged[first : first + piece.blocks].to(mean.device)
                self.layout.view(mean, piece)[blocks] = math.nan
        bits = message[self.row_size + positions.numel() :]
        world_size = bits.numel() - self.tail_size(0)  # the compute times are a float64's bits
        tail = torch.cat([bits[:world_size].view(torch.float64), bits[world_size:].double()])
        return mean.to(self.dtype), tail

    def _set_gradient_and_buffers(self, gradient: torch.Tensor, buffer_values: torch.Tensor) -> None:
        # The mean is a fresh tensor: the gradients can be views of it.
        for param, offset in zip(self.params, self.gradient_offsets, strict=True):
            param.grad = gradient[offset : offset + param.numel()].view_as(param)
        self.set_buffers(buffer_values)

    def set_buffers(self, buffer_values: torch.Tensor) -> None:
        """The step's buffers: integer ones as the virtual nodes advanced them, float ones the mean."""
        offset = 0
        with torch.no_grad():
            for buffer, advanced in zip(self.buffers, self._advanced_buffers, strict=True):
                if not buffer.is_floating_point():
                    buffer.copy_(advanced)
            for buffer in self.float_buffers:
                values = buffer_values[offset : offset + buffer.numel()].view_as(buffer)
                buffer.copy_(values.to(buffer.dtype))
                offset += buffer.numel()

    def _scale_learning_rate(self, small_sq_norm: float, gradient: torch.Tensor) -> float:
        config = self.config
        if config.lr_scaling == "none":
            return 1.0
        if self.tracks_noise:
            big_sq_norm = float(gradient.dot(gradient))
            variance, sq_norm = noise_estimates(
                small_sq_norm, self.samples_per_virtual_node, big_sq_norm, self.global_batch_size
            )
            self.noise.update(variance, sq_norm)
        factor = lr_factor(
            config.lr_scaling,
            batch=self.global_batch_size,
            base_batch=self.base_batch_size,
            noise=self.noise,
        )
        groups = self.spec.optimizer.param_groups
        multipliers = self.momentum.apply(factor) if self.momentum else [factor] * len(groups)
        for group, base_lr, multiplier in zip(groups, self.base_lrs, multipliers, strict=True):
            group["lr"] = base_lr * multiplier
        return factor


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed the CPU's and ``device``'s random generators. ``torch.manual_seed`` does this for every
    accelerator backend torch knows, which costs milliseconds per call where they are absent."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device: the worker's own GPU
