"""The bundled examples build and train: a few virtual-node steps lower their loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.engine import VirtualNodeEngine

from tests.trainer_config import trainer_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("script", ["digits/train.py", "tiny_lm/train.py"])
def test_example_trains_with_virtual_nodes(script: str) -> None:
    torch.manual_seed(0)
    spec = load_spec(str(EXAMPLES / script))
    config = trainer_config(spec=script, virtual_nodes=2, global_batch_size=32)
    engine = VirtualNodeEngine(spec, config)
    losses = []
    for step in range(8):
        rows, seconds = engine.compute_rows(step, [0, 1])
        result = engine.apply(
            engine.pack(rows, rank=0, world_size=1, compute_seconds=seconds, leave=False), 1
        )
        losses.append(result.loss)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
