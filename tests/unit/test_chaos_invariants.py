"""The chaos soak's invariant checks (bench/chaos_soak.py) catch what they are meant to catch: a soak
that reports no violation is only worth something if each check can fail. Raw API objects in, as
the soak lists them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.builders import NOW, JobBuilder
from ebbflow_devtools.gpunodes import GpuNodeTemplate
from ebbflow_operator.decision.decide import OperatorConfig
from ebbflow_operator.decision.model import format_time

pytestmark = pytest.mark.unit


def _load_soak() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos_soak.py"
    spec = importlib.util.spec_from_file_location("chaos_soak", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


soak = _load_soak()
CONFIG = OperatorConfig(namespaces=("soak",), node_selector={})


def node(name: str, gpus: int = 4) -> dict[str, Any]:
    raw: dict[str, Any] = GpuNodeTemplate(gpus=gpus, time_slicing_replicas=1).manifest(name)
    raw["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return raw


def job(name: str, low: int, high: int, age: float = 600, **status: Any) -> dict[str, Any]:
    raw = JobBuilder(name).replicas(low, high).obj()
    raw["metadata"].update(
        namespace="soak", uid=f"uid-{name}", generation=1, creationTimestamp=format_time(NOW - age)
    )
    raw["status"] = status
    return raw


def worker(
    job_name: str,
    index: int,
    node_name: str = "n0",
    phase: str = "Running",
    deleting: bool = False,
    gpus: int = 1,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": f"{job_name}-worker-{index}",
        "namespace": "soak",
        "uid": f"uid-{job_name}-{index}",
        "labels": {
            contract.LABEL_JOB_NAME: job_name,
            contract.LABEL_ROLE: contract.ROLE_WORKER,
            contract.LABEL_WORKER_INDEX: str(index),
        },
        "ownerReferences": [{"uid": f"uid-{job_name}", "controller": True}],
        "creationTimestamp": format_time(NOW - 60),
    }
    if deleting:
        metadata["deletionTimestamp"] = format_time(NOW)
    container = {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "metadata": metadata,
        "spec": {"nodeName": node_name, "containers": [container]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(phase == "Running")}]},
    }


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([worker("a", 0), worker("a", 0)], ["a: index 0 x2"], id="two-live-same-index"),
        pytest.param([worker("a", 0, deleting=True), worker("a", 0)], [], id="one-of-them-leaving"),
        pytest.param([worker("a", 0, phase="Succeeded"), worker("a", 0)], [], id="one-of-them-finished"),
        pytest.param([worker("a", 0), worker("b", 0)], [], id="same-index-other-job"),
        pytest.param([worker("a", 0), worker("a", 1)], [], id="distinct"),
    ],
)
def test_duplicate_indices(pods: list[dict[str, Any]], expected: list[str]) -> None:
    assert soak.duplicate_indices(pods) == expected


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([worker("a", 0, gpus=3), worker("b", 0, gpus=2)], ["n0: 5 > 4"], id="five-on-four"),
        pytest.param(
            [worker("a", 0, gpus=3), worker("b", 0, gpus=2, deleting=True)], [], id="leaving-pod-not-counted"
        ),
        pytest.param([worker("a", 0, gpus=4)], [], id="exactly-full"),
        pytest.param([worker("a", 0, gpus=8, node_name="gone")], [], id="node-not-listed"),
    ],
)
def test_overcommitted(pods: list[dict[str, Any]], expected: list[str]) -> None:
    assert soak.overcommitted([node("n0", 4)], pods) == expected


def test_failed_jobs() -> None:
    jobs = [job("a", 1, 2, phase="Running"), job("b", 1, 2, phase="Failed"), job("c", 1, 2)]
    assert soak.failed_jobs(jobs) == ["b"]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        pytest.param(4, {"old", "new"}, id="both-minimums-fit"),
        pytest.param(3, {"old"}, id="only-the-older-fits"),
        pytest.param(0, set(), id="no-gpus"),
    ],
)
def test_entitled_to_min(gpus: int, expected: set[str]) -> None:
    nodes = [node("n0", gpus)] if gpus else []
    jobs = [job("old", 2, 4, age=900), job("new", 2, 4, age=60)]
    assert soak.entitled_to_min(nodes, jobs, NOW, CONFIG) == expected


def test_unconverged_names_what_is_missing_and_is_empty_once_converged() -> None:
    settled = job("a", 1, 2, desiredReplicas=2, readyReplicas=2)
    assert soak.unconverged([node("n0", 4)], [worker("a", 0), worker("a", 1)], [settled], NOW, CONFIG) == []

    growing = job("a", 1, 4, desiredReplicas=2, readyReplicas=2)
    [reason] = soak.unconverged([node("n0", 4)], [worker("a", 0), worker("a", 1)], [growing], NOW, CONFIG)
    assert reason.startswith("a: 2 to create")

    stale = job("a", 1, 2, desiredReplicas=2, readyReplicas=1)
    [reason] = soak.unconverged([node("n0", 4)], [worker("a", 0), worker("a", 1)], [stale], NOW, CONFIG)
    assert reason == "a: allocator 2, status (2, 1), running 2"
