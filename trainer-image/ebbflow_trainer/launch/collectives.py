"""A worker process's devices and collectives: the backend and device it trains on, and the
engine's collectives over the default process group.

Invariant: a collective that fails because a peer left or died raises ``ReductionFailed`` (the world
re-forms), never the backend's own error type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.step.engine import ReductionFailed


def resolve_backend(config: TrainerConfig) -> str:
    """``--backend``: auto is nccl when CUDA is available, else gloo."""
    if config.backend != "auto":
        return config.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def training_device(local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available (one GPU per process), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def use_deterministic_kernels() -> None:
    """Deterministic mode on CUDA: a virtual node must give the same gradient bits in any process on
    any GPU, so kernels that add with atomics (index_add, scatter_add and the backward of embeddings
    and gathers) are replaced by deterministic ones, and cuBLAS gets the fixed workspace it needs for
    reproducible results (set before its first use). An op without a deterministic implementation
    raises, naming itself: such a model needs fast mode."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


class DistCollectives:
    """The engine's collectives over the default process group; a failed collective (a peer left or
    died) becomes ``ReductionFailed``. A tensor away from ``comm_device`` (a CUDA model with gloo)
    is reduced in a copy there, written back on wait."""

    def __init__(self, comm_device: torch.device):
        self.comm_device = comm_device

    def all_reduce(self, tensor: torch.Tensor) -> _InFlight:
        staged = tensor if tensor.device == self.comm_device else tensor.to(self.comm_device)
        try:
            work = dist.all_reduce(staged, async_op=True)
        except RuntimeError as error:
            raise ReductionFailed(str(error)) from error
        return _InFlight(work, staged, tensor)

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        except RuntimeError as error:
            raise ReductionFailed(str(error)) from error


@dataclass
class _InFlight:
    work: Any  # dist.Work
    staged: torch.Tensor
    target: torch.Tensor

    def wait(self) -> None:
        try:
            self.work.wait()
        except RuntimeError as error:
            raise ReductionFailed(str(error)) from error
        if self.staged is not self.target:
            self.target.copy_(self.staged)
