"""Buddy copies of a sharded job's state, without torch.distributed: who keeps whose shard, which
copies a rank keeps, what a new world can rebuild from its members' copies, and the whole state
joined from every rank's pieces."""

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
    plan_assembly,
    ward_of,
)
from ebbflow_trainer.launch.state import join_shards


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


def _snapshot(rank: int, world: int, whole: dict[str, torch.Tensor], step: torch.Tensor) -> dict[str, Any]:
    piece = {
        name: torch.chunk(value, world)[rank] if rank < len(torch.chunk(value, world)) else value[:0]
        for name, value in whole.items()
    }
    return {
        "step": 5,
        "rng": {"rank": rank},
        "model": {"weight": piece["weight"], "counter": torch.tensor(3)},
        "optimizer": {
            "state": {0: {"exp_avg": piece["exp_avg"], "step": step}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "sharded": {"model": ["weight"], "optimizer": [[0, "exp_avg"]]},
    }


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_whole_state_is_every_ranks_pieces_in_rank_order_and_rank_0s_rest(world: int) -> None:
    whole = {"weight": torch.arange(15.0).reshape(3, 5), "exp_avg": torch.arange(3.0) / 7}
    joined = join_shards([_snapshot(rank, world, whole, torch.tensor(5.0)) for rank in range(world)])
    assert torch.equal(joined["model"]["weight"], whole["weight"])
    assert torch.equal(joined["model"]["counter"], torch.tensor(3))
    assert torch.equal(joined["optimizer"]["state"][0]["exp_avg"], whole["exp_avg"])
    assert torch.equal(joined["optimizer"]["state"][0]["step"], torch.tensor(5.0))
    assert joined["rng"] == {"rank": 0} and "sharded" not in joined
