"""The Kubeflow comparison's repeatability check (bench/vs_kubeflow.py --compare): a second run
counts as the same numbers only when every figure is within 30 % of the first and every category
(where training resumed from, the outcome) is the same."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.unit


def _load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "vs_kubeflow.py"
    spec = importlib.util.spec_from_file_location("vs_kubeflow", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_kubeflow"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def run(resumed: float | None, lost: int, source: str = "memory", calm: float = 100.0) -> dict[str, Any]:
    """One system's results.json with one disruption row: the calm job `calm` s, the disrupted twice."""
    row = {"disruption": "a: worker node lost", "resumed_after_s": resumed, "steps_lost": lost}
    row["source"] = source
    job = {"outcome": "Succeeded", "job_seconds": calm}
    disrupted = {**job, "job_seconds": 2 * calm}
    return {"results": {"ebbflow": {"rows": [row], "calm": job, "disrupted": disrupted}}}


@pytest.mark.parametrize(
    ("second", "misses"),
    [
        pytest.param(run(10.0, 4), [], id="identical"),
        pytest.param(run(12.9, 4, calm=71.0), [], id="within-30-percent"),
        pytest.param(run(13.1, 4), ["ebbflow: a: worker node lost: trains again after (s)"], id="over-30"),
        pytest.param(run(10.0, 0), ["ebbflow: a: worker node lost: steps lost"], id="count-from-4-to-0"),
        pytest.param(
            run(None, 4), ["ebbflow: a: worker node lost: trains again after (s)"], id="measured-once-only"
        ),
        pytest.param(run(10.0, 4, "peer"), [], id="memory-or-peer-both-keep-state"),
        pytest.param(
            run(10.0, 4, "checkpoint"), ["ebbflow: a: worker node lost: resumed from"], id="checkpoint-is-not"
        ),
    ],
)
def test_repeatability_flags_what_did_not_repeat(second: dict[str, Any], misses: list[str]) -> None:
    table, missed = bench.repeatability(run(10.0, 4), second)
    assert missed == misses
    assert table.count("| **no** |") == len(misses)


def test_zero_repeats_only_as_zero() -> None:
    assert bench.repeatability(run(10.0, 0), run(10.0, 0))[1] == []
    assert bench.repeatability(run(10.0, 0), run(10.0, 1))[1] == ["ebbflow: a: worker node lost: steps lost"]


def disrupted(resumed: float | None, lost: int, source: str = "memory", note: str = "") -> dict[str, Any]:
    """One disrupted run of one disruption, as measure() keeps it."""
    row = {"system": "ebbflow", "disruption": "a: worker node lost", "resumed_after_s": resumed}
    row |= {"steps_lost": lost, "source": source, "size_after": 2, "worlds_started": 1, "note": note}
    job = {"outcome": "Succeeded", "steps": 1000, "job_seconds": 200.0 + lost, "container_restarts": lost}
    return {"disrupted": job, "rows": [row]}


@pytest.mark.parametrize(
    ("runs", "resumed", "spread", "lost", "source", "note"),
    [
        pytest.param([disrupted(4.6, 0)], 4.6, [4.6, 4.6], 0, "memory", "", id="one-run-is-itself"),
        pytest.param(
            [disrupted(3.8, 0), disrupted(7.5, 0), disrupted(4.6, 0, "peer")],
            4.6,
            [3.8, 7.5],
            0,
            "memory",
            "",
            id="median-and-range-of-three",
        ),
        pytest.param(
            [disrupted(10.0, 4), disrupted(20.0, 5)],
            15.0,
            [10.0, 20.0],
            4,
            "memory",
            "",
            id="even-count-lower-middle",
        ),
        pytest.param(
            [disrupted(10.0, 4, "checkpoint"), disrupted(None, 9, "checkpoint", "no step within 240 s")],
            10.0,
            [10.0, 10.0],
            4,
            "checkpoint",
            "trained again in 1 of 2 runs; no step within 240 s",
            id="a-run-that-never-recovered-is-named",
        ),
        pytest.param(
            [disrupted(None, 0, note="the job ended (Failed) first")] * 2,
            None,
            None,
            0,
            "memory",
            "trained again in 0 of 2 runs; the job ended (Failed) first",
            id="none-recovered",
        ),
    ],
)
def test_repeated_runs_combine_to_medians(
    runs: list[dict[str, Any]],
    resumed: float | None,
    spread: list[float] | None,
    lost: int,
    source: str,
    note: str,
) -> None:
    row = bench.combine(runs)["rows"][0]
    assert (row["resumed_after_s"], row["resumed_range_s"]) == (resumed, spread)
    assert (row["steps_lost"], row["source"], row["note"], row["runs"]) == (lost, source, note, len(runs))


def test_repeated_jobs_combine_outcomes_and_durations() -> None:
    failed = disrupted(5.0, 3)
    failed["disrupted"] |= {"outcome": "Failed", "steps": 700}
    job = bench.combine([disrupted(5.0, 1), disrupted(5.0, 2), failed])["disrupted"]
    assert job == {
        "outcome": "Succeeded (2 of 3), Failed (1 of 3)",
        "steps": 700,
        "job_seconds": 202.0,
        "container_restarts": 2,
    }


def test_table_shows_the_median_with_its_range_only_for_repeats() -> None:
    once = {"ebbflow": {"calm": {"job_seconds": 100.0}, **bench.combine([disrupted(4.6, 0)])}}
    thrice = {
        "ebbflow": {
            "calm": {"job_seconds": 100.0},
            **bench.combine([disrupted(s, 0) for s in (3.8, 7.5, 4.6)]),
        }
    }
    assert "| ebbflow | a: worker node lost | 4.6 | 0 |" in bench.table(once)
    assert "| ebbflow | a: worker node lost | 4.6 (3.8-7.5) | 0 |" in bench.table(thrice)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        pytest.param(None, False, id="not-training-yet"),
        pytest.param(24, False, id="before"),
        pytest.param(25, True, id="first"),
        pytest.param(29, True, id="last"),
        pytest.param(30, False, id="after"),
        pytest.param(475, True, id="later-interval"),
        pytest.param(500, False, id="at-a-checkpoint"),
    ],
)
def test_disruptions_wait_for_the_same_place_between_two_checkpoints(
    step: int | None, expected: bool
) -> None:
    assert bench.at_disruption_phase(step) is expected
