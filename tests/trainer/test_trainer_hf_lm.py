"""Trainer tier: examples/hf_lm (a Hugging Face GPT-2 with bf16 autocast, AdamW with warmup, clipping
and a held-out perplexity) as a real job, one pod of one process, on the CPU and on a GPU.

The unit tier trains the example's spec in-process on the CPU; this runs the script the way a pod
does (launcher, forkserver, elastic agent, worker), where the model, the batches and the autocast
live on the worker's device and the evaluation hook gets the model there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from ebbflow_devtools.testing.trainer_cluster import REPO, needs_cuda, running_job

HF_LM = str(REPO / "examples" / "hf_lm" / "train.py")
STEPS = 30

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, needs_cuda]),
]


@pytest.mark.parametrize("device", DEVICES)
def test_hf_lm_trains_a_few_dozen_steps_and_evaluates_on_its_device(tmp_path: Path, device: str) -> None:
    """On CUDA this is the first run of bf16 autocast on a GPU with deterministic kernels (GPT-2's
    embedding and attention backward), nccl (``--backend auto``) and an eval hook that must bring its
    held-out text to the model's device: exit 0, every step once with a finite loss and none skipped,
    the loss falling, and the held-out perplexity after the last step finite. The CPU run (CUDA
    hidden, so gloo) checks the same on any machine."""
    with running_job(tmp_path, min_replicas=1, max_replicas=1, steps=STEPS, script=HF_LM) as job:
        env = job.environment(CUDA_VISIBLE_DEVICES="") if device == "cpu" else None
        node = job.start_node(env=env)
        assert job.wait_all([node], 240) == [0], job.logs()
        steps, evaluations = node.events("step"), node.events("eval")
        final = job.final_checkpoint()
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), "every step once"
    losses = [s["loss"] for s in steps]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert not any(s["skipped"] for s in steps), "bf16 needs no loss scale: no step is skipped"
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses
    assert [e["step"] for e in evaluations] == [STEPS], "evaluated after the last step"
    perplexity = evaluations[0]["metrics"]["perplexity"]
    assert math.isfinite(perplexity) and perplexity < 256, "better than uniform over 256 bytes"
    assert final["step"] == STEPS
