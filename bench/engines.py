"""The trainer's engine as the benchmarks drive it: a classifier trained by SGD with momentum on the
cross-entropy of (features, labels) batches, a configuration whose rendezvous is never dialled (the
unit tests' ``trainer_config``), and one worker's step, so that every benchmark measures the same
thing the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.sharding import even_counts, ranges_from_counts
from ebbflow_trainer.step.engine import Collectives, StepResult, VirtualNodeEngine, WorldOfOne

__all__ = ["cross_entropy", "sgd", "sgd_spec", "trainer_config", "worker_step"]


def cross_entropy(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def sgd(params: Iterable[torch.nn.Parameter], lr: float = 0.01) -> torch.optim.SGD:
    """The optimizer of every benchmark, ours and the baselines alike."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def sgd_spec(model: torch.nn.Module, dataset: Any, lr: float = 0.01, **fields: Any) -> TrainingSpec:
    """``model`` trained on ``dataset`` by :func:`sgd` on :func:`cross_entropy`; ``fields`` are any
    other ``TrainingSpec`` fields."""
    return TrainingSpec(
        model=model, optimizer=sgd(model.parameters(), lr), dataset=dataset, loss_fn=cross_entropy, **fields
    )


def worker_step(
    engine: VirtualNodeEngine, rank: int = 0, world_size: int = 1, comm: Collectives | None = None
) -> Callable[[int], StepResult]:
    """One step of ``engine`` as worker ``rank`` of ``world_size`` takes it (``reduce_step`` over its
    even share of the virtual nodes, then ``apply``), never asking to leave; a world of one unless told."""
    mine = ranges_from_counts(even_counts(engine.config.virtual_nodes, world_size))[rank]
    collectives = comm if comm is not None else WorldOfOne()

    def step(number: int) -> StepResult:
        message, _ = engine.reduce_step(
            number, mine, rank=rank, world_size=world_size, leave=lambda: False, comm=collectives
        )
        return engine.apply(message, world_size)

    return step
