"""Trainer tier: two training processes per pod (``--nproc-per-node 2``), gloo on CPU, and the same
scenarios with nccl on GPUs where CUDA is available.

Every process of every pod is a member of one elastic world (two pods make a world of four), so V=4
gives each process one virtual node and the calm one-process run (``calm_reference``) stays the
reference: deterministic mode makes the result independent of how the processes are grouped in pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_devtools.testing.trainer_cluster import (
    HELD_DIGITS,
    Node,
    assert_bitwise_equal,
    needs_cuda,
    parameters_of,
    running_job,
    train_on_one_gpu,
)

TWO_PER_POD = ["--nproc-per-node", "2"]
SLOW_STEPS = ["--simulated-vnode-seconds", "0.02"]


def _ranks_at(node: Node, world: int) -> set[int]:
    return {r["rank"] for r in node.events("step") if r["world"] == world}


def _two_pods_of_two(tmp_path: Path, calm_reference: dict[str, Any], args: list[str]) -> None:
    with running_job(tmp_path, min_replicas=2, max_replicas=2, extra_args=[*TWO_PER_POD, *args]) as job:
        nodes = [job.start_node() for _ in range(2)]
        assert job.wait_all(nodes, 240) == [0, 0], job.logs()
        assert set(job.world_sizes_by_step().values()) == {4}
        assert sorted(r for n in nodes for r in _ranks_at(n, 4)) == [0, 1, 2, 3]
        # Each process keeps its own handoff file in its own directory.
        for node in nodes:
            assert sorted(p.name for p in node.state_dir.glob("local-*")) == ["local-0", "local-1"]
        final = job.final_checkpoint()
    assert final["step"] == calm_reference["step"] == 200
    assert_bitwise_equal(final, calm_reference)


def test_two_processes_per_pod_train_bitwise_like_one_process(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    _two_pods_of_two(tmp_path, calm_reference, [])


def _kill_a_pod_of_two(tmp_path: Path, calm_reference: dict[str, Any], args: list[str]) -> None:
    extra = [*TWO_PER_POD, *SLOW_STEPS, *args]
    with running_job(tmp_path, min_replicas=1, max_replicas=2, extra_args=extra) as job:
        nodes = [job.start_node() for _ in range(2)]
        job.wait_for_world(nodes[0], 4, min_step=10)
        # The pod with global rank 0 (the one that writes checkpoints and progress): both its processes die.
        victim = next(n for n in nodes if 0 in _ranks_at(n, 4))
        victim.kill_tree()
        (survivor,) = [n for n in nodes if n is not victim]
        assert job.wait_all([survivor], 300) == [0], job.logs()

        assert _ranks_at(survivor, 2) == {0, 1}, "the survivor's two processes re-form a world of two"
        generations = survivor.events("generation")
        before = max(g["generation"] for g in generations if g["world"] == 4)
        resumed = [g for g in generations if g["generation"] > before]
        assert resumed, "the survivor never formed a new world"
        first = min(g["generation"] for g in resumed)
        assert {g["world"] for g in resumed if g["generation"] == first} == {2}
        sources = {g["source"] for g in resumed if g["generation"] == first}
        assert "memory" in sources and sources <= {"memory", "peer"}, sources
        assert max(r["step"] for r in survivor.events("step") if r["world"] == 2) == 200
        final = job.final_checkpoint()
    assert_bitwise_equal(final, calm_reference)


def test_sigkill_of_a_pod_with_two_processes_leaves_two_survivors_that_finish_bitwise(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    _kill_a_pod_of_two(tmp_path, calm_reference, [])


def test_a_pod_of_two_joins_the_running_processes_of_another_and_the_result_is_bitwise(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    """The first pod's two processes train a world of two, then enter the world of four in place (each
    its own next world, by local rank); the newcomer's two receive the state from a peer."""
    extra = [*TWO_PER_POD, *SLOW_STEPS]
    with running_job(tmp_path, min_replicas=1, max_replicas=2, extra_args=extra, script=HELD_DIGITS) as job:
        first = job.start_node()
        job.wait_for_world(first, 2, min_step=1)
        (newcomer,) = job.start_held(1, running=(first,))
        assert job.wait_all([first, newcomer], 300) == [0, 0], job.logs()

        worlds = {(g["world"], g["rank"]): g for g in first.events("generation")}
        assert {w for w, _ in worlds} == {2, 4}, sorted(worlds)
        assert len({g["pid"] for g in worlds.values()}) == 2, "the same two processes trained both worlds"
        assert {g["source"] for (w, _), g in worlds.items() if w == 4} == {"memory"}
        assert {g["source"] for g in newcomer.events("generation")} == {"peer"}
        assert sorted(r for n in (first, newcomer) for r in _ranks_at(n, 4)) == [0, 1, 2, 3]
        final = job.final_checkpoint()
    assert_bitwise_equal(final, calm_reference)


@pytest.mark.gpu
@needs_cuda
def test_nccl_on_gpus_trains_bitwise_like_one_gpu_process(tmp_path: Path) -> None:
    """Two pods of two GPU processes on nccl against one process on one GPU: the same kernels compute
    every virtual node's gradient, so deterministic mode gives the same bits (a CPU reference may not:
    CPU and GPU kernels round differently)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    finals = []
    for pods, per_pod in ((1, "1"), (2, "2")):
        settings: dict[str, Any] = {"min_replicas": pods, "max_replicas": pods, "steps": 50}
        args = ["--nproc-per-node", per_pod, "--backend", "nccl"]
        root = tmp_path / f"pods-{pods}"
        root.mkdir()
        with running_job(root, extra_args=args, **settings) as job:
            nodes = [job.start_node() for _ in range(pods)]
            assert job.wait_all(nodes, 240) == [0] * pods, job.logs()
            finals.append(job.final_checkpoint())
    assert finals[0]["step"] == finals[1]["step"] == 50
    assert_bitwise_equal(finals[1], finals[0])


@pytest.mark.gpu
@needs_cuda
def test_deterministic_mode_on_a_gpu_is_bitwise_for_any_world_size(
    tmp_path: Path, two_gloo_pods_on_one_gpu: dict[str, Any]
) -> None:
    """Deterministic kernels (torch.use_deterministic_algorithms) and exact sums: one process or two on
    the GPU give the same bits. Fast mode's buckets, reduced through gloo from CUDA tensors, stay
    within float rounding of them."""
    one = train_on_one_gpu(tmp_path / "one", 1, "deterministic")
    two = two_gloo_pods_on_one_gpu
    assert one["step"] == two["step"] == 50
    assert_bitwise_equal(two, one)
    fast = train_on_one_gpu(tmp_path / "fast", 2, "fast")
    for name, value in parameters_of(one).items():
        assert torch.allclose(parameters_of(fast)[name].double(), value.double(), rtol=1e-4, atol=1e-6), name
