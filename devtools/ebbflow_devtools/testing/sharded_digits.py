"""The digits example (held like ``held_digits``) trained sharded: ``sharding="fsdp"`` with each
Linear layer its own unit; the BatchNorm between them keeps its statistics (float buffers averaged
over virtual nodes, an integer counter advanced) unsharded on every worker. ``build_per_step``: the
same, gathered once per step (``shard_gather="per_step"``)."""

from __future__ import annotations

import torch
from ebbflow_trainer import TrainingSpec

from ebbflow_devtools.testing.held_digits import build as build_held


def build() -> TrainingSpec:
    spec = build_held()
    spec.sharding = "fsdp"
    spec.shard_modules = [m for m in spec.model.modules() if isinstance(m, torch.nn.Linear)]
    return spec


def build_per_step() -> TrainingSpec:
    spec = build()
    spec.shard_gather = "per_step"
    return spec
