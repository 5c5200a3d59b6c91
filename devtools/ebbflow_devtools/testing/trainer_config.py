"""The trainer configuration unit tests and benchmarks (``bench/engines.py``) start from: one worker,
one virtual node, no script, a rendezvous that is never dialled. A caller names only the fields it is
about."""

from __future__ import annotations

import dataclasses
from typing import Any

from ebbflow_api import contract
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


# A valid environment as the operator sets it for a worker (`config.from_environment` reads it).
VALID_ENVIRONMENT = {
    contract.ENV_RDZV_ENDPOINT: "rdzv:29400",
    contract.ENV_RDZV_ID: "job-1",
    contract.ENV_MIN_REPLICAS: "1",
    contract.ENV_MAX_REPLICAS: "4",
    contract.ENV_VIRTUAL_NODES: "8",
    contract.ENV_GLOBAL_BATCH_SIZE: "64",
}
