"""The worker's side of a sharded job's buddy copies (:mod:`.buddies` decides; this moves bytes).

At a step boundary every ``TrainingSpec.buddy_every`` steps each rank serializes its shard
(``state.capture_shard``), keeps it, and swaps it with its buddies over the world's process group:
its own to ``buddy_of(rank)``, its ward's from ``ward_of(rank)``. After a failed collective the
survivor hands over every copy it holds plus its own shard as it stands (the last completed step:
a failed step changed no parameter), with no collective. The next world gathers who holds what,
rebuilds the newest complete step's whole state from the holders' broadcasts, and each worker
keeps its piece of it (``state.restore``).

Invariants: an exchange is collective and every rank reaches it at the same step (the step count
decides); a failed exchange raises ``ReductionFailed`` like any failed collective, and the copies
of the last settled step stay until the next all-reduce proves every rank finished the newer one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.buddies import (
    Assembly,
    BuddyBook,
    Missing,
    Piece,
    buddy_of,
    plan_assembly,
    ward_of,
)
from ebbflow_trainer.step.engine import ReductionFailed, VirtualNodeEngine

if TYPE_CHECKING:
    from ebbflow_trainer.step.fsdp import ShardedEngine

COPIES_KEY = "shard_copies"  # a handoff of copies, not of a whole state, holds this key


class ShardCopies:
    """One rank's buddy copies: made every ``every`` steps, handed over after a failure."""

    def __init__(self, engine: ShardedEngine, rank: int, world_size: int, per_node: int, every: int):
        self.engine = engine
        self.rank, self.world_size = rank, world_size
        self.buddy = buddy_of(rank, world_size, per_node)
        self.ward = ward_of(rank, world_size, per_node)
        self.every = every if world_size > 1 else 0  # alone, a copy would be its own
        self.book = BuddyBook(world_size)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def exchange(self, step: int, last_step_wall_time: float) -> None:
        """Keep this rank's shard of ``step`` and swap it for the ward's (collective)."""
        mine = state.to_bytes(state.capture_shard(self.engine, step, last_step_wall_time))
        self.book.record(step, self.rank, mine)
        try:
            sizes = torch.zeros(self.world_size, dtype=torch.int64)
            sizes[self.rank] = len(mine)
            dist.all_reduce(sizes)
            incoming = torch.empty(int(sizes[self.ward]), dtype=torch.uint8)
            outgoing = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
            ops = [dist.P2POp(dist.isend, outgoing, self.buddy), dist.P2POp(dist.irecv, incoming, self.ward)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        except RuntimeError as error:  # gloo's error when a peer is gone
            raise ReductionFailed(f"buddy copy of step {step}: {error}") from error
        self.book.record(step, self.ward, incoming.numpy().tobytes())

    def settle(self) -> None:
        """The world's all-reduce completed: every rank finished the last exchange."""
        self.book.settle()

    def handoff(self, step: int, last_step_wall_time: float) -> dict[str, Any]:
        """What a survivor of a failed collective leaves for the next world (no collective): the
        copies it holds and its own shard of ``step``."""
        if Piece(step, self.world_size, self.rank) not in self.book.copies():
            own = state.to_bytes(state.capture_shard(self.engine, step, last_step_wall_time))
            self.book.record(step, self.rank, own)
        return {
            COPIES_KEY: [
                {"step": p.step, "world": p.world, "shard": p.shard, "data": _as_tensor(data)}
                for p, data in sorted(self.book.copies().items())
            ]
        }


def for_world(
    engine: VirtualNodeEngine, rank: int, world_size: int, per_node: int, every: int
) -> ShardCopies | None:
    """The buddy copies of a sharded engine's world; None for a replicated one (every worker holds
    the whole state)."""
    if not engine.collective_state:
        return None
    return ShardCopies(cast("ShardedEngine", engine), rank, world_size, per_node, every)


def held_copies(handoff: dict[str, Any]) -> dict[Piece, bytes]:
    """The copies a ``ShardCopies.handoff`` left, by piece."""
    return {
        Piece(int(c["step"]), int(c["world"]), int(c["shard"])): c["data"].numpy().tobytes()
        for c in handoff[COPIES_KEY]
    }


def rebuild(
    copies: dict[Piece, bytes], rank: int, world_size: int, newest_whole: int
) -> dict[str, Any] | Missing | None:
    """The whole state rebuilt from the members' copies (collective: every member calls it) when
    their newest complete step is newer than ``newest_whole``, the newest whole state a member holds
    (-1: none); ``Missing`` when the newest copies lack shards; else None."""
    held: list[list[Piece] | None] = [None] * world_size
    dist.all_gather_object(held, sorted(copies))
    plan = plan_assembly([pieces or [] for pieces in held])
    if plan is None or isinstance(plan, Missing):
        return plan
    if plan.step <= newest_whole:
        return None
    return _assemble(plan, copies, rank)


def _assemble(plan: Assembly, copies: dict[Piece, bytes], rank: int) -> dict[str, Any]:
    snapshots = []
    for shard, source in enumerate(plan.sources):
        payload = [copies[Piece(plan.step, plan.world, shard)] if rank == source else None]
        dist.broadcast_object_list(payload, src=source)
        assert payload[0] is not None
        snapshots.append(state.from_bytes(payload[0]))
    return state.join_shards(snapshots)


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
