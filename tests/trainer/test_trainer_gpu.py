"""GPU tier on a single GPU: what the CPU tiers cannot reach (skipped without CUDA).

The other single-GPU tests sit beside their CPU scenarios: deterministic mode on one GPU in
test_trainer_multiproc.py, the memory budget measured on CUDA in test_trainer_memory_budget.py and
examples/hf_lm on CUDA in test_trainer_hf_lm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ebbflow_devtools.testing.trainer_cluster import assert_bitwise_equal, needs_cuda, train_on_one_gpu


@pytest.mark.gpu
@needs_cuda
def test_nccl_on_one_gpu_trains_bitwise_like_two_gloo_processes_sharing_it(
    tmp_path: Path, two_gloo_pods_on_one_gpu: dict[str, Any]
) -> None:
    """nccl builds, reduces and decodes the step's message on the GPU; gloo (two pods time-sharing the
    GPU) on the CPU. Deterministic mode's exact sums make the bits independent of where the message
    lives and of the world size, and both compute every virtual node with the same GPU kernels, so a
    one-process nccl world must end bitwise where the gloo pair does: a message built, reduced or
    turned back into gradients differently on the GPU (or a tensor left on the wrong device in the
    nccl path) shows here."""
    nccl = train_on_one_gpu(tmp_path / "nccl", 1, backend="nccl")
    gloo = two_gloo_pods_on_one_gpu
    assert nccl["step"] == gloo["step"] == 50
    assert_bitwise_equal(nccl, gloo)
