"""The digits example with corrupt (NaN) samples exactly where chosen steps draw their data.

``CORRUPT_STEPS=first:stop`` corrupts every sample of the steps ``first, ..., stop - 1`` (0-based
indices of the trainer's steps; the journal numbers a step by the count completed after it, so
index ``i`` is journal step ``i + 1``). An empty ``stop`` means "until the end of the first epoch".
Steps are located with the trainer's own sharding (seed 0, the job's V and B from the contract's
environment), so the corruption hits the same steps for every world size. Tests keep to the first
epoch (56 steps at B=32): later epochs draw the corrupt samples again, at other steps.
"""

from __future__ import annotations

import os
from pathlib import Path

from ebbflow_api import contract
from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.sharding import DataPosition, steps_per_epoch, virtual_node_indices
from torch.utils.data import TensorDataset

DIGITS = str(Path(__file__).resolve().parents[2] / "examples" / "digits" / "train.py")


def build() -> TrainingSpec:
    spec = load_spec(DIGITS)
    assert isinstance(spec.dataset, TensorDataset)
    images, labels = spec.dataset.tensors
    virtual_nodes = int(os.environ[contract.ENV_VIRTUAL_NODES])
    batch = int(os.environ[contract.ENV_GLOBAL_BATCH_SIZE])
    first, _, stop = os.environ["CORRUPT_STEPS"].partition(":")
    end = int(stop) if stop else steps_per_epoch(len(images), batch)
    corrupt = images.clone()
    for step in range(int(first), end):
        for k in range(virtual_nodes):
            indices = virtual_node_indices(
                seed=0,
                step=step,
                virtual_node=k,
                num_samples=len(images),
                virtual_nodes=virtual_nodes,
                position=DataPosition(batch),
            )
            corrupt[indices] = float("nan")
    spec.dataset = TensorDataset(corrupt, labels)
    return spec
