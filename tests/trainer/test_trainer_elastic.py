"""Trainer tier: real launchers, elastic agents, workers and a rendezvous process, gloo on CPU.

Every scenario trains the digits example with V=4, B=32 for 200 steps and, where mathematics must
not change, compares the final parameters with a calm one-worker run (``calm_reference``). Static
worlds giving the calm bits are in test_trainer_global_batch.py, test_trainer_multiproc.py and
test_trainer_deterministic.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import (
    DIGITS,
    HELD_DIGITS,
    Job,
    Node,
    assert_bitwise_equal,
    parameters_of,
    running_job,
)

# Modelled device time per virtual node: long enough to act mid-run, short enough for CI.
SLOW_STEPS = ["--simulated-vnode-seconds", "0.02"]


def _generations(node: Node) -> list[dict[str, Any]]:
    return node.events("generation")


def _world_change(node: Node, generation: int) -> dict[str, Any]:
    """The launcher's journal record of how `generation`'s world differs from the node's last."""
    return next(w for w in node.events("world") if w["generation"] == generation)


def _steps_in(nodes: list[Node], generation: int) -> list[int]:
    return [r["step"] for n in nodes for r in n.events("step") if r["generation"] == generation]


# World 2 (two virtual nodes each); the SIGKILL scenario's fast case runs worlds of three and two.
@pytest.mark.parametrize("world_size", [2])
def test_fast_mode_matches_within_float_tolerance(
    tmp_path: Path, calm_reference: dict[str, Any], world_size: int
) -> None:
    with running_job(tmp_path, min_replicas=world_size, max_replicas=world_size, mode="fast") as job:
        nodes = [job.start_node() for _ in range(world_size)]
        assert job.wait_all(nodes, 300) == [0] * world_size, job.logs()
        final = job.final_checkpoint()
    _assert_close(final, calm_reference)


def _relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).norm() / reference.norm().clamp_min(1e-12))


def _assert_close(final: dict[str, Any], reference_state: dict[str, Any], history: str = "") -> None:
    """Fast mode: equal to the deterministic reference within float rounding (runs measure 4-5e-7
    whatever the worlds were). A failure names the tensors that differ most (weights, or BatchNorm
    statistics that only a partial step moves) and the run's ``history``."""
    ours, reference = parameters_of(final), parameters_of(reference_state)
    flat_ours = torch.cat([ours[name].flatten() for name in sorted(ours)])
    flat_reference = torch.cat([reference[name].flatten() for name in sorted(reference)])
    relative = _relative(flat_ours, flat_reference)
    worst = sorted(((_relative(ours[n], reference[n]), n) for n in ours), reverse=True)[:3]
    details = ", ".join(f"{name} {value:.1e}" for value, name in worst)
    assert relative <= 1e-6, f"relative difference {relative:.3e} (most: {details}) {history}"


@pytest.mark.parametrize(
    ("victim_rank", "mode"),
    [
        # Rank 0 (the process group's and the checkpoint's writer) in deterministic mode; another
        # rank in fast mode, its buckets in flight (a non-zero rank's death in deterministic mode
        # is in tests/trainer/test_trainer_features.py).
        pytest.param(0, "deterministic", id="rank-0"),
        pytest.param(2, "fast", id="rank-2-fast-buckets-in-flight"),
    ],
)
def test_sigkill_of_any_worker_resumes_from_memory_at_world_size_two(
    tmp_path: Path, calm_reference: dict[str, Any], victim_rank: int, mode: str
) -> None:
    with running_job(
        tmp_path, min_replicas=2, max_replicas=3, extra_args=SLOW_STEPS, mode=mode, script=HELD_DIGITS
    ) as job:
        nodes = job.start_held(3)
        job.wait_for_world(nodes[0], 3, min_step=10)
        victim = next(
            n for n in nodes if n.last_step()["world"] == 3 and n.last_step()["rank"] == victim_rank
        )
        victim.kill_tree()
        survivors = [n for n in nodes if n is not victim]
        assert job.wait_all(survivors, 300) == [0, 0], job.logs()
        # The survivors found the victim gone (its launcher's liveness port refused them) instead of
        # waiting out its heartbeats.
        found_gone = [n for n in survivors if "liveness port" in n.log.read_text(errors="replace")]
        assert found_gone, job.logs()

        before = max(g["generation"] for n in survivors for g in _generations(n) if g["world"] == 3)
        after = [g for n in survivors for g in _generations(n) if g["generation"] > before]
        assert after, "the survivors never formed a new world"
        first_after = min(g["generation"] for g in after)
        resumed = [g for g in after if g["generation"] == first_after]
        assert {g["world"] for g in resumed} == {2}
        # Each survivor's journal says why that world re-formed: one member left, found gone.
        changes = [_world_change(n, first_after) for n in survivors]
        assert all(not c["joined"] and len(c["left"]) == 1 for c in changes), changes
        assert all(why.startswith("found gone") for c in changes for why in c["left"].values()), changes
        # The kill can land inside a collective: one survivor may have finished the step the other never
        # saw complete. The freshest survivor continues from its own memory and the other receives that
        # state from it; nobody falls back to the durable checkpoint or starts fresh.
        sources = {g["source"] for g in resumed}
        assert "memory" in sources and sources <= {"memory", "peer"}, sources
        # At most the interrupted step is redone: the new world starts where the old one stopped.
        completed_before = max(_steps_in(survivors, before))
        assert {g["step"] for g in resumed} == {completed_before}
        assert max(_steps_in(survivors, first_after)) == 200
        final = job.final_checkpoint()
        worlds = [g for n in nodes for g in _generations(n)]
        history = sorted((g["generation"], g["world"], g["step"], g["source"]) for g in worlds)
    if mode == "deterministic":
        assert_bitwise_equal(final, calm_reference)
    else:
        _assert_close(final, calm_reference, f"generations (number, world, step, source): {history}")


def test_a_worker_joins_at_a_step_boundary_and_one_leaves_by_sigterm_without_losing_a_step(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    """Two workers train; a third joins, receives the state from a peer and the world grows at the
    step boundary where the old one stopped, in the running workers' processes; then a member of the
    three leaves by SIGTERM at a step boundary, writing a checkpoint there, and the other two go on
    from memory at that very step."""
    with running_job(
        tmp_path, min_replicas=2, max_replicas=3, extra_args=SLOW_STEPS, script=HELD_DIGITS
    ) as job:
        first = job.start_held(2)
        job.wait_for_world(first[0], 2, min_step=1)
        # Training waits while the newcomer starts (a CI run on two saturated cores once finished the
        # job before its launcher had).
        (newcomer,) = job.start_held(1, running=tuple(first))
        nodes = [*first, newcomer]
        job.wait_for_world(newcomer, 3, min_step=10)

        (joined,) = [g for g in _generations(newcomer) if g["world"] == 3]
        assert joined["source"] == "peer", "the newcomer must receive the state from a peer"
        old_generations = {g["generation"] for n in first for g in _generations(n) if g["world"] == 2}
        stopped_at = max(s for g in old_generations for s in _steps_in(first, g))
        assert joined["step"] == stopped_at, (
            "the world must grow at the step boundary where the old one stopped"
        )
        members = [
            g["source"] for n in first for g in _generations(n) if g["generation"] == joined["generation"]
        ]
        assert members == ["memory", "memory"]
        # The running workers took the newcomer in their own processes, not restarted ones.
        processes = [{g["pid"] for g in _generations(n) if g["world"] in (2, 3)} for n in first]
        assert all(len(pids) == 1 for pids in processes), processes

        leaver = next(n for n in nodes if n.last_step()["world"] == 3 and n.last_step()["rank"] == 1)
        leaver.terminate()
        assert leaver.process.wait(timeout=60) == contract.EXIT_SUCCESS, job.logs()
        left = leaver.events("left")[-1]  # an old member also left its world of two for the newcomer
        survivors = [n for n in nodes if n is not leaver]
        assert job.wait_all(survivors, 300) == [0, 0], job.logs()

        # Everyone stopped at the same step boundary, and the next world starts exactly there.
        last_generation = max(g["generation"] for g in _generations(leaver))
        assert max(_steps_in(nodes, last_generation)) == left["step"]
        resumed = [g for n in survivors for g in _generations(n) if g["generation"] > last_generation]
        first_after = min(g["generation"] for g in resumed)
        assert {(g["world"], g["step"], g["source"]) for g in resumed if g["generation"] == first_after} == {
            (2, left["step"], "memory")
        }
        # The leaver recorded its departure: the survivors' round completed once both were in, without
        # waiting out the last call.
        joined = [
            line
            for n in survivors
            for line in n.log.read_text(errors="replace").splitlines()
            if f"joined generation {first_after} as rank" in line
        ]
        assert any("members known" in line for line in joined), joined
        changes = [_world_change(n, first_after) for n in survivors]
        assert all(list(c["left"].values()) == ["left gracefully"] for c in changes), changes
        # A durable checkpoint was written at the leave.
        checkpoints = [r["step"] for n in nodes for r in n.events("checkpoint")]
        assert left["step"] in checkpoints
        assert max(_steps_in(survivors, first_after)) == 200
        final = job.final_checkpoint()
    assert_bitwise_equal(final, calm_reference)


def test_dynamic_batching_gives_a_three_times_slower_worker_a_quarter_of_the_batch(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    with running_job(
        tmp_path, min_replicas=2, max_replicas=2, batching="dynamic", extra_args=SLOW_STEPS
    ) as job:
        fast = job.start_node()
        slow = job.start_node("--slowdown", "3")
        assert job.wait_all([fast, slow], 300) == [0, 0], job.logs()
        slow_steps = slow.events("step")
        final = job.final_checkpoint()
    # The controller moved work, and over the last 50 steps the slow worker mostly ran 1 of 4 virtual
    # nodes (8 of 32 samples); a scheduling hiccup on a busy machine may move one back for a while.
    assert slow.events("rebalance"), "the controller never reassigned virtual nodes"
    shares = [len(r["vnodes"]) / 4 for r in slow_steps[-50:]]
    assert max(set(shares), key=shares.count) == 0.25, shares
    assert 0.2 <= sum(shares) / len(shares) <= 0.3, shares
    assert_bitwise_equal(final, calm_reference)


def test_rank_zero_reports_progress_with_the_contract_fields(calm_run: dict[str, Any]) -> None:
    report = calm_run["progress"]
    assert tuple(report) == contract.PROGRESS_FIELDS
    assert report["step"] == 200 and report["samples"] == 200 * 32
    assert report["loss"] > 0 and report["samplesPerSecond"] > 0
    # The loss went down from ln(10) for ten digit classes.
    assert report["loss"] < 1.0
    # The step's shape: one worker does all V=4 virtual nodes of B/V = 8 samples, 3 accumulated
    # before the synchronising one; its time splits into compute and the rest.
    assert (report["worldSize"], report["microBatch"], report["accumulationSteps"]) == (1, 8, 3)
    compute = 4 * report["computeSeconds"]
    assert 0 < compute <= report["stepSeconds"]
    assert report["communicationSeconds"] == pytest.approx(report["stepSeconds"] - compute)
    # No membership change in a calm run; no noise estimate without adascale.
    assert report["rescalePauseSeconds"] is None and report["noiseScale"] is None


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({contract.ENV_VIRTUAL_NODES: "3"}, contract.ENV_VIRTUAL_NODES),
        ({contract.ENV_VIRTUAL_NODES: "2", contract.ENV_GLOBAL_BATCH_SIZE: "32"}, contract.ENV_MAX_REPLICAS),
        ({contract.ENV_RDZV_ENDPOINT: ""}, contract.ENV_RDZV_ENDPOINT),
        ({contract.ENV_BATCHING: "greedy"}, contract.ENV_BATCHING),
    ],
)
def test_invalid_configuration_fails_fast_naming_the_setting(
    tmp_path: Path, overrides: dict[str, str], setting: str
) -> None:
    job = Job(root=tmp_path, max_replicas=4, port=29400)
    message = tmp_path / "termination-log"
    result = subprocess.run(
        [sys.executable, "-m", "ebbflow_trainer", "run", DIGITS, "--state-dir", str(tmp_path)],
        env=job.environment(**overrides, **{contract.ENV_TERMINATION_MESSAGE_PATH: str(message)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == contract.EXIT_INVALID_CONFIG, result.stderr
    assert setting in result.stderr
    assert setting in message.read_text(), "the pod's status must say which setting is wrong"


def test_a_node_that_arrives_after_the_job_finished_exits_0_at_once(tmp_path: Path) -> None:
    # Seen on a loaded machine: a node dropped from the world rejoined just as the others trained their
    # last step, and waited for a round that would never form until its join timeout (10 min).
    with running_job(tmp_path, min_replicas=1, max_replicas=2) as job:
        first = job.start_node()
        assert job.wait_all([first], 300) == [0], job.logs()
        late = job.start_node()
        assert job.wait_all([late], 240) == [0], job.logs()
        assert "nothing left to train" in late.log.read_text(), job.logs()
        assert not late.events("step"), "the late node must not train"
