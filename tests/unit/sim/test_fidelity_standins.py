"""The fidelity bench's trainer stand-ins (bench/fidelity_standins.py) charge a job what the
simulator charges it: its true goodput at its workers, a rescale pause at every change of workers,
the restart cost after losing all of them, none at its first start; and their reports give the
operator the measurement the simulator's policies see for the same placement."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ebbflow_operator.policies.history import Where, measurement_of
from ebbflow_operator.policies.throughput import Placement
from ebbflow_sim.job_state import JobState

from .test_sim import job, rate

PAUSE_S, RESTART_S = 3.0, 10.0


def _load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "fidelity_standins.py"
    spec = importlib.util.spec_from_file_location("fidelity_standins", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_standins"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


standins = _load_bench()


def pod(name: str, job_name: str, node: str, phase: str = "Running") -> dict[str, Any]:
    labels = {"ebbflow.dev/role": "worker", "ebbflow.dev/job-name": job_name}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def replay(
    schedule: list[tuple[float, list[dict[str, Any]]]], until: float
) -> tuple[Any, list[tuple[str, dict[str, str]]]]:
    """Ticks every second up to `until`; the pods at each tick are those of the last schedule entry
    at or before it."""
    written: list[tuple[str, dict[str, str]]] = []
    stand_ins = standins.StandIns(
        [job("a", hi=4, seconds=100.0)], lambda p, a: written.append((p, a)), PAUSE_S, RESTART_S
    )
    for second in range(int(until) + 1):
        pods = [ps for at, ps in schedule if at <= second][-1]
        stand_ins.tick(float(second), pods)
    return stand_ins.states["a"], written


FOUR = [pod(f"a-worker-{i}", "a", "n1") for i in range(4)]
TWO = FOUR[:2]


@pytest.mark.parametrize(
    ("schedule", "expected_finish"),
    [
        pytest.param([(0, FOUR)], 100.0, id="alone-at-its-max"),
        # 40 s at 4 workers is 40 % of the work; the rest at 2 workers after the pause.
        pytest.param(
            [(0, FOUR), (40, TWO)],
            40 + PAUSE_S + 60 * rate(job(hi=4), 4, 1) / rate(job(hi=4), 2, 1),
            id="shrunk",
        ),
        pytest.param([(0, FOUR), (40, []), (50, FOUR)], 50 + RESTART_S + 60, id="lost-every-worker"),
    ],
)
def test_a_job_finishes_when_the_simulators_accounting_says(
    schedule: list[tuple[float, list[dict[str, Any]]]], expected_finish: float
) -> None:
    state, written = replay(schedule, 400)
    assert state.finished_at is not None
    # Ticks are one second apart: the finish is seen at the first tick at or after it.
    assert expected_finish <= state.finished_at < expected_finish + 1.0 + 1e-9
    ended = [pod for pod, annotations in written if annotations.get("ebbflow.dev/fake-exit-code") == "0"]
    assert sorted(ended) == sorted(p["metadata"]["name"] for p in schedule[-1][1])


def test_pods_being_deleted_or_not_running_are_not_workers() -> None:
    leaving = pod("a-worker-9", "a", "n2")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    pods = [*TWO, leaving, pod("a-worker-8", "a", "n2", phase="Pending"), pod("b-worker-0", "b", "n1")]
    found = standins.running_workers(pods)
    assert {name: len(workers) for name, workers in found.items()} == {"a": 2, "b": 1}


def test_the_report_gives_the_operator_the_measurement_the_simulator_records() -> None:
    _, written = replay([(0, TWO)], 3)
    reports = [json.loads(a["ebbflow.dev/progress"]) for _, a in written if "ebbflow.dev/progress" in a]
    assert reports and reports[-1]["worldSize"] == 2
    seen = measurement_of(reports[-1], Where(nodes=1))
    simulated = JobState(job("a", hi=4, seconds=100.0))
    placement = Placement(2, 1)
    simulated.measure(placement, simulated.job.model().step_s(placement))
    (recorded,) = simulated.shapes.values()
    assert seen == recorded
