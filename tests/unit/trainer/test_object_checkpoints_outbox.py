"""Rank 0's snapshots in the node's outbox (object_checkpoints.leave_snapshot): what torch.save
wrote, under the name the launcher's uploader looks for, never half-written; framed by the
uploader into the bytes of a file checkpoint, which load back as the state."""

from __future__ import annotations

from pathlib import Path

import torch
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.object_checkpoints import leave_snapshot, outbox


def test_a_snapshot_left_in_the_outbox_frames_into_a_state_that_loads_back(tmp_path: Path) -> None:
    snapshot = {"step": 40, "model": {"weight": torch.arange(6.0).reshape(2, 3)}}
    leave_snapshot(tmp_path, snapshot, 40)
    assert [p.name for p in outbox(tmp_path).iterdir()] == ["step-000000000040.pt"]
    payload = (outbox(tmp_path) / "step-000000000040.pt").read_bytes()
    loaded = state.from_bytes(state.frame(payload))
    assert loaded["step"] == 40 and torch.equal(loaded["model"]["weight"], snapshot["model"]["weight"])


def test_a_newer_snapshot_is_a_second_file_and_no_temporary_one_stays(tmp_path: Path) -> None:
    leave_snapshot(tmp_path, {"step": 40}, 40)
    leave_snapshot(tmp_path, {"step": 60}, 60)
    names = sorted(p.name for p in outbox(tmp_path).iterdir())
    assert names == ["step-000000000040.pt", "step-000000000060.pt"]
