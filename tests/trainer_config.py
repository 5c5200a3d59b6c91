"""The trainer configuration unit tests start from: one worker, one virtual node, no script, a
rendezvous that is never dialled. A test names only the fields it is about."""

from __future__ import annotations

import dataclasses
from typing import Any

from ebbflow_trainer.config import TrainerConfig

BASE = TrainerConfig(
    spec="",
    rdzv_endpoint="rdzv:1",
    rdzv_id="unit",
    min_replicas=1,
    max_replicas=1,
    virtual_nodes=1,
    global_batch_size=8,
)


def trainer_config(**changes: Any) -> TrainerConfig:
    """`BASE` with `changes` (TrainerConfig field names), e.g. `trainer_config(checkpoint_path=...)`."""
    return dataclasses.replace(BASE, **changes)
