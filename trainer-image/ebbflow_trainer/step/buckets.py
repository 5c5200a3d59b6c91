"""Fast mode's gradient all-reduce in buckets, started while the last virtual node's backward runs.

As DDP does: a worker holding several virtual nodes adds their gradients locally into the step's
message (a post-accumulate-grad hook, then the gradient is released), and during the last virtual
node's backward all-reduces each bucket whose parameters have all reported; the last bucket carries
the extras (buffers, loss, norms, compute times, the leave flag) once the backward has returned.

Invariants: buckets go strictly in order, so every worker issues the same collectives in the same
order; the reduced message divided by V is the mean over virtual nodes, whatever their number per
worker. State machine of one step: idle -(begin)-> accumulating -(overlap)-> overlapping
-(finish)-> reducing -(wait)-> idle, and from any of them -(abandon)-> idle when a collective failed
(the world re-forms and redoes the step); outside begin..finish a backward pass leaves ``.grad`` as usual.
More: docs/design/step.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's dist._DEFAULT_FIRST_BUCKET_BYTES


class Pending(Protocol):
    """An all-reduce in flight (``torch.distributed.Work`` or a stand-in)."""

    def wait(self) -> Any: ...


# Starts a sum all-reduce of a tensor in place across the world and returns at once (a backend that
# reduces elsewhere, gloo for a CUDA model, copies the tensor there and back on wait).
Launch = Callable[[torch.Tensor], Pending]


@dataclass(frozen=True)
class Bucket:
    """Message values ``start`` to ``stop`` (None: to the message's end), reduced once ``params``
    parameters have reported (the last bucket also waits for the extras)."""

    start: int
    stop: int | None
    params: int


@dataclass(frozen=True)
class BucketPlan:
    """Where each parameter's gradient lives in the message (``offsets``, in parameter order), which
    bucket it belongs to (``bucket_of``), and the buckets in the order they are reduced."""

    offsets: list[int]
    bucket_of: list[int]
    buckets: list[Bucket]


def plan_buckets(sizes: Sequence[int], itemsize: int, bucket_bytes: int) -> BucketPlan:
    """Lay out parameters of ``sizes`` values (in parameter order) in reverse order and cut them into
    buckets; the last bucket extends to the message's end, over the extras."""
    offsets, bucket_of = [0] * len(sizes), [0] * len(sizes)
    buckets: list[Bucket] = []
    start = position = count = 0
    for index in reversed(range(len(sizes))):
        offsets[index], bucket_of[index] = position, len(buckets)
        position += sizes[index]
        count += 1
        cap = min(FIRST_BUCKET_BYTES, bucket_bytes) if not buckets else bucket_bytes
        if (position - start) * itemsize >= cap and index > 0:
            buckets.append(Bucket(start, position, count))
            start, count = position, 0
    buckets.append(Bucket(start, None, count + 1))  # + the extras
    return BucketPlan(offsets, bucket_of, buckets)


class GradientBuckets:
    """Adds the parameters' gradients into a step's message and all-reduces it bucket by bucket."""

    def __init__(self, params: Sequence[torch.nn.Parameter], bucket_bytes: int, *, track_norm: bool):
        """``track_norm``: also sum every virtual node's squared gradient norm (for the gradient-noise
        estimate), read with ``squared_norm``."""
        self.params = list(params)
        itemsize = self.params[0].dtype.itemsize
        self.plan = plan_buckets([p.numel() for p in self.params], itemsize, bucket_bytes)
        self.track_norm = track_norm
        self._gradient_values = sum(p.numel() for p in self.params)
        self._written: list[bool] = []
        self._message: torch.Tensor | None = None
        self._launch: Launch | None = None
        self._overlapping = False
        self._waiting: list[int] = []
        self._next = 0
        self._in_flight: list[Pending] = []
        self._squared_norm: torch.Tensor | None = None
        self._hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_gradient, index))  # type: ignore[no-untyped-call]
            for index, p in enumerate(self.params)
        ]

    def close(self) -> None:
        """Remove the hooks from the parameters."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def begin(self, message: torch.Tensor, launch: Launch) -> None:
        """A step starts: gradients go into ``message`` until ``finish``. Its extras are zeroed here;
        a parameter's values are overwritten by its first gradient (zeroed at ``finish`` if none came),
        which saves a pass over the message."""
        message[self._gradient_values :].zero_()
        self._written = [False] * len(self.params)
        self._message, self._launch = message, launch
        self._overlapping = False
        self._waiting = [bucket.params for bucket in self.plan.buckets]
        self._next = 0
        self._in_flight = []
        self._squared_norm = torch.zeros((), dtype=torch.float64, device=message.device)

    def overlap(self) -> None:
        """The next backward pass is the worker's last of the step: reduce buckets as they fill."""
        self._overlapping = True

    @property
    def squared_norm(self) -> torch.Tensor:
        """Sum over this step's virtual nodes so far of their squared gradient norms (``track_norm``)."""
        assert self._squared_norm is not None, "begin() starts a step"
        return self._squared_norm

    def finish(self) -> None:
        """The extras are written: reduce whatever has not gone yet, the last bucket included."""
        message = self._message
        assert message is not None, "begin() starts a step"
        for index, written in enumerate(self._written):
            if not written:  # no virtual node used this parameter: its gradient is zero
                offset = self.plan.offsets[index]
                message[offset : offset + self.params[index].numel()].zero_()
        self._waiting = [0] * len(self.plan.buckets)
        self._launch_ready()
        self._overlapping = False

    def wait(self) -> torch.Tensor:
        """Wait for every bucket; the reduced message."""
        for pending in self._in_flight:
            pending.wait()
        message = self._message
        assert message is not None, "begin() starts a step"
        self._message, self._launch, self._in_flight = None, None, []
        return message

    def abandon(self) -> None:
        """A collective of this step failed: forget the step (its message and the buckets in flight,
        which the broken process group will never complete)."""
        self._message, self._launch, self._in_flight = None, None, []
        self._overlapping = False

    def _on_gradient(self, index: int, param: torch.Tensor) -> None:
        message = self._message
        if message is None or param.grad is None:
            return
        gradient = param.grad.detach().reshape(-1)
        offset = self.plan.offsets[index]
        target = message[offset : offset + gradient.numel()]
        if self._written[index]:
            target.add_(gradient)
        else:
            target.copy_(gradient)
            self._written[index] = True
        if self.track_norm:
            assert self._squared_norm is not None
            self._squared_norm += gradient.dot(gradient).double()
        param.grad = None
        if self._overlapping:
            self._waiting[self.plan.bucket_of[index]] -= 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Start every bucket from the next one on whose parameters have all reported, in order."""
        message, launch = self._message, self._launch
        assert message is not None and launch is not None
        buckets = self.plan.buckets
        while self._next < len(buckets) and self._waiting[self._next] <= 0:
            bucket = buckets[self._next]
            self._in_flight.append(launch(message[bucket.start : bucket.stop]))
            self._next += 1
