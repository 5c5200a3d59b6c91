"""The worker's side of keeping a sharded state in memory (:mod:`.buddies` decides; this moves bytes).

Every ``TrainingSpec.buddy_every`` steps each rank serializes its shard (``state.capture_shard``),
keeps it, and swaps it with its buddies: its own to ``buddy_of(rank)``, its ward's from
``ward_of(rank)``. After a failed collective a survivor hands over every copy it holds plus its own
shard as it stands (a failed step changed no parameter), with no collective; at a graceful stop each
leaver's shard goes to its heir and every stayer hands over what it holds. The next world gathers who
holds what and picks the newest complete step; each old shard's holder sends every member only the
rows of it that member's new piece holds (``buddies.overlap``), so no handoff is a whole state.

Invariants: an exchange is collective and every rank reaches it at the same step (the step count
decides); a failed exchange raises ``ReductionFailed`` like any failed collective, and the copies
of the last settled step stay until the next all-reduce proves every rank finished the newer one.
"""

from __future__ import annotations

import logging
from pathlib import Path
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
    heirs,
    overlap,
    plan_assembly,
    ward_of,
)
from ebbflow_trainer.step.engine import ReductionFailed, VirtualNodeEngine

if TYPE_CHECKING:
    from ebbflow_trainer.step.fsdp import ShardedEngine

log = logging.getLogger("ebbflow_trainer.launch.shard_copies")
COPIES_KEY = "shard_copies"  # a handoff of copies, not of a whole state, holds this key


class ShardCopies:
    """One rank's part: buddy copies every ``every`` steps, its handoff after a failure or at a
    graceful stop, and its pieces of the state the next world rebuilds."""

    def __init__(
        self,
        engine: ShardedEngine,
        rank: int,
        world_size: int,
        per_node: int,
        every: int,
        device: torch.device,
    ):
        self.device = device  # the collectives' (CUDA under nccl, the CPU under gloo)
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
            sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
            sizes[self.rank] = len(mine)
            dist.all_reduce(sizes)
            incoming = torch.empty(int(sizes[self.ward]), dtype=torch.uint8, device=self.device)
            outgoing = _as_tensor(mine).to(self.device)
            ops = [dist.P2POp(dist.isend, outgoing, self.buddy), dist.P2POp(dist.irecv, incoming, self.ward)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        except RuntimeError as error:  # gloo's error when a peer is gone
            raise ReductionFailed(f"buddy copy of step {step}: {error}") from error
        self.book.record(step, self.ward, _bytes(incoming))

    def hand_over_at_stop(
        self, step: int, last_step_wall_time: float, leaving: bool
    ) -> dict[str, Any] | None:
        """At a graceful stop (collective): every leaver sends its shard of ``step`` to its heir, and
        each rank that stays returns the handoff of its own shard and those it inherited ({} for a
        leaver). None when every rank leaves: nobody can keep a shard."""
        try:
            flags = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
            flags[self.rank] = int(leaving)
            dist.all_reduce(flags)
            keepers = heirs([bool(flag) for flag in flags])
            if keepers is None:
                return None
            mine = state.to_bytes(state.capture_shard(self.engine, step, last_step_wall_time))
            sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
            sizes[self.rank] = len(mine)
            dist.all_reduce(sizes)
            inherited = {
                r: torch.empty(int(sizes[r]), dtype=torch.uint8, device=self.device)
                for r, h in keepers.items()
                if h == self.rank
            }
            ops = [dist.P2POp(dist.irecv, buffer, leaver) for leaver, buffer in inherited.items()]
            if leaving:
                ops.append(dist.P2POp(dist.isend, _as_tensor(mine).to(self.device), keepers[self.rank]))
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()
        except RuntimeError as error:  # gloo's error when a peer is gone
            raise ReductionFailed(f"handing the shards of step {step} over: {error}") from error
        if leaving:
            return {}
        book = BuddyBook(self.world_size)
        book.record(step, self.rank, mine)
        for leaver, buffer in inherited.items():
            book.record(step, leaver, _bytes(buffer))
        return _handoff_of(book)

    def settle(self) -> None:
        """The world's all-reduce completed: every rank finished the last exchange."""
        self.book.settle()

    def rebuild(self, copies: dict[Piece, bytes], newest_whole: int, durable: bool) -> dict[str, Any] | None:
        """This worker's pieces of the state rebuilt from the members' ``copies`` (collective: every
        member calls it) when their newest complete step is newer than ``newest_whole``, the newest
        whole state a member holds (-1: none); else None, naming the shards lost when that sends the
        world to its durable checkpoint (``durable``: the job has one) or to step 0."""
        held: list[list[Piece] | None] = [None] * self.world_size
        dist.all_gather_object(held, sorted(copies))
        plan = plan_assembly([pieces or [] for pieces in held])
        if isinstance(plan, Missing) and self.rank == 0 and newest_whole < 0:
            fallback = "the durable checkpoint" if durable else "step 0"
            log.warning(
                "buddy copies cannot rebuild the state: %s; resuming from %s", plan.message(), fallback
            )
        if plan is None or isinstance(plan, Missing) or plan.step <= newest_whole:
            return None
        return _reshard(plan, copies, self)

    def handoff(self, step: int, last_step_wall_time: float) -> dict[str, Any]:
        """What a survivor of a failed collective leaves for the next world (no collective): the
        copies it holds and its own shard of ``step``."""
        if Piece(step, self.world_size, self.rank) not in self.book.copies():
            own = state.to_bytes(state.capture_shard(self.engine, step, last_step_wall_time))
            self.book.record(step, self.rank, own)
        return _handoff_of(self.book)


def _handoff_of(book: BuddyBook) -> dict[str, Any]:
    return {
        COPIES_KEY: [
            {"step": p.step, "world": p.world, "shard": p.shard, "data": _as_tensor(data)}
            for p, data in sorted(book.copies().items())
        ]
    }


def for_world(
    engine: VirtualNodeEngine, rank: int, world_size: int, per_node: int, every: int, device: torch.device
) -> ShardCopies | None:
    """The buddy copies of a sharded engine's world; None for a replicated one (every worker holds
    the whole state)."""
    if not engine.collective_state:
        return None
    return ShardCopies(cast("ShardedEngine", engine), rank, world_size, per_node, every, device)


def read_handoff(path: Path) -> tuple[dict[str, Any] | None, dict[Piece, bytes]]:
    """A worker's handoff: a whole state, or (a sharded world's) the copies of shards it keeps."""
    handoff = state.read(path)
    if handoff is None or COPIES_KEY not in handoff:
        return handoff, {}
    copies = {
        Piece(int(c["step"]), int(c["world"]), int(c["shard"])): c["data"].numpy().tobytes()
        for c in handoff[COPIES_KEY]
    }
    return None, copies


def _reshard(plan: Assembly, copies: dict[Piece, bytes], world: ShardCopies) -> dict[str, Any]:
    """Move to each member of the new world only the rows of the old shards that its piece holds
    (``overlap``), each old shard sent by its holder; the rest of the state comes from shard 0's."""
    sources, rank, device = plan.sources, world.rank, world.device
    mine = {
        shard: state.from_bytes(copies[Piece(plan.step, plan.world, shard)])
        for shard, source in enumerate(sources)
        if source == rank
    }
    shared = [shared_part(mine[0]) if sources[0] == rank else None]
    dist.broadcast_object_list(shared, src=sources[0], device=device)
    template = shared[0]
    assert template is not None
    lengths = lengths_of(world.engine, template["sharded"])
    outgoing = {
        (shard, member): state.to_bytes(
            rows_for(snapshot, lengths, (shard, plan.world), (member, world.world_size))
        )
        for shard, snapshot in mine.items()
        for member in range(world.world_size)
    }
    sizes = torch.zeros(plan.world, world.world_size, dtype=torch.int64, device=device)
    for (shard, member), data in outgoing.items():
        sizes[shard, member] = len(data)
    dist.all_reduce(sizes)
    incoming = {
        shard: torch.empty(int(sizes[shard, rank]), dtype=torch.uint8, device=device)
        for shard, source in enumerate(sources)
        if source != rank
    }
    ops = [
        dist.P2POp(dist.isend, _as_tensor(data).to(device), member)
        for (_, member), data in outgoing.items()
        if member != rank
    ]
    ops += [dist.P2POp(dist.irecv, buffer, sources[shard]) for shard, buffer in incoming.items()]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    parts = [
        outgoing[(shard, rank)] if source == rank else _bytes(incoming[shard])
        for shard, source in enumerate(sources)
    ]
    return piece_from(template, [state.from_bytes(part) for part in parts])


Lengths = tuple[dict[str, int], dict[tuple[int, str], int]]


def lengths_of(engine: ShardedEngine, sharded: dict[str, list[Any]]) -> Lengths:
    """The whole dim-0 length of every sharded entry, read from this world's sharded model."""
    model = engine.spec.model.state_dict()
    flat = [param for group in engine.spec.optimizer.param_groups for param in group["params"]]
    return (
        {name: int(model[name].shape[0]) for name in sharded["model"]},
        {(index, key): int(flat[index].shape[0]) for index, key in sharded["optimizer"]},
    )


def rows_for(
    snapshot: dict[str, Any], lengths: Lengths, old: tuple[int, int], new: tuple[int, int]
) -> dict[str, Any]:
    """The rows of an old shard's pieces that the new shard's pieces hold."""
    model: dict[str, torch.Tensor] = {}
    for name, length in lengths[0].items():
        found = overlap(length, old, new)
        if found is not None:
            model[name] = snapshot["model"][name][found[0] : found[1]].clone()
    optimizer: dict[int, dict[str, torch.Tensor]] = {}
    for (index, key), length in lengths[1].items():
        found = overlap(length, old, new)
        if found is not None:
            optimizer.setdefault(index, {})[key] = snapshot["optimizer"]["state"][index][key][
                found[0] : found[1]
            ].clone()
    return {"model": model, "optimizer": optimizer}


def shared_part(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot with every sharded entry cut to zero rows: the state every rank shares, and the
    dtype and trailing shape of each piece."""
    template = dict(snapshot)
    template["model"] = dict(snapshot["model"])
    for name in snapshot["sharded"]["model"]:
        template["model"][name] = snapshot["model"][name][:0].clone()
    entries = {index: dict(values) for index, values in snapshot["optimizer"]["state"].items()}
    for index, key in snapshot["sharded"]["optimizer"]:
        entries[index][key] = entries[index][key][:0].clone()
    template["optimizer"] = {"state": entries, "param_groups": snapshot["optimizer"]["param_groups"]}
    return template


def piece_from(template: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's pieces: the rows it receives from each old shard, in shard order."""
    joined = shared_part(template)
    for name in template["sharded"]["model"]:
        rows = [part["model"][name] for part in parts if name in part["model"]]
        joined["model"][name] = torch.cat([template["model"][name], *rows])
    for index, key in template["sharded"]["optimizer"]:
        rows = [part["optimizer"][index][key] for part in parts if key in part["optimizer"].get(index, {})]
        joined["optimizer"]["state"][index][key] = torch.cat(
            [template["optimizer"]["state"][index][key], *rows]
        )
    return joined


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.cpu().numpy().tobytes()


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
