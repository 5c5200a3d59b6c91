"""Which engine a job's workers run, and why a job cannot train sharded: decided without importing
FSDP, which costs a worker's and a launcher's start about 3 s of CPU (bench/README.md, "A node given
back"), so a replicated job never imports it.

Invariants: ``engine_for`` imports :mod:`.fsdp` only for ``sharding="fsdp"``; ``sharding_problem``
names the setting and its fix for every combination a sharded job refuses.
"""

from __future__ import annotations

import torch
from ebbflow_api import contract

from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.step.engine import VirtualNodeEngine


def sharding_problem(spec: TrainingSpec, config: TrainerConfig) -> str | None:
    """Why this job cannot train sharded yet (naming the setting and the fix), or None."""
    if spec.sharding == "none":
        return None
    if config.mode == "deterministic":
        return (
            "--mode=deterministic needs whole gradients to sum exactly; a sharded job trains in fast "
            "mode: pass --mode=fast"
        )
    if config.batching == "dynamic":
        return f"{contract.ENV_BATCHING}=dynamic (spec.batching): a sharded job has static batching"
    if config.lr_scaling == "adascale":
        return (
            f"{contract.ENV_LR_SCALING}=adascale (spec.lrScaling) needs each virtual node's whole "
            "gradient: use linear, sqrt or none with a sharded job"
        )
    if config.band_limit:
        return f"{contract.ENV_BAND_LIMIT}=true (spec.bandLimit): leave bandLimit unset for a sharded job"
    if not config.checkpoint_path:
        return (
            f"{contract.ENV_CHECKPOINT_PATH} (spec.checkpoint.path) is empty: a sharded job needs a "
            "durable checkpoint, because a worker lost together with the buddy keeping the copy of its "
            "shard leaves nothing else to resume from"
        )
    return None


def engine_for(
    spec: TrainingSpec, config: TrainerConfig, *, message_device: torch.device
) -> VirtualNodeEngine:
    """The engine for the spec's sharding."""
    if spec.sharding == "fsdp":
        from ebbflow_trainer.step.fsdp import ShardedEngine

        return ShardedEngine(spec, config, message_device=message_device)
    return VirtualNodeEngine(spec, config, message_device=message_device)
