"""Shared fixtures for the trainer tier: one calm reference run that every elastic scenario must match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.trainer_cluster import running_job, train_on_one_gpu


@pytest.fixture(scope="session")
def calm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A calm one-worker run (V=4, B=32, 200 steps, deterministic): its final state and progress report.

    Deterministic mode makes the result independent of the world size, so this one run is the
    reference for every scenario that changes the world along the way.
    """
    root: Path = tmp_path_factory.mktemp("reference")
    with running_job(root, min_replicas=1, max_replicas=1) as job:
        node = job.start_node()
        assert job.wait_all([node], 180) == [0], job.logs()
        progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
        return {"final": job.final_checkpoint(), "progress": progress}


@pytest.fixture(scope="session")
def calm_reference(calm_run: dict[str, Any]) -> dict[str, Any]:
    final: dict[str, Any] = calm_run["final"]
    return final


@pytest.fixture(scope="session")
def two_gloo_pods_on_one_gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The final state of two single-process pods sharing the one GPU through gloo (deterministic, 50
    steps): the single-GPU tests' reference, trained once per session (only a GPU test asks for it)."""
    return train_on_one_gpu(tmp_path_factory.mktemp("gpu-gloo-two"), 2)
