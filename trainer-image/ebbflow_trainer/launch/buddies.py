"""Buddy copies of a sharded job's state: who holds whose shard, what to keep, and what a new world
can rebuild from the copies its members hold (pure: no torch.distributed, no files).

Every ``buddy_every`` steps each rank r of a world of N sends the bytes of its shard (its pieces of
the parameters and the optimizer state, with the state every rank shares) to ``buddy_of(r)``, on
another node when the world spans several; it keeps its own copy of that step too. A copy is
settled once the world's next all-reduce completed (every rank finished that exchange): the book
then drops every older step. Until then it keeps both, so a crash during an exchange still leaves
one step every shard of which some survivor holds.

After a crash the survivors hand over every copy they hold; ``plan_assembly`` picks the newest step
whose every shard a member holds (each from the lowest-ranked holder), or names the shards missing
(a rank and its buddy lost at once), which sends the job to its durable checkpoint.
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
