"""Trainer tier: sharded training (``TrainingSpec.sharding="fsdp"``, FSDP2 over gloo on CPU) through
the membership changes the replicated engine goes through, against the calm one-worker reference.

A sharded world re-forms from the shards its members keep: at a graceful stop (a join, a leave) each
leaver's shard goes to a stayer, and each member of the new world receives the rows of its new piece,
so no step is lost; a worker killed leaves a copy of its shard in its buddy's memory, from which the
survivors rebuild the state; a worker lost with its buddy sends the world to the durable checkpoint.
Fast mode, so the final parameters match the reference within float rounding (the reduce-scatters
add in another order than one worker does). The job that grows and shrinks gathers once per step
(``shard_gather="per_step"``: a worker with fewer passes than another still matches its collectives),
the others every pass.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import (
    HELD_DIGITS,
    SHARDED_DIGITS,
    SHARDED_DIGITS_PER_STEP,
    Job,
    Node,
    needs_cuda,
    parameters_of,
    running_job,
)
from ebbflow_trainer.launch import sharded_checkpoints, state

SLOW_STEPS = ["--simulated-vnode-seconds", "0.02"]
CHECKPOINT_EVERY = 20
# Runs measure 4.5-4.8e-7 after 200 steps, as fast mode does replicated.
TOLERANCE = 1e-6
# A world of one trains the last 180 steps after the double loss: the losses agree with the calm run's
# to 1e-7 until step 155, then rounding's drift grows; the final parameters measure 1.8e-5. So that
# test also checks every step's loss up to LOSSES_CHECKED_TO, where a wrong state would show at once.
DOUBLE_LOSS_TOLERANCE = 1e-4
LOSSES_CHECKED_TO, LOSS_TOLERANCE = 150, 1e-6


def _generations(nodes: list[Node]) -> list[dict[str, Any]]:
    return [g for n in nodes for g in n.events("generation")]


def _steps_in(nodes: list[Node], generation: int) -> list[int]:
    return [r["step"] for n in nodes for r in n.events("step") if r["generation"] == generation]


def _assert_close(
    final: dict[str, Any], reference: dict[str, Any], history: str, tolerance: float = TOLERANCE
) -> None:
    ours, theirs = parameters_of(final), parameters_of(reference)
    assert ours.keys() == theirs.keys()
    flat_ours = torch.cat([ours[name].flatten() for name in sorted(ours)])
    flat_theirs = torch.cat([theirs[name].flatten() for name in sorted(theirs)])
    relative = float((flat_ours - flat_theirs).norm() / flat_theirs.norm())
    assert relative <= tolerance, f"relative difference {relative:.3e}; worlds {history}"


def _history(nodes: list[Node]) -> str:
    worlds = {(g["generation"], g["world"], g["step"], g["source"]) for g in _generations(nodes)}
    return str(sorted(worlds))


def _sharded_job(tmp_path: Path, min_replicas: int = 2, script: str = SHARDED_DIGITS) -> Any:
    interval = {contract.ENV_CHECKPOINT_INTERVAL_STEPS: str(CHECKPOINT_EVERY)}
    return running_job(
        tmp_path,
        min_replicas=min_replicas,
        max_replicas=3,
        mode="fast",
        script=script,
        extra_args=SLOW_STEPS,
        env=interval,
    )


def test_a_sharded_world_grows_and_shrinks_gracefully_without_losing_a_step(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    with _sharded_job(tmp_path, script=SHARDED_DIGITS_PER_STEP) as job:
        first = job.start_held(2)
        job.wait_for_world(first[0], 2, min_step=5)
        (newcomer,) = job.start_held(1, running=tuple(first))
        nodes = [*first, newcomer]
        job.wait_for_world(newcomer, 3, min_step=10)
        (joined,) = [g for g in newcomer.events("generation") if g["world"] == 3]
        assert joined["source"] == "shards", _history(nodes)
        olds = {g["generation"] for g in _generations(first) if g["world"] == 2}
        assert joined["step"] == max(s for g in olds for s in _steps_in(first, g)), _history(nodes)

        # Three workers, four virtual nodes: two of them run a padding pass every step.
        leaver = next(n for n in nodes if n.last_step()["world"] == 3 and n.last_step()["rank"] == 1)
        leaver.terminate()
        assert leaver.process.wait(timeout=60) == contract.EXIT_SUCCESS, job.logs()
        left = leaver.events("left")[-1]
        survivors = [n for n in nodes if n is not leaver]
        assert job.wait_all(survivors, 300) == [0, 0], job.logs()
        after = [g for g in _generations(survivors) if g["step"] >= left["step"] and g["world"] == 2]
        assert after and {g["source"] for g in after} == {"shards"}, _history(nodes)
        assert min(g["step"] for g in after) == left["step"], _history(nodes)
        final = job.final_checkpoint()
        assert final["step"] == job.steps
    _assert_close(final, calm_reference, _history(nodes))


def _rank_of(nodes: list[Node], world: int, rank: int) -> Node:
    return next(n for n in nodes if n.last_step()["world"] == world and n.last_step()["rank"] == rank)


def _first_world_after(nodes: list[Node], generation: int) -> tuple[int, str, int]:
    """(world size, source, step) of the first world formed after ``generation``, the same on every member."""
    resumed = [g for g in _generations(nodes) if g["generation"] > generation]
    first = min(g["generation"] for g in resumed)
    (start,) = {(g["world"], g["source"], g["step"]) for g in resumed if g["generation"] == first}
    return start


def test_a_killed_sharded_worker_is_rebuilt_from_its_buddy_and_a_double_loss_from_the_checkpoint(
    tmp_path: Path, calm_run: dict[str, Any]
) -> None:
    """Three workers, each shard copied to the next rank every step. One killed: the two survivors
    rebuild its shard from its buddy's copy (at most the step in flight lost, no checkpoint read).
    Back to three, then ranks 1 and 2 killed together (rank 1's copy died with rank 2): the survivor
    names the lost shard and resumes from the durable checkpoint."""
    with _sharded_job(tmp_path, min_replicas=1) as job:
        nodes = job.start_held(3)
        job.wait_for_world(nodes[0], 3, min_step=5)
        (start,) = {g["generation"] for g in _generations(nodes) if g["world"] == 3}
        killed_after = max(r["step"] for n in nodes for r in n.events("step"))
        victim = _rank_of(nodes, 3, 1)
        victim.kill_tree()
        survivors = [n for n in nodes if n is not victim]
        job.wait_for_world(survivors[0], 2, min_step=killed_after + 2)
        logs = [n.log.read_text(errors="replace") for n in survivors]
        assert all("handing over this shard and its buddy copies" in log for log in logs), job.logs()
        world, source, step = _first_world_after(survivors, start)
        assert (world, source) == (2, "shards"), _history(nodes)
        assert step >= killed_after - 1, _history(nodes)

        (newcomer,) = job.start_held(1, running=tuple(survivors))
        nodes = [*survivors, newcomer]
        job.wait_for_world(newcomer, 3, min_step=1)
        (regrown,) = [g["generation"] for g in newcomer.events("generation") if g["world"] == 3]
        job.wait_for_world(newcomer, 3, min_step=CHECKPOINT_EVERY * (step // CHECKPOINT_EVERY + 1) + 2)
        lost_together = [_rank_of(nodes, 3, 1), _rank_of(nodes, 3, 2)]
        for node in lost_together:
            node.kill_tree()
        (survivor,) = [n for n in nodes if n not in lost_together]
        assert job.wait_all([survivor], 300) == [0], job.logs()
        log = survivor.log.read_text(errors="replace")
        # Rank 1's shard is lost at every step; rank 2's too at a step whose exchange the kill cut.
        assert re.search(r"the shards of rank\(s\) 1(, 2)? of the world of 3 after step \d+ are lost", log), (
            job.logs()
        )
        assert "resuming from the durable checkpoint" in log, job.logs()
        world, source, step = _first_world_after([survivor], regrown)
        assert (world, source) == (1, "checkpoint") and step % CHECKPOINT_EVERY == 0, _history(nodes)
        final = job.final_checkpoint()
        assert final["step"] == job.steps
        # Every checkpoint was written in pieces (none gathered whole), the last by the world of one.
        assert not (job.checkpoint_dir / state.CHECKPOINT_FILE).exists()
        assert [(m.step, m.world) for m in sharded_checkpoints.committed(job.checkpoint_dir)] == [
            (job.steps, 1),
            (job.steps - CHECKPOINT_EVERY, 1),
        ]
    steps = [r for n in nodes for r in n.events("step") if r["rank"] == 0 and r["step"] <= LOSSES_CHECKED_TO]
    far = [
        (r["generation"], r["step"])
        for r in steps
        if abs(r["loss"] - calm_run["losses"][r["step"]]) > LOSS_TOLERANCE
    ]
    assert len(steps) >= LOSSES_CHECKED_TO and not far, (
        f"losses off the calm run's at {far}; {_history(nodes)}"
    )
    _assert_close(final, calm_run["final"], _history(nodes), DOUBLE_LOSS_TOLERANCE)


def test_a_checkpoint_moves_between_replicated_and_sharded_training(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    """One replicated worker trains to step 80 (a whole checkpoint), two sharded workers resume from
    it to 140 (a checkpoint in pieces), one replicated worker joins their pieces and trains to 200,
    and the run ends where a calm one does."""
    phases = [(HELD_DIGITS, 1, 80), (SHARDED_DIGITS, 2, 140), (HELD_DIGITS, 1, 200)]
    previous: Path | None = None
    for index, (script, workers, steps) in enumerate(phases):
        root = tmp_path / f"phase-{index}"
        root.mkdir()
        if previous is not None:
            shutil.copytree(previous, root / "checkpoints")
        with running_job(
            root, min_replicas=workers, max_replicas=workers, mode="fast", script=script, steps=steps
        ) as job:
            nodes = [job.start_node() for _ in range(workers)]
            assert job.wait_all(nodes, 300) == [0] * workers, job.logs()
            (start,) = {(g["source"], g["step"]) for g in _generations(nodes)}
            assert start == (("checkpoint", phases[index - 1][2]) if index else ("fresh", 0)), job.logs()
            final = job.final_checkpoint()
            assert final["step"] == steps
            newest_pieces = sharded_checkpoints.committed(job.checkpoint_dir)[:1]
            whole = state.read(job.checkpoint_dir / state.CHECKPOINT_FILE)
            if script == SHARDED_DIGITS:  # written in pieces by both workers
                assert [(m.step, m.world) for m in newest_pieces] == [(steps, 2)]
            else:
                assert whole is not None and whole["step"] == steps
            previous = job.checkpoint_dir
    _assert_close(final, calm_reference, "replicated to 80, sharded to 140, replicated to 200")


def test_a_sharded_job_in_deterministic_mode_fails_fast_naming_the_fix(tmp_path: Path) -> None:
    """The launcher refuses before joining (the unit tier has every refused setting)."""
    message = tmp_path / "termination-log"
    result = subprocess.run(
        [sys.executable, "-m", "ebbflow_trainer", "run", SHARDED_DIGITS, "--state-dir", str(tmp_path)],
        env=Job(root=tmp_path, port=29400).environment(
            **{contract.ENV_TERMINATION_MESSAGE_PATH: str(message)}
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == contract.EXIT_INVALID_CONFIG, result.stderr
    assert 'TrainingSpec.sharding="fsdp"' in result.stderr and "--mode=fast" in result.stderr, result.stderr
    assert "--mode=fast" in message.read_text()


def _one_worker_sharded(root: Path, backend: str) -> Any:
    root.mkdir()
    interval = {contract.ENV_CHECKPOINT_INTERVAL_STEPS: str(CHECKPOINT_EVERY)}
    extra = [*SLOW_STEPS, "--backend", backend]
    return running_job(
        root,
        min_replicas=1,
        max_replicas=1,
        mode="fast",
        script=SHARDED_DIGITS,
        extra_args=extra,
        env=interval,
    )


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("gloo", id="cpu-gloo"),
        pytest.param("nccl", id="gpu-nccl", marks=[pytest.mark.gpu, needs_cuda]),
    ],
)
def test_a_sharded_job_stopped_whole_writes_its_pieces_and_resumes_from_them(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A world of one SIGTERMed after step 40: every member leaves, so nobody keeps a shard in memory
    and it writes its pieces; a new launcher resumes from them. On the CPU with gloo, against the calm
    reference; with nccl, one worker on cuda:0 (one GPU holds one nccl rank: FSDP2's mesh,
    reduce-scatters and pieces on the GPU), against a calm run on the same GPU."""
    if backend == "nccl":
        with _one_worker_sharded(tmp_path / "calm", backend) as calm_job:
            calm = calm_job.start_node()
            assert calm_job.wait_all([calm], 300) == [0], calm_job.logs()
            reference = calm_job.final_checkpoint()
    else:
        reference = request.getfixturevalue("calm_reference")
    with _one_worker_sharded(tmp_path / "stopped", backend) as job:
        first = job.start_node()
        job.wait_for_world(first, 1, min_step=CHECKPOINT_EVERY * 2 + 1)
        first.terminate()
        assert first.process.wait(timeout=60) == contract.EXIT_SUCCESS, job.logs()
        left = first.events("left")[-1]["step"]
        assert [m.step for m in sharded_checkpoints.committed(job.checkpoint_dir)][:1] == [left], job.logs()
        second = job.start_node()
        assert job.wait_all([second], 300) == [0], job.logs()
        starts = {(g["source"], g["step"]) for g in second.events("generation")}
        assert starts == {("checkpoint", left)}, job.logs()
        final = job.final_checkpoint()
    assert final["step"] == reference["step"] == job.steps
    _assert_close(final, reference, f"stopped at {left}, resumed from its pieces")
