"""The demo's pure decisions: when to take a node away and bring it back, which node, what it prints."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ebbflow_devtools.demo_plan import Action, Plan, Snapshot, Stage, node_to_take, progress_line

PLAN = Plan(steps=1000, full=3, away_at=0.25, back_after=150)
BASE = Snapshot(
    at=10.0,
    phase="Running",
    desired=3,
    ready=3,
    step=300,
    loss=0.5,
    accuracy=None,
    samples_per_second=1000.0,
    worker_nodes={},
    preemptions=0,
)


def snap(**fields: object) -> Snapshot:
    return replace(BASE, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stage", "now", "since", "expected"),
    [
        pytest.param(Stage.FILLING, snap(ready=2), BASE, (Stage.FILLING, Action.NONE), id="not-full-yet"),
        pytest.param(Stage.FILLING, snap(step=249), BASE, (Stage.FILLING, Action.NONE), id="too-early"),
        pytest.param(
            Stage.FILLING, snap(step=250), BASE, (Stage.SHRINKING, Action.TAKE_NODE_AWAY), id="take"
        ),
        pytest.param(
            Stage.SHRINKING,
            snap(desired=3, step=900),
            BASE,
            (Stage.SHRINKING, Action.NONE),
            id="not-shrunk-yet",
        ),
        pytest.param(
            Stage.SHRINKING,
            snap(desired=2, step=449),
            BASE,
            (Stage.SHRINKING, Action.NONE),
            id="too-few-steps",
        ),
        pytest.param(
            Stage.SHRINKING,
            snap(desired=2, step=450),
            BASE,
            (Stage.GROWING, Action.BRING_NODE_BACK),
            id="bring",
        ),
        pytest.param(Stage.GROWING, snap(desired=2), BASE, (Stage.GROWING, Action.NONE), id="not-grown-yet"),
        pytest.param(Stage.GROWING, snap(desired=3), BASE, (Stage.CALM, Action.NONE), id="grown"),
        pytest.param(Stage.CALM, snap(step=999), BASE, (Stage.CALM, Action.NONE), id="calm-stays"),
        pytest.param(
            Stage.FILLING,
            snap(phase="Succeeded", step=1000),
            BASE,
            (Stage.FILLING, Action.NONE),
            id="finished",
        ),
    ],
)
def test_plan(stage: Stage, now: Snapshot, since: Snapshot, expected: tuple[Stage, Action]) -> None:
    assert PLAN.next(stage, now, since) == expected


@pytest.mark.parametrize(
    ("workers", "rendezvous", "expected"),
    [
        pytest.param(
            {"w-0": "a", "w-1": "b", "w-2": "c"}, "a", "b", id="not-the-rendezvous-node-then-by-name"
        ),
        pytest.param({"w-0": "a", "w-1": "c", "w-2": "c"}, "b", "c", id="most-workers"),
        pytest.param({"w-0": "a", "w-1": ""}, "z", "a", id="unscheduled-ignored"),
    ],
)
def test_node_to_take(workers: dict[str, str], rendezvous: str, expected: str) -> None:
    assert node_to_take(workers, rendezvous) == expected


def test_no_node_to_take_when_every_worker_shares_the_rendezvous_node() -> None:
    with pytest.raises(ValueError, match="rendezvous node a"):
        node_to_take({"w-0": "a"}, "a")


def test_a_snapshot_reads_the_job_status() -> None:
    job = {
        "status": {
            "phase": "Running",
            "desiredReplicas": 2,
            "readyReplicas": 1,
            "preemptions": 1,
            "workerNodes": {"d-worker-0": "n1"},
            "progress": {
                "step": 42,
                "loss": 0.25,
                "samplesPerSecond": 512.0,
                "eval": {"step": 40, "metrics": {"accuracy": 0.97}},
            },
        }
    }
    assert Snapshot.of(job, at=3.0) == Snapshot(
        3.0, "Running", 2, 1, 42, 0.25, 0.97, 512.0, {"d-worker-0": "n1"}, 1
    )
    assert Snapshot.of({}, at=0.0) == Snapshot(0.0, "Pending", 0, 0, 0, None, None, None, {}, 0)


def test_the_progress_line_shows_steps_loss_accuracy_workers() -> None:
    line = progress_line(snap(step=500, accuracy=0.9712, ready=2, desired=3), steps=1000, full=3, width=10)
    assert "step   500/1000 [#####.....]" in line
    assert "loss 0.500" in line and "accuracy 0.971" in line and "workers 2/3 (max 3)" in line
    assert "1,000 samples/s" in line
