"""Shared fixtures for the trainer tier: one calm reference run that every elastic scenario must match."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ebbflow_devtools.testing.trainer_cluster import running_job, train_on_one_gpu

HERE = Path(__file__).resolve().parent
# Only a guard against a hang: every scenario waits with its own deadline (Job.wait_all, wait_for),
# and that failure carries every process's log and stacks. pytest-timeout's default (300 s, which
# counts session fixtures too) once stopped a loaded CI run's test inside its own 200 s wait,
# with a traceback of pytest's instead of the trainers' logs.
HANG_GUARD_S = 900
# The scenarios' own deadlines are generous (a world formed: 240 s; a whole run: 300 s) because CI
# runs this tier beside the e2e tier on two saturated cores, where one launcher took 50 s to start
# (torch imported twice: the agent and its forkserver) and three workers had not written their first
# step 66 s later (a 120 s wait failed there). They bound a hang, not a speed.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(HANG_GUARD_S))


@pytest.fixture(scope="session")
def calm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A calm one-worker run (V=4, B=32, 200 steps, deterministic): its final state, progress report,
    launcher log and each step's loss.

    Deterministic mode makes the result independent of the world size, so this one run is the
    reference for every scenario that changes the world along the way. Its launcher is
    ``launcher_probe.py`` (``ebbflow-train``, then the threads still alive when it returned).
    """
    root: Path = tmp_path_factory.mktemp("reference")
    probe = (sys.executable, str(HERE / "launcher_probe.py"))
    with running_job(root, min_replicas=1, max_replicas=1, launcher=probe) as job:
        node = job.start_node()
        assert job.wait_all([node], 300) == [0], job.logs()
        progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
        log = node.log.read_text(errors="replace")
        losses = {record["step"]: record["loss"] for record in node.events("step")}
        return {"final": job.final_checkpoint(), "progress": progress, "log": log, "losses": losses}


@pytest.fixture(scope="session")
def calm_reference(calm_run: dict[str, Any]) -> dict[str, Any]:
    final: dict[str, Any] = calm_run["final"]
    return final


@pytest.fixture(scope="session")
def two_gloo_pods_on_one_gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The final state of two single-process pods sharing the one GPU through gloo (deterministic, 50
    steps): the single-GPU tests' reference, trained once per session (only a GPU test asks for it)."""
    return train_on_one_gpu(tmp_path_factory.mktemp("gpu-gloo-two"), 2)
