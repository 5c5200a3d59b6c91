"""Buddy copies of a sharded job's state, without torch.distributed: who keeps whose shard, which
copies a rank keeps, what a new world can rebuild from its members' copies, and the rows of the old
shards each rank of the new world receives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ebbflow_trainer.launch.buddies import (
    Assembly,
    BuddyBook,
    Missing,
    Piece,
    buddy_of,
    heirs,
    overlap,
    plan_assembly,
    rows,
    ward_of,
)
from ebbflow_trainer.launch.shard_copies import piece_from, rows_for, shared_part


@pytest.mark.parametrize(
    ("world", "per_node", "buddies"),
    [
        pytest.param(2, 1, [1, 0], id="two-nodes"),
        pytest.param(3, 1, [1, 2, 0], id="a-ring-of-three"),
        pytest.param(4, 2, [2, 3, 0, 1], id="two-per-node-the-same-local-rank-on-the-next-node"),
        pytest.param(6, 2, [2, 3, 4, 5, 0, 1], id="three-nodes-of-two"),
        pytest.param(2, 2, [1, 0], id="one-node-of-two-the-next-rank"),
    ],
)
def test_every_rank_has_one_buddy_on_another_node_when_there_is_one(
    world: int, per_node: int, buddies: list[int]
) -> None:
    assert [buddy_of(rank, world, per_node) for rank in range(world)] == buddies
    assert [ward_of(buddies[rank], world, per_node) for rank in range(world)] == list(range(world))
    if world > per_node:
        assert all(buddy // per_node != rank // per_node for rank, buddy in enumerate(buddies))


def _own_and_ward(step: int, world: int, rank: int) -> list[Piece]:
    return [Piece(step, world, rank), Piece(step, world, (rank - 1) % world)]


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        pytest.param([[], []], None, id="nobody-holds-a-copy"),
        pytest.param(
            [_own_and_ward(7, 3, 0), _own_and_ward(7, 3, 2)],
            Assembly(7, 3, (0, 1, 0)),
            id="rank-1-killed-its-copy-kept-by-rank-2",
        ),
        pytest.param(
            [_own_and_ward(7, 3, 0)],
            Missing(7, 3, (1,)),
            id="ranks-1-and-2-lost-together",
        ),
        pytest.param(
            [
                [*_own_and_ward(6, 3, 0), Piece(7, 3, 0)],
                [*_own_and_ward(6, 3, 2), Piece(7, 3, 2)],
            ],
            Assembly(6, 3, (0, 1, 0)),
            id="killed-during-the-exchange-of-7-the-settled-6-is-whole",
        ),
        pytest.param(
            [[*_own_and_ward(6, 3, 0), *_own_and_ward(7, 3, 0)], [*_own_and_ward(7, 3, 2)]],
            Assembly(7, 3, (0, 1, 0)),
            id="the-newest-complete-step-wins",
        ),
        pytest.param(
            [[Piece(9, 2, 0)], [Piece(9, 2, 0), Piece(9, 2, 1)]],
            Assembly(9, 2, (0, 1)),
            id="each-shard-from-its-lowest-ranked-holder",
        ),
    ],
)
def test_the_new_world_rebuilds_the_newest_step_whose_every_shard_a_member_holds(
    held: list[list[Piece]], expected: Assembly | Missing | None
) -> None:
    assert plan_assembly(held) == expected


def test_a_missing_shard_is_named_with_its_step_and_why() -> None:
    message = Missing(12, 4, (1, 2)).message()
    assert "rank(s) 1, 2 of the world of 4 after step 12" in message and "buddy" in message


def test_a_book_keeps_both_steps_until_the_newer_exchange_is_settled() -> None:
    book = BuddyBook(world=3)
    book.record(4, 0, b"own-4")
    book.record(4, 2, b"ward-4")
    book.settle()
    book.record(5, 0, b"own-5")  # the exchange of step 5 fails before the ward's copy arrives
    assert sorted(book.copies()) == [Piece(4, 3, 0), Piece(4, 3, 2), Piece(5, 3, 0)]
    book.record(5, 2, b"ward-5")
    book.settle()
    assert book.copies() == {Piece(5, 3, 0): b"own-5", Piece(5, 3, 2): b"ward-5"}


def _snapshot(rank: int, world: int, whole: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What ``capture_shard`` leaves for shard ``rank`` of ``world``: its rows of each sharded entry."""
    piece = {name: value[slice(*rows(len(value), world, rank))] for name, value in whole.items()}
    return {
        "step": 5,
        "rng": {"rank": rank},
        "model": {"weight": piece["weight"], "counter": torch.tensor(3)},
        "optimizer": {
            "state": {0: {"exp_avg": piece["exp_avg"], "step": torch.tensor(5.0)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "sharded": {"model": ["weight"], "optimizer": [[0, "exp_avg"]]},
    }


@pytest.mark.parametrize("old_world", [1, 2, 3, 4])
@pytest.mark.parametrize("new_world", [1, 2, 3, 4])
def test_each_new_rank_receives_exactly_its_rows_and_shard_0s_shared_state(
    old_world: int, new_world: int
) -> None:
    whole = {"weight": torch.arange(20.0).reshape(10, 2), "exp_avg": torch.arange(10.0) / 7}
    lengths = ({"weight": 10}, {(0, "exp_avg"): 10})
    snapshots = [_snapshot(shard, old_world, whole) for shard in range(old_world)]
    for rank in range(new_world):
        parts = [
            rows_for(snapshots[shard], lengths, (shard, old_world), (rank, new_world))
            for shard in range(old_world)
        ]
        piece = piece_from(shared_part(snapshots[0]), parts)
        mine = slice(*rows(10, new_world, rank))
        assert torch.equal(piece["model"]["weight"], whole["weight"][mine])
        assert torch.equal(piece["optimizer"]["state"][0]["exp_avg"], whole["exp_avg"][mine])
        assert torch.equal(piece["model"]["counter"], torch.tensor(3))
        assert torch.equal(piece["optimizer"]["state"][0]["step"], torch.tensor(5.0))
        assert piece["rng"] == {"rank": 0} and piece["sharded"] == snapshots[0]["sharded"]


@pytest.mark.parametrize(
    ("length", "world", "expected"),
    [
        pytest.param(10, 3, [(0, 4), (4, 8), (8, 10)], id="uneven"),
        pytest.param(3, 4, [(0, 1), (1, 2), (2, 3), (3, 3)], id="more-ranks-than-rows-the-last-empty"),
        pytest.param(5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)], id="chunk-leaves-the-last-empty"),
        pytest.param(8, 1, [(0, 8)], id="one-rank-holds-all"),
    ],
)
def test_rows_follow_torch_chunk(length: int, world: int, expected: list[tuple[int, int]]) -> None:
    assert [rows(length, world, rank) for rank in range(world)] == expected
    chunks = torch.chunk(torch.arange(length), world)
    for rank, (start, stop) in enumerate(expected):
        held = chunks[rank].tolist() if rank < len(chunks) else []
        assert held == list(range(start, stop))


@pytest.mark.parametrize(
    ("length", "old_world", "new_world"), [(10, 3, 2), (10, 2, 3), (7, 4, 1), (3, 1, 4), (9, 3, 3)]
)
def test_the_overlaps_of_the_old_pieces_make_every_new_piece_in_order(
    length: int, old_world: int, new_world: int
) -> None:
    whole = torch.arange(length)
    old_pieces = [whole[slice(*rows(length, old_world, rank))] for rank in range(old_world)]
    for new_rank in range(new_world):
        parts = []
        for old_rank, piece in enumerate(old_pieces):
            found = overlap(length, (old_rank, old_world), (new_rank, new_world))
            if found is not None:
                parts.append(piece[found[0] : found[1]])
        joined = torch.cat(parts) if parts else whole[:0]
        assert torch.equal(joined, whole[slice(*rows(length, new_world, new_rank))])


@pytest.mark.parametrize(
    ("leaving", "expected"),
    [
        pytest.param([False, False, False], {}, id="a-join-nobody-leaves"),
        pytest.param([False, True, False], {1: 2}, id="one-leaver-to-the-next-rank"),
        pytest.param([False, True, True, False], {1: 3, 2: 3}, id="adjacent-leavers-to-the-next-stayer"),
        pytest.param([True, False, False, True], {0: 1, 3: 1}, id="the-last-rank-wraps-around"),
        pytest.param([True, True], None, id="everyone-leaves-nobody-keeps-a-shard"),
    ],
)
def test_each_leavers_shard_goes_to_the_next_rank_that_stays(
    leaving: list[bool], expected: dict[int, int] | None
) -> None:
    assert heirs(leaving) == expected
