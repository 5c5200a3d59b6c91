"""Deterministic sharding and the dynamic-batching controller."""

from __future__ import annotations

import torch
from ebbflow_trainer.batching import DynamicBatchingController, proportional_shares, round_shares
from ebbflow_trainer.sharding import DataPosition, even_counts, ranges_from_counts, virtual_node_indices

SETTINGS = {"num_samples": 100, "virtual_nodes": 4, "position": DataPosition(global_batch_size=32)}


def test_a_virtual_node_sees_the_same_samples_whatever_runs_it() -> None:
    first = virtual_node_indices(seed=7, step=5, virtual_node=2, **SETTINGS)
    again = virtual_node_indices(seed=7, step=5, virtual_node=2, **SETTINGS)
    assert torch.equal(first, again) and first.numel() == 8
    assert not torch.equal(first, virtual_node_indices(seed=8, step=5, virtual_node=2, **SETTINGS))


def test_one_step_covers_distinct_samples_and_an_epoch_never_repeats_one() -> None:
    per_epoch = 100 // 32
    seen = torch.cat(
        [
            virtual_node_indices(seed=0, step=s, virtual_node=k, **SETTINGS)
            for s in range(per_epoch)
            for k in range(4)
        ]
    )
    assert seen.unique().numel() == seen.numel() == per_epoch * 32
    # The next epoch reshuffles.
    next_epoch = virtual_node_indices(seed=0, step=per_epoch, virtual_node=0, **SETTINGS)
    assert not torch.equal(next_epoch, virtual_node_indices(seed=0, step=0, virtual_node=0, **SETTINGS))


def test_even_assignment_and_ranges() -> None:
    assert even_counts(4, 3) == [2, 1, 1]
    assert even_counts(8, 2) == [4, 4]
    assert ranges_from_counts([2, 1, 1]) == [[0, 1], [2], [3]]


def test_proportional_shares_give_a_three_times_slower_worker_a_quarter() -> None:
    # Both start with 2 of 4 virtual nodes; the slow one needs 3x as long.
    assert proportional_shares([2, 2], [1.0, 3.0]) == [3.0, 1.0]
    assert round_shares([3.0, 1.0], 4) == [3, 1]


def test_rounding_keeps_the_total_and_at_least_one_virtual_node_each() -> None:
    assert round_shares([7.6, 0.2, 0.2], 8) == [6, 1, 1]
    assert round_shares([2.5, 2.5, 3.0], 8) == [3, 2, 3]
    assert sum(round_shares([1.4, 1.4, 1.2], 4)) == 4


def test_controller_applies_changes_beyond_the_dead_band_only() -> None:
    controller = DynamicBatchingController(4, 2, dead_band=0.2)
    # 10 % slower is inside the dead-band: no change.
    assert controller.observe([2, 2], [1.0, 1.1]) is None
    controller = DynamicBatchingController(4, 2, dead_band=0.2)
    assert controller.observe([2, 2], [1.0, 3.0]) == [3, 1]
    # Once balanced, the same device speeds keep the assignment.
    assert controller.observe([3, 1], [1.5, 1.5]) is None


def test_controller_tracks_time_per_virtual_node_across_reassignments() -> None:
    controller = DynamicBatchingController(8, 2, dead_band=0.2)
    assert controller.observe([4, 4], [0.4, 1.2]) == [6, 2]
    # Per virtual node the speeds are unchanged (0.1 s and 0.3 s): nothing more to move.
    assert controller.observe([6, 2], [0.6, 0.6]) is None
