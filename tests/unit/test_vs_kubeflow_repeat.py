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
