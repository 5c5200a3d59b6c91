"""A worker's durable checkpoints (``spec.checkpoint.path``): which kind it writes and which it resumes.

On a shared volume a replicated job's rank 0 writes the whole state (``checkpoint.pt``, the previous
one kept); a sharded job's ranks each write their pieces (:mod:`.sharded_checkpoints`), so no worker
gathers a replica. In an object store every job's rank 0 leaves the whole state (gathered from every
worker when sharded) for the launcher to upload (:mod:`.object_checkpoints`).

A resume takes the newest committed checkpoint of either kind on the volume, so a job moves between
replicated and sharded training through its checkpoints: a sharded world reads only the pieces its
members' new pieces need, a replicated one joins them. Invariants: writing and reading are collective
(every member calls them at the same step); the members agree on which checkpoint they resume from
(a checkpoint any member cannot read is skipped by all), so no member resumes another's step.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import object_checkpoints, shard_copies, sharded_checkpoints, state
from ebbflow_trainer.launch.journal import Journal
from ebbflow_trainer.step.engine import ReductionFailed, VirtualNodeEngine

if TYPE_CHECKING:
    from ebbflow_trainer.step.fsdp import ShardedEngine

log = logging.getLogger("ebbflow_trainer.launch.durable")


class DurableCheckpoints:
    """One worker's side of the job's durable checkpoints in a world of ``size`` (this is ``rank``)."""

    def __init__(
        self,
        config: TrainerConfig,
        engine: VirtualNodeEngine,
        rank: int,
        size: int,
        comm_device: torch.device,
        journal: Journal,
    ):
        self.config, self.engine, self.journal = config, engine, journal
        self.rank, self.size, self.comm_device = rank, size, comm_device
        self.object_store = object_checkpoints.from_config(config, os.environ)
        on_volume = bool(config.checkpoint_path) and self.object_store is None
        self.root = Path(config.checkpoint_path) if on_volume else None
        self.sharded = on_volume and engine.collective_state

    @property
    def configured(self) -> bool:
        return self.root is not None or self.object_store is not None

    def write(self, step: int, last_step_wall_time: float, captured: dict[str, Any] | None = None) -> None:
        """The checkpoint of the state after ``step`` (of ``captured``, a whole state, when given).
        Every worker calls it; raises ``ReductionFailed`` when a peer is lost while a sharded one is
        written (the checkpoint stays uncommitted)."""
        if not self.configured:
            return
        if self.sharded and captured is None:
            self._write_shards(step, last_step_wall_time)
        else:
            self._write_whole(step, last_step_wall_time, captured)
        self.journal.write("checkpoint", step=step)

    def _write_whole(self, step: int, last_step_wall_time: float, captured: dict[str, Any] | None) -> None:
        if self.rank != 0 and not self.engine.collective_state:
            return
        if captured is None:  # collective when the state is sharded: every worker gathers it
            captured = state.capture(self.engine, step, last_step_wall_time)
        if self.rank != 0:
            return
        if self.root is not None:
            state.write_checkpoint(state.to_bytes(captured), self.root / state.CHECKPOINT_FILE)
        else:
            object_checkpoints.leave_snapshot(Path(self.config.state_dir), captured, step)

    def _write_shards(self, step: int, last_step_wall_time: float) -> None:
        assert self.root is not None
        engine = cast("ShardedEngine", self.engine)
        shard = state.capture_shard(engine, step, last_step_wall_time)
        try:
            sharded_checkpoints.write_shard(self.root, step, self.rank, self.size, state.to_bytes(shard))
            written = True
        except OSError as error:
            log.warning("could not write this shard of the checkpoint of step %s: %s", step, error)
            written = False
        if self._everyone(written) and self.rank == 0:  # every rank's file is written: commit
            lengths = shard_copies.lengths_of(engine, shard["sharded"])
            sharded_checkpoints.commit(self.root, step, self.size, lengths)

    def read(self) -> dict[str, Any] | None:
        """The newest durable checkpoint every member can read: whole, or this worker's pieces when
        the engine is sharded. From an object store rank 0 downloads it and the others receive it from
        rank 0 (the worker's state agreement)."""
        if self.root is None:
            return self.object_store.newest() if self.object_store is not None and self.rank == 0 else None
        whole, newer = _candidates(self.root)
        for manifest in newer:
            loaded = self._load(manifest)
            if self._everyone(loaded is not None):
                return loaded
        return whole

    def _load(self, manifest: sharded_checkpoints.Manifest) -> dict[str, Any] | None:
        try:
            if not self.engine.collective_state:
                return sharded_checkpoints.whole(manifest)
            return sharded_checkpoints.piece(manifest, self.rank, self.size)
        except (OSError, state.StateFileError, KeyError) as error:
            log.warning("refusing the sharded checkpoint of step %s: %s", manifest.step, error)
            return None

    def _everyone(self, mine: bool) -> bool:
        """Whether every member says yes (collective)."""
        flag = torch.tensor([int(mine)], dtype=torch.int64, device=self.comm_device)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        except RuntimeError as error:  # gloo's error when a peer is gone
            raise ReductionFailed(f"durable checkpoint: {error}") from error
        return bool(flag.item())


def _candidates(root: Path) -> tuple[dict[str, Any] | None, list[sharded_checkpoints.Manifest]]:
    """The whole checkpoint under ``root`` (or None), and the committed sharded ones newer than it,
    newest first: a job that moved between replicated and sharded training has both kinds."""
    whole = state.read_checkpoint(root / state.CHECKPOINT_FILE)
    committed = sharded_checkpoints.committed(root)
    return whole, [m for m in committed if whole is None or m.step > int(whole["step"])]


def newest_whole(root: Path) -> dict[str, Any] | None:
    """The newest durable checkpoint under ``root``, whole, whichever kind wrote it (for tools and tests
    reading a job's result)."""
    whole, newer = _candidates(root)
    for manifest in newer:
        try:
            return sharded_checkpoints.whole(manifest)
        except (OSError, state.StateFileError) as error:
            log.warning("refusing the sharded checkpoint of step %s: %s", manifest.step, error)
    return whole
