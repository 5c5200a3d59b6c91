"""The bundled examples build and train: a few virtual-node steps lower their loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import import_script, load_spec
from ebbflow_trainer.step.bandlimit import BandLimitedConv2d
from ebbflow_trainer.step.engine import StepResult, VirtualNodeEngine

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _train(engine: VirtualNodeEngine, steps: int) -> list[StepResult]:
    """``steps`` steps of one worker holding both virtual nodes, as the worker drives the engine."""
    results = []
    for step in range(steps):
        results.extend(step_world([engine], step))
    return results


@pytest.mark.parametrize(
    "script", ["digits/train.py", "digits_cnn/train.py", "tiny_lm/train.py", "hf_lm/train.py"]
)
def test_example_trains_with_virtual_nodes(script: str) -> None:
    torch.manual_seed(0)
    spec = load_spec(str(EXAMPLES / script))
    config = trainer_config(spec=script, virtual_nodes=2, global_batch_size=32)
    losses = [result.loss for result in _train(VirtualNodeEngine(spec, config), 8)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses


def test_the_hf_example_warms_up_clips_and_evaluates_held_out_perplexity() -> None:
    torch.manual_seed(0)
    spec = load_spec(str(EXAMPLES / "hf_lm/train.py"))
    assert spec.precision == "bf16" and spec.clip_grad_norm is not None and spec.eval_fn is not None
    # The loss is the batch's mean (what virtual nodes need): the mean of its sequences' losses.
    sequences = torch.stack([spec.dataset[i][0] for i in range(4)])
    spec.model.eval()
    with torch.no_grad():
        each = [float(spec.loss_fn(spec.model, [row[None]])) for row in sequences]
        assert float(spec.loss_fn(spec.model, [sequences])) == pytest.approx(sum(each) / 4, rel=1e-5)
    engine = VirtualNodeEngine(spec, trainer_config(spec="hf_lm", virtual_nodes=2, global_batch_size=32))
    before = engine.evaluation.run(0)
    assert before["perplexity"] == pytest.approx(math.exp(before["loss"]))
    assert before["perplexity"] > 100, "random weights: close to uniform over 256 bytes"
    results = _train(engine, 6)
    assert not any(result.skipped for result in results)
    lrs = [result.lr if result.lr is not None else math.nan for result in results]
    assert lrs == sorted(lrs), f"warmup raises the LR: {lrs}"
    assert lrs[0] == pytest.approx(3e-3 / 30)
    norms = [r.grad_norm if r.grad_norm is not None else math.nan for r in results]
    assert all(math.isfinite(n) for n in norms) and max(norms) > spec.clip_grad_norm, "clipping bites early"
    # The trainer evaluates every eval_every steps and after the last one.
    assert engine.evaluation.due(50, total_steps=spec.steps) and not engine.evaluation.due(49, spec.steps)
    after = engine.evaluation.run(6)
    assert after["perplexity"] < before["perplexity"], (before, after)


def test_digits_reaches_its_target_accuracy_on_held_out_images() -> None:
    torch.manual_seed(0)
    script = str(EXAMPLES / "digits/train.py")
    engine = VirtualNodeEngine(
        load_spec(script), trainer_config(spec="digits", virtual_nodes=4, global_batch_size=256)
    )
    assert engine.evaluation.run(0)["accuracy"] < 0.5, "random weights"
    _train(engine, 100)
    assert engine.evaluation.run(100)["accuracy"] >= import_script(script).TARGET_ACCURACY


def test_band_limited_digits_cnn_reaches_its_target_accuracy() -> None:
    torch.manual_seed(0)
    script = str(EXAMPLES / "digits_cnn/train.py")
    spec = load_spec(script)
    rates = {m.compression_rate for m in spec.model.modules() if isinstance(m, BandLimitedConv2d)}
    assert rates == {import_script(script).COMPRESSION_RATE}
    engine = VirtualNodeEngine(
        spec, trainer_config(spec="digits_cnn", virtual_nodes=4, global_batch_size=128)
    )
    assert engine.evaluation.run(0)["accuracy"] < 0.5, "random weights"
    _train(engine, 100)
    assert engine.evaluation.run(100)["accuracy"] >= import_script(script).TARGET_ACCURACY
