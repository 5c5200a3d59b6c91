"""Virtual-node batches, built in the training process or ahead of time by background loader processes.

A batch is ``spec.batch(indices)`` for the indices :func:`sharding.virtual_node_indices` assigns to
(step, virtual node), built with torch's RNG seeded by (seed, step, virtual node). With
``loader_workers > 0`` a ``torch.utils.data.DataLoader`` builds them ahead (:class:`VirtualNodePlan`
yields this worker's keys in the order the engine consumes them) and restarts from the new
assignment or global batch when either changes, dropping what it had built ahead. Its processes are
forked from the worker (the script's module exists only there), live for one world and are shut
down by :meth:`VirtualNodeLoader.close`.

Invariant: random transforms draw the same numbers wherever and whenever a batch is built, so
``loader_workers`` changes how fast batches are ready, never what they contain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.sharding import DataPosition, derived_seed, virtual_node_indices

BatchKey = tuple[int, int, torch.Tensor]  # (step, virtual node, sample indices)
BATCH_RNG_STREAM = 2  # derived_seed(seed, step, k, 1) seeds the model's own randomness (dropout)


def build_batch(spec: TrainingSpec, seed: int, step: int, virtual_node: int, indices: torch.Tensor) -> Any:
    """``spec.batch(indices)`` with torch's RNG seeded by (seed, step, virtual node), then restored."""
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only (batches are built on the CPU): torch.manual_seed would also visit
        # every accelerator backend, milliseconds per call.
        torch.default_generator.manual_seed(derived_seed(seed, step, virtual_node, BATCH_RNG_STREAM))
        return spec.batch(indices)


class VirtualNodePlan(Sampler[BatchKey]):
    """Keys of this worker's virtual-node batches, step after step from ``start``: the loader's sampler."""

    def __init__(self, config: TrainerConfig, num_samples: int):
        self.config = config
        self.num_samples = num_samples
        self.start = 0
        self.virtual_nodes: list[int] = []
        self.position = DataPosition(config.global_batch_size)  # where the current global batch began

    def indices(self, step: int, virtual_node: int) -> torch.Tensor:
        config = self.config
        return virtual_node_indices(
            seed=config.seed,
            step=step,
            virtual_node=virtual_node,
            num_samples=self.num_samples,
            virtual_nodes=config.virtual_nodes,
            position=self.position,
        )

    def restart(self, step: int, virtual_nodes: list[int], position: DataPosition) -> None:
        self.start, self.virtual_nodes, self.position = step, list(virtual_nodes), position

    def __iter__(self) -> Iterator[BatchKey]:
        step, virtual_nodes = self.start, list(self.virtual_nodes)
        while True:  # the training loop stops asking; the loader never runs out
            for k in virtual_nodes:
                yield step, k, self.indices(step, k)
            step += 1


class _Batches(Dataset[tuple[int, int, Any]]):
    """What a loader process computes for one key: the key and its batch."""

    def __init__(self, spec: TrainingSpec, seed: int):
        self.spec = spec
        self.seed = seed

    def __getitem__(self, key: BatchKey) -> tuple[int, int, Any]:
        step, k, indices = key
        return step, k, build_batch(self.spec, self.seed, step, k, indices)


def _as_is(item: Any) -> Any:
    return item


class VirtualNodeLoader:
    """Hands the engine each of its virtual nodes' batches, in-process or from loader processes."""

    def __init__(self, spec: TrainingSpec, config: TrainerConfig, *, pin_memory: bool = False):
        self.spec = spec
        self.config = config
        self.plan = VirtualNodePlan(config, len(spec.dataset))
        self.pin_memory = pin_memory
        self._loader: DataLoader[Any] | None = None
        self._batches: Iterator[tuple[int, int, Any]] | None = None
        # The (step, virtual nodes, data position) the loader is on.
        self._expected: tuple[int, list[int], DataPosition] | None = None
        self.restarts = 0

    def prepare(self, step: int, virtual_nodes: list[int], position: DataPosition) -> None:
        """Announce the step about to be computed, with the data position of its global batch;
        restarts the loader if it was building others."""
        if self.spec.loader_workers == 0:
            self.plan.position = position
            return
        if self._expected == (step, virtual_nodes, position):
            return
        self.plan.restart(step, virtual_nodes, position)
        self._batches = iter(self._data_loader())  # a persistent loader drops what it built ahead
        self.restarts += 1
        self._expected = (step, list(virtual_nodes), position)

    def batch(self, step: int, virtual_node: int) -> Any:
        """The batch of ``virtual_node`` at ``step`` (after :meth:`prepare` for that step)."""
        if self._batches is None:
            indices = self.plan.indices(step, virtual_node)
            return build_batch(self.spec, self.config.seed, step, virtual_node, indices)
        got_step, got_node, batch = next(self._batches)
        if (got_step, got_node) != (step, virtual_node):
            raise RuntimeError(
                f"loader out of order: built step {got_step} virtual node {got_node}, "
                f"expected step {step} virtual node {virtual_node}"
            )
        assert self._expected is not None
        _, nodes, position = self._expected
        if virtual_node == nodes[-1]:
            self._expected = (step + 1, nodes, position)
        return batch

    def _data_loader(self) -> DataLoader[Any]:
        if self._loader is None:
            # Its own generator: creating the loader must not draw from the training RNG.
            generator = torch.Generator().manual_seed(derived_seed(self.config.seed, BATCH_RNG_STREAM))
            self._loader = DataLoader(
                _Batches(self.spec, self.config.seed),
                sampler=self.plan,
                batch_size=None,
                collate_fn=_as_is,
                num_workers=self.spec.loader_workers,
                prefetch_factor=self.spec.prefetch,
                persistent_workers=True,
                multiprocessing_context="fork",
                pin_memory=self.pin_memory,
                generator=generator,
            )
        return self._loader

    def close(self) -> None:
        """Stop the loader processes (the worker may leave with os._exit, which would skip it)."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = self._loader = None
        self._expected = None


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, possibly in dicts, lists and tuples) on ``device``; pinned memory copies
    asynchronously. Anything else passes as it is."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return type(batch)({key: to_device(value, device) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
