"""Trainer tier: a script using every optional TrainingSpec feature (``features_digits.py``: cosine LR
schedule, clipping, fp16 autocast with its loss scale, evaluation every 10 steps, its own state, a
background loader process) ends bitwise equal to a calm run after a join, a SIGTERM and a SIGKILL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import Node, assert_bitwise_equal, running_job
from ebbflow_devtools.waiting import wait_for

from tests.trainer.features_digits import CLIP, EVAL_EVERY, STEPS

FEATURES = str(Path(__file__).resolve().parent / "features_digits.py")
EVAL_STEPS = list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
# Modelled device time per virtual node: room to act between membership changes. Training is held
# while the newcomer starts, so a worker may wait in an all-reduce for its held peer for minutes.
SLOW_STEPS = ["--simulated-vnode-seconds", "0.1", "--collective-timeout", "600"]


@pytest.fixture(scope="module")
def calm_features(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One worker, no membership change: the run every other must end equal to."""
    with running_job(
        tmp_path_factory.mktemp("features"), min_replicas=1, max_replicas=1, steps=STEPS, script=FEATURES
    ) as job:
        node = job.start_node()
        assert job.wait_all([node], 300) == [0], job.logs()
        progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
        return {"final": job.final_checkpoint(), "progress": progress, "node": node}


def _assert_same_state(final: dict[str, Any], reference: dict[str, Any]) -> None:
    """Parameters bitwise, and every feature's state exactly."""
    assert final["step"] == reference["step"] == STEPS
    assert_bitwise_equal(final, reference)
    assert final["update"] == reference["update"], "LR scheduler and loss scale"
    assert final["extra"] == reference["extra"], "the script's own state"
    assert final["evaluation"] == reference["evaluation"]
    lrs = [[g["lr"] for g in s["optimizer"]["param_groups"]] for s in (final, reference)]
    assert lrs[0] == lrs[1]


def test_a_calm_run_uses_every_feature(calm_features: dict[str, Any]) -> None:
    final, node = calm_features["final"], calm_features["node"]
    steps = node.events("step")
    assert len(steps) == STEPS
    # fp16: the loss scale starts too high, backs off, grows again and overflows now and then.
    overflows = [r["step"] for r in steps if r["overflow"]]
    assert overflows and overflows[0] == 1 and len(overflows) < STEPS / 2, overflows
    assert all(r["skipped"] for r in steps if r["overflow"])
    assert len({r["loss_scale"] for r in steps}) > 2
    # Clipping was active early on, and the cosine schedule brought the LR down to almost 0.
    norms = [r["grad_norm"] for r in steps if r["grad_norm"] is not None]
    assert max(norms) > CLIP
    lrs = [r["lr"] for r in steps if r["lr"] is not None]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.01 * lrs[0]
    update = final["update"]
    assert update["scheduler"]["last_epoch"] == STEPS
    assert update["loss_scale"]["scale"] == steps[-1]["loss_scale"]
    # Evaluation every 10 steps, once each, and the script's state counted them.
    evaluations = node.events("eval")
    assert [r["step"] for r in evaluations] == EVAL_STEPS
    assert evaluations[-1]["metrics"]["accuracy"] > 0.8
    assert final["extra"]["evaluations"] == len(EVAL_STEPS)
    assert final["extra"]["best_accuracy"] == max(r["metrics"]["accuracy"] for r in evaluations)
    # The progress report carries the last evaluation.
    progress = calm_features["progress"]
    assert tuple(progress) == contract.PROGRESS_FIELDS
    assert progress["eval"] == {"step": STEPS, "metrics": evaluations[-1]["metrics"]}


def _first_generation_at(nodes: list[Node], size: int, after: int) -> list[dict[str, Any]]:
    """The generation records of the first world of ``size`` formed after generation ``after``."""
    records = [g for n in nodes for g in n.events("generation") if g["generation"] > after]
    first = min(g["generation"] for g in records if g["world"] == size)
    return [g for g in records if g["generation"] == first]


def _node_of_rank(nodes: list[Node], rank: int, size: int) -> Node | None:
    """The node whose latest step ran as ``rank`` in a world of ``size``; None while any node's latest
    step is from another world (a peer may not have logged its first step of the new world yet)."""
    latest = [n.last_step() for n in nodes]
    if any(last is None or last["world"] != size for last in latest):
        return None
    return next((n for n, last in zip(nodes, latest, strict=True) if last and last["rank"] == rank), None)


def test_join_sigterm_and_sigkill_end_equal_to_a_calm_run(
    tmp_path: Path, calm_features: dict[str, Any]
) -> None:
    hold = tmp_path / "hold"
    with running_job(
        tmp_path, min_replicas=1, max_replicas=3, steps=STEPS, script=FEATURES, extra_args=SLOW_STEPS
    ) as job:
        env = job.environment(FEATURES_HOLD=str(hold))
        first = [job.start_node(env=env), job.start_node(env=env)]
        job.wait_for_world(first[0], 2, min_step=3)
        # Hold training while the newcomer starts (a minute on a busy machine); release it once the
        # newcomer asks to join, well within the grace its peers get to leave for it.
        hold.touch()
        newcomer = job.start_node(env=env)
        wait_for(lambda: "attempts to join" in newcomer.log.read_text(), 300, "the newcomer to ask to join")
        hold.unlink()
        joined = job.wait_for_world(newcomer, 3, min_step=1)
        assert {g["source"] for g in _first_generation_at([newcomer], 3, 0)} == {"peer"}

        nodes = [*first, newcomer]
        leaver = wait_for(lambda: _node_of_rank(nodes, 1, 3), 300, "every node to train at world size 3")
        leaver.terminate()
        assert leaver.process.wait(timeout=120) == contract.EXIT_SUCCESS, job.logs()
        # The last one: a worker also logs "left" when its agent stops it to admit the newcomer.
        left = leaver.events("left")[-1]
        victim, survivor = (n for n in nodes if n is not leaver)
        job.wait_for_world(victim, 2, min_step=left["step"] + 1)
        victim.kill_tree()
        assert job.wait_all([survivor], 300) == [0], job.logs()
        final = job.final_checkpoint()

    assert {1, 2, 3} <= {r["world"] for r in survivor.events("step")}, "every world size trained"
    assert joined["step"] < left["step"] < STEPS
    after_leave = _first_generation_at([survivor], 2, joined["generation"])
    assert {g["source"] for g in after_leave} == {"memory"}
    after_kill = _first_generation_at([survivor], 1, after_leave[0]["generation"])
    assert {g["source"] for g in after_kill} == {"memory"}
    _assert_same_state(final, calm_features["final"])
    # Every evaluation ran (a world that re-forms after one does not repeat it).
    evaluated = {r["step"] for n in job.nodes for r in n.events("eval")}
    assert sorted(evaluated) == EVAL_STEPS
