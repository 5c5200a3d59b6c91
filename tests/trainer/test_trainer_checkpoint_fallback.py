"""Durable checkpoints with real trainer processes: the last two are kept, and a job whose newest
checkpoint was altered resumes from the previous one (logging the refusal) instead of failing or
starting over."""

from __future__ import annotations

from pathlib import Path

from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import Node, running_job
from ebbflow_trainer.launch import state

FIRST, SECOND, THIRD = 8, 16, 24  # each run trains to this step and checkpoints at its end


def _train_to(root: Path, checkpoints: Path, steps: int) -> tuple[Node, str]:
    """One worker trains to `steps` with `checkpoints` as its checkpoint path; its node and log."""
    root.mkdir()
    with running_job(root, min_replicas=1, max_replicas=1, steps=steps) as job:
        env = job.environment(**{contract.ENV_CHECKPOINT_PATH: str(checkpoints)})
        node = job.start_node(env=env)
        assert job.wait_all([node], 300) == [0], job.logs()
        return node, node.log.read_text(errors="replace")


def test_an_altered_newest_checkpoint_is_refused_and_the_previous_one_resumes(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    _train_to(tmp_path / "first", checkpoints, FIRST)
    second, _ = _train_to(tmp_path / "second", checkpoints, SECOND)
    assert second.events("generation")[0]["step"] == FIRST  # resumed from the first run's checkpoint
    newest = checkpoints / state.CHECKPOINT_FILE
    previous = state.previous_checkpoint(newest)
    assert [state.read(p)["step"] for p in (newest, previous)] == [SECOND, FIRST]  # type: ignore[index]

    altered = bytearray(newest.read_bytes())
    altered[-1] ^= 1  # one bit: what a torn write or a careless hand leaves
    newest.write_bytes(bytes(altered))

    third, log = _train_to(tmp_path / "third", checkpoints, THIRD)
    first_world = third.events("generation")[0]
    assert (first_world["step"], first_world["source"]) == (FIRST, "checkpoint"), first_world
    assert f"refusing the state in {newest}: checksum mismatch" in log
    assert f"resuming from the previous checkpoint {previous}" in log
    assert state.read(newest)["step"] == THIRD  # type: ignore[index]
