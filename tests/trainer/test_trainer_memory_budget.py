"""Trainer tier: memory elasticity (spec.bandLimit) with real launchers, elastic agents, workers and
gloo, on the CPU and (GPU tier) on one GPU that both workers share.

The test plays the operator and the kubelet: it writes the memory budget into the file the workers'
environment names, atomically, as the kubelet swaps a projected volume's files. The band-limited
digits CNN (examples/digits_cnn) trains with V=4, B=32 on two workers; a budget of 1 MiB fits no rate
(the largest, 0.75, is used), a budget of a terabyte fits the full spectrum again.

On a GPU rank 0 measures the footprint with ``torch.cuda.max_memory_allocated`` instead of the CPU
profiler; the workers reduce with gloo (nccl cannot put two ranks on one GPU). The CPU run hides CUDA
so that it stays a CPU run on a machine with a GPU.
"""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import Job, Node, needs_cuda, running_job
from ebbflow_devtools.waiting import wait_for
from ebbflow_trainer.step.memory_budget import RATES

CNN = str(Path(__file__).resolve().parents[2] / "examples" / "digits_cnn" / "train.py")
STEPS = 60
# Modelled device time per virtual node: the run lasts long enough to change the budget twice (a GPU
# computes a step in milliseconds, so there the model takes longer: 60 steps of 0.2 s).
SLOW_STEPS = {"cpu": ["--simulated-vnode-seconds", "0.02"], "cuda": ["--simulated-vnode-seconds", "0.1"]}
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, needs_cuda]),
]
# The CUDA caching allocator hands out blocks in multiples of this: every CUDA-measured size is one.
CUDA_BLOCK_BYTES = 512


def _write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _band_limited(job: Job, budget_file: Path, device: str) -> dict[str, str]:
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    return job.environment(
        **{contract.ENV_BAND_LIMIT: "true", contract.ENV_MEMORY_BUDGET_FILE: str(budget_file), **hidden}
    )


def _await(job: Job, condition: Any, timeout: float, what: str) -> Any:
    try:
        return wait_for(condition, timeout, what)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def _switched(nodes: list[Node], count: int) -> bool:
    return all(len(n.events("rate")) >= count for n in nodes)


@pytest.mark.parametrize("device", DEVICES)
def test_every_worker_follows_the_budget_at_the_same_step_and_no_step_is_lost(
    tmp_path: Path, device: str
) -> None:
    """Both workers switch at the same step (to 0.75 for a budget nothing fits, back to 0 for a huge
    one), no step is lost or repeated, and rank 0's one measurement travels in the state: what each
    rate needs shrinks as the rate grows, and on a GPU it was measured on the GPU (caching-allocator
    block sizes), not by the CPU profiler."""
    budget = tmp_path / "memory-budget-mib"
    args = [*SLOW_STEPS[device], "--backend", "gloo"]
    with running_job(
        tmp_path, min_replicas=2, max_replicas=2, steps=STEPS, script=CNN, extra_args=args
    ) as job:
        nodes = [job.start_node(env=_band_limited(job, budget, device)) for _ in range(2)]
        _await(job, lambda: (nodes[0].last_step() or {}).get("step", 0) >= 3, 300, "training")
        _write(budget, "1")
        _await(job, lambda: _switched(nodes, 1), 60, "every worker to compress")
        _write(budget, str(1 << 20))
        _await(job, lambda: _switched(nodes, 2), 120, "every worker back to the full spectrum")
        assert job.wait_all(nodes, 300) == [0, 0], job.logs()
        final = job.final_checkpoint()
        progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
        logs = job.logs()
    switches = [[(e["step"], e["rate"], e["previous"]) for e in n.events("rate")] for n in nodes]
    assert switches[0] == switches[1], "the same switches at the same steps on every worker"
    (down, rate, was), (up, back, before) = switches[0]
    assert (rate, was, back, before) == (0.75, 0.0, 0.0, 0.75) and 3 <= down < up < STEPS
    for node in nodes:
        trained = [(e["step"], e["world"]) for e in node.events("step")]
        assert trained == [(step, 2) for step in range(1, STEPS + 1)], "every step once, in one world"
    assert final["step"] == STEPS and final["compression_rate"] == 0.0
    assert final["footprint"] is not None, "the measurement travels in the state"
    peaks = dict(final["footprint"]["peaks"])
    assert list(peaks) == list(RATES), peaks
    needs = [peaks[rate] for rate in RATES]
    assert all(more > less for more, less in pairwise(needs)), f"{device}: {peaks}"
    assert final["footprint"]["resident"] > 0
    if device == "cuda":
        assert all(peak % CUDA_BLOCK_BYTES == 0 for peak in needs), f"not measured on the GPU: {peaks}"
    assert progress["step"] == STEPS and progress["compressionRate"] == 0.0
    assert logs.count("no compression rate fits the memory budget of 1 MiB") == 1, "rank 0 alone, once"
