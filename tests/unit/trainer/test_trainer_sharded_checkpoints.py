"""A sharded job's durable checkpoints as files, without torch.distributed: what a world of N writes,
what a reader in a world of M assembles from it (its own piece, or the whole state), which files it
needs, and which checkpoint a resume takes when files are damaged or the other kind is newer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_trainer.launch import durable, sharded_checkpoints, state

# Whole dim-0 lengths: 7 rows split 3/3/1 over three ranks, 2 rows leave some ranks of four empty.
WEIGHT = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
BIAS = torch.arange(2, dtype=torch.float32) + 100
MOMENT = -torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
LENGTHS = ({"weight": 7, "bias": 2}, {(0, "exp_avg"): 7})


def _snapshot(step: int, shard: int, world: int) -> dict[str, Any]:
    """What ``state.capture_shard`` gives rank ``shard`` of a world of ``world`` after ``step``."""

    def piece(whole: torch.Tensor) -> torch.Tensor:
        chunks = torch.chunk(whole, world)
        return chunks[shard].clone() if shard < len(chunks) else whole[:0].clone()

    return {
        "step": step,
        "position": {"epoch": 0, "offset": step * 8},
        "model": {"weight": piece(WEIGHT), "bias": piece(BIAS), "mask": torch.ones(2)},
        "optimizer": {
            "state": {0: {"exp_avg": piece(MOMENT), "step": torch.tensor(float(step))}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "sharded": {"model": ["weight", "bias"], "optimizer": [[0, "exp_avg"]]},
    }


def _write(root: Path, step: int, world: int, commit: bool = True) -> None:
    for shard in range(world):
        data = state.to_bytes(_snapshot(step, shard, world))
        sharded_checkpoints.write_shard(root, step, shard, world, data)
    if commit:
        sharded_checkpoints.commit(root, step, world, LENGTHS)


def _expected_piece(whole: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    chunks = torch.chunk(whole, world)
    return chunks[rank] if rank < len(chunks) else whole[:0]


@pytest.mark.parametrize("old", [1, 3, 4], ids=lambda n: f"written-by-{n}")
@pytest.mark.parametrize("new", [1, 2, 3, 4], ids=lambda n: f"read-by-{n}")
def test_each_rank_of_a_new_world_assembles_its_own_piece(tmp_path: Path, old: int, new: int) -> None:
    _write(tmp_path, 40, old)
    (manifest,) = sharded_checkpoints.committed(tmp_path)
    for rank in range(new):
        loaded = sharded_checkpoints.piece(manifest, rank, new)
        assert torch.equal(loaded["model"]["weight"], _expected_piece(WEIGHT, rank, new))
        assert torch.equal(loaded["model"]["bias"], _expected_piece(BIAS, rank, new))
        assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], _expected_piece(MOMENT, rank, new))
        assert torch.equal(loaded["model"]["mask"], torch.ones(2))
        assert loaded["step"] == 40 and loaded["position"] == {"epoch": 0, "offset": 320}
        assert loaded["sharded"]["model"] == ["weight", "bias"]


def test_a_rank_reads_only_the_old_shards_its_piece_overlaps(tmp_path: Path) -> None:
    """Four shards read by two ranks: rank 0's piece (rows 0-3 of 7, 0-0 of 2) overlaps old shards
    0 and 1 only, so it assembles with shards 2 and 3 gone; rank 1 needs them."""
    _write(tmp_path, 40, 4)
    (manifest,) = sharded_checkpoints.committed(tmp_path)
    for shard in (2, 3):
        sharded_checkpoints.shard_file(tmp_path, 40, shard, 4).unlink()
    first = sharded_checkpoints.piece(manifest, 0, 2)
    assert torch.equal(first["model"]["weight"], _expected_piece(WEIGHT, 0, 2))
    with pytest.raises(FileNotFoundError):
        sharded_checkpoints.piece(manifest, 1, 2)


def test_the_whole_state_joins_the_pieces_in_shard_order(tmp_path: Path) -> None:
    _write(tmp_path, 40, 3)
    (manifest,) = sharded_checkpoints.committed(tmp_path)
    whole = sharded_checkpoints.whole(manifest)
    assert "sharded" not in whole
    assert torch.equal(whole["model"]["weight"], WEIGHT) and torch.equal(whole["model"]["bias"], BIAS)
    assert torch.equal(whole["optimizer"]["state"][0]["exp_avg"], MOMENT)
    assert float(whole["optimizer"]["state"][0]["step"]) == 40.0


def test_a_checkpoint_without_its_manifest_does_not_exist_and_two_committed_are_kept(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _write(tmp_path, step, 2)
    _write(tmp_path, 40, 2, commit=False)  # a write cut short: no manifest
    assert [m.step for m in sharded_checkpoints.committed(tmp_path)] == [30, 20]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shards-000000000020",
        "shards-000000000030",
        "shards-000000000040",
    ]
    _write(tmp_path, 50, 2)  # the uncommitted 40 goes with the oldest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards-000000000030", "shards-000000000050"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-5], id="truncated"),
        pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), id="a-flipped-bit"),
        pytest.param(lambda data: state.to_bytes({"step": 30}), id="another-valid-state"),
    ],
)
def test_a_damaged_shard_is_refused_and_the_previous_checkpoint_taken(tmp_path: Path, damage: Any) -> None:
    _write(tmp_path, 20, 2)
    _write(tmp_path, 30, 2)
    damaged = sharded_checkpoints.shard_file(tmp_path, 30, 1, 2)
    damaged.write_bytes(damage(damaged.read_bytes()))
    newest = sharded_checkpoints.committed(tmp_path)[0]
    with pytest.raises(state.StateFileError, match=r"does not match its manifest|checksum mismatch"):
        newest.load(1)
    resumed = durable.newest_whole(tmp_path)
    assert resumed is not None and resumed["step"] == 20
    assert torch.equal(resumed["model"]["weight"], WEIGHT)


@pytest.mark.parametrize(
    ("whole_step", "resumed"),
    [
        pytest.param(10, 20, id="sharded-newer"),
        pytest.param(30, 30, id="whole-newer"),
        pytest.param(None, 20, id="sharded-only"),
    ],
)
def test_a_resume_takes_the_newest_checkpoint_of_either_kind(
    tmp_path: Path, whole_step: int | None, resumed: int
) -> None:
    _write(tmp_path, 20, 3)
    if whole_step is not None:
        whole = sharded_checkpoints.whole(sharded_checkpoints.committed(tmp_path)[0]) | {"step": whole_step}
        state.write_checkpoint(state.to_bytes(whole), tmp_path / state.CHECKPOINT_FILE)
    found = durable.newest_whole(tmp_path)
    assert found is not None and found["step"] == resumed


def test_a_manifest_naming_the_wrong_shards_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, 20, 2)
    _write(tmp_path, 30, 2)
    manifest = sharded_checkpoints.directory(tmp_path, 30) / sharded_checkpoints.MANIFEST
    manifest.write_text(manifest.read_text().replace('"shard": 1', '"shard": 5'))
    assert [m.step for m in sharded_checkpoints.committed(tmp_path)] == [20]
