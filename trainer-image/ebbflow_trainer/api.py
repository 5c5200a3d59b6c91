"""The user API: a training script defines ``build() -> TrainingSpec`` and Ebbflow does the rest.

Example (see ``examples/digits/train.py``)::

    from ebbflow_trainer import TrainingSpec

    def build() -> TrainingSpec:
        model = torch.nn.Sequential(torch.nn.Linear(64, 10))
        return TrainingSpec(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            dataset=torch.utils.data.TensorDataset(features, labels),
            loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
            steps=200,
        )

``build`` is called in every worker after seeding torch with the job's seed, so all workers start
from the same parameters. It must not touch ``torch.distributed`` (the trainer owns communication)
and must not start threads or processes: it also runs once in the forkserver workers are forked from.
The loss must be the mean over the batch, so a virtual node's gradient is its samples' mean gradient.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch
from torch.utils.data import default_collate


class SizedDataset(Protocol):
    """Anything indexable by sample number with a length, e.g. a ``torch.utils.data.Dataset``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclass
class TrainingSpec:
    """What a training script provides: model, optimizer, data, loss and how long to train."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: SizedDataset
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    steps: int = 100
    collate_fn: Callable[[list[Any]], Any] = field(default=default_collate)

    def batch(self, indices: torch.Tensor) -> Any:
        return self.collate_fn([self.dataset[int(i)] for i in indices])


def import_script(reference: str) -> ModuleType:
    """The module of ``path/to/script.py[:function]`` or ``package.module[:function]``, executed."""
    target = reference.partition(":")[0]
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"training script {target!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"ebbflow_user_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import training script {target!r}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_spec(reference: str) -> TrainingSpec:
    """Import ``script.py[:function]`` or ``package.module[:function]`` and call it (default ``build``)."""
    function = reference.partition(":")[2] or "build"
    factory = getattr(import_script(reference), function, None)
    if not callable(factory):
        raise AttributeError(f"{reference!r} defines no function {function!r} returning a TrainingSpec")
    spec = factory()
    if not isinstance(spec, TrainingSpec):
        raise TypeError(f"{reference!r} returned {type(spec).__name__}, not a TrainingSpec")
    return spec
