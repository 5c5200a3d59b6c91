"""Where a sharded job's shards live between worlds: who keeps whose copy, which copies to keep,
and what a new world can rebuild from what its members hold (pure: no torch.distributed, no files).

Every ``buddy_every`` steps each rank r sends its shard to ``buddy_of(r)`` (another node when the
world spans several) and keeps its own copy of that step. A copy is settled once the world's next
all-reduce completed (every rank finished that exchange); until then the book keeps the older step
too, so a crash during an exchange still leaves a step every shard of which some survivor holds.
At a graceful stop each leaver's shard goes to its heir (``heirs``) instead.

A new world gathers what its members hold; ``plan_assembly`` picks the newest step whose every shard
a member holds (each from its lowest-ranked holder) or names the shards missing (a rank and its
buddy lost at once: the job's durable checkpoint then), and ``overlap`` says which rows of an old
shard each rank of the new world takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def buddy_of(rank: int, world_size: int, per_node: int) -> int:
    """The rank that keeps ``rank``'s copy: ``per_node`` ranks further on (ranks of one node are
    consecutive, so that is the same local rank on the next node) when the world spans several
    nodes, else the next rank."""
    stride = per_node if world_size > per_node else 1
    return (rank + stride) % world_size


def ward_of(rank: int, world_size: int, per_node: int) -> int:
    """The rank whose copy ``rank`` keeps (the inverse of ``buddy_of``)."""
    stride = per_node if world_size > per_node else 1
    return (rank - stride) % world_size


def rows(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of a dim-0 ``length`` that ``rank`` holds (FSDP2's layout, that of
    ``torch.chunk``: pieces of ``ceil(length / world_size)`` rows, the last ranks' shorter or empty)."""
    size = -(-length // world_size)
    return min(rank * size, length), min((rank + 1) * size, length)


def overlap(length: int, old: tuple[int, int], new: tuple[int, int]) -> tuple[int, int] | None:
    """Which rows of old shard ``old = (rank, world)``'s piece belong to new shard ``new``'s, as
    ``[start, stop)`` within the old piece, or None when they share none."""
    old_start, old_stop = rows(length, old[1], old[0])
    new_start, new_stop = rows(length, new[1], new[0])
    start, stop = max(old_start, new_start), min(old_stop, new_stop)
    return (start - old_start, stop - old_start) if start < stop else None


def heirs(leaving: Sequence[bool]) -> dict[int, int] | None:
    """At a graceful stop, who keeps each leaver's shard: the next rank that stays, cyclically. None
    when every rank leaves (nobody to keep a shard: the state is gathered whole instead)."""
    world = len(leaving)
    if all(leaving):
        return None
    found = {}
    for rank in (r for r in range(world) if leaving[r]):
        found[rank] = next((rank + d) % world for d in range(1, world) if not leaving[(rank + d) % world])
    return found


@dataclass(frozen=True, order=True)
class Piece:
    """One copy a member holds: the shard of rank ``shard`` of a world of ``world`` after ``step``."""

    step: int
    world: int
    shard: int


@dataclass(frozen=True)
class Assembly:
    """Rebuild the state after ``step`` from its ``world`` shards, shard i from member ``sources[i]``."""

    step: int
    world: int
    sources: tuple[int, ...]


@dataclass(frozen=True)
class Missing:
    """No member holds these shards of the newest step any member holds a piece of."""

    step: int
    world: int
    shards: tuple[int, ...]

    def message(self) -> str:
        ranks = ", ".join(str(shard) for shard in self.shards)
        return (
            f"the shards of rank(s) {ranks} of the world of {self.world} after step {self.step} are lost "
            "(a worker and the buddy holding its copy were lost together)"
        )


def plan_assembly(held: Sequence[Iterable[Piece]]) -> Assembly | Missing | None:
    """What the new world rebuilds from ``held[m]``, the pieces member m holds: the newest complete
    step, each shard from its lowest-ranked holder; ``Missing`` for the newest step when none is
    complete; None when nobody holds a piece."""
    holders: dict[tuple[int, int], dict[int, int]] = {}
    for member, pieces in enumerate(held):
        for piece in pieces:
            holders.setdefault((piece.step, piece.world), {}).setdefault(piece.shard, member)
    if not holders:
        return None
    for (step, world), by_shard in sorted(holders.items(), reverse=True):
        if all(shard in by_shard for shard in range(world)):
            return Assembly(step, world, tuple(by_shard[shard] for shard in range(world)))
    (step, world), by_shard = max(holders.items())
    return Missing(step, world, tuple(shard for shard in range(world) if shard not in by_shard))


class BuddyBook:
    """The copies one rank keeps: its own shard's bytes and its ward's, by step. ``record`` adds an
    exchange's copies; ``settle`` (after the world's next all-reduce) drops every older step."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._copies: dict[Piece, bytes] = {}

    def record(self, step: int, shard: int, data: bytes) -> None:
        self._copies[Piece(step, self.world, shard)] = data

    def settle(self) -> None:
        """Keep only the newest step's copies: every rank finished that exchange."""
        if self._copies:
            newest = max(piece.step for piece in self._copies)
            self._copies = {p: data for p, data in self._copies.items() if p.step == newest}

    def copies(self) -> dict[Piece, bytes]:
        return dict(self._copies)
