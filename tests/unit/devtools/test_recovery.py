"""Recovery figures from trainers' journals (ebbflow_devtools.recovery), for both systems' record formats."""

from __future__ import annotations

from typing import Any

import pytest
from ebbflow_devtools.recovery import Recovery, ebbflow_timeline, recovery, torchrun_timeline


def generation(
    time: float, generation: int, world: int, step: int, source: str, rank: int = 0
) -> dict[str, Any]:
    return {"event": "generation", "time": time, "generation": generation, "rank": rank, "world": world,
            "step": step, "source": source}  # fmt: skip


def ebbflow_step(time: float, step: int, generation: int, rank: int = 0) -> dict[str, Any]:
    return {"event": "step", "time": time, "step": step, "generation": generation, "rank": rank}


def start(time: float, world: int, step: int) -> dict[str, Any]:
    return {"event": "start", "time": time, "world": world, "restart": 0, "step": step}


def torchrun_step(time: float, step: int, world: int) -> dict[str, Any]:
    return {"event": "step", "time": time, "step": step, "world": world}


# Ebbflow: three train to step 10, a node goes at t=20, two resume from memory at t=24 and step on.
EBBFLOW = [
    generation(0, 1, 3, 0, "fresh"),
    generation(0, 1, 3, 0, "fresh", rank=1),
    *[ebbflow_step(i, i, 1) for i in range(1, 11)],
    *[ebbflow_step(i, i, 1, rank=1) for i in range(1, 11)],
    generation(23, 2, 2, 10, "memory"),
    *[ebbflow_step(23 + i, 10 + i, 2) for i in range(1, 6)],
]

# torchrun: steps to 60 (checkpoint at 50), a node goes at t=70, one restart that crashes, then a world
# of two resumes from the checkpoint at t=100.
TORCHRUN = [
    start(0, 3, 0),
    *[torchrun_step(i, i, 3) for i in range(1, 61)],
    start(80, 2, 50),
    start(95, 2, 50),
    *[torchrun_step(95 + i, 50 + i, 2) for i in range(1, 11)],
]


@pytest.mark.parametrize(
    ("records", "parse", "at", "until", "expected"),
    [
        pytest.param(
            EBBFLOW, ebbflow_timeline, 20, 60, Recovery("x", 20, 4, 0, "memory", 2, 1), id="ebbflow"
        ),
        pytest.param(
            TORCHRUN, torchrun_timeline, 70, 200, Recovery("x", 70, 26, 10, "checkpoint", 2, 2), id="torchrun"
        ),
        pytest.param(
            TORCHRUN, torchrun_timeline, 70, 90, Recovery("x", 70, None, None, None, None, 1), id="not-yet"
        ),
        pytest.param(
            EBBFLOW[:22],
            ebbflow_timeline,
            20,
            60,
            Recovery("x", 20, None, None, None, None, 0),
            id="no-world",
        ),
    ],
)
def test_recovery(
    records: list[dict[str, Any]], parse: Any, at: float, until: float, expected: Recovery
) -> None:
    assert recovery(parse(records), "x", at, until) == expected


def test_only_rank_0_speaks_for_an_ebbflow_world() -> None:
    timeline = ebbflow_timeline(EBBFLOW)
    assert [s.world for s in timeline.starts] == [1, 2]
    assert len(timeline.steps) == 15
    assert timeline.finished_at(15) == 28
    assert timeline.finished_at(16) is None


def test_torchrun_steps_belong_to_the_latest_start() -> None:
    timeline = torchrun_timeline(TORCHRUN)
    assert [(s.world, s.resumed_step, s.source) for s in timeline.starts] == [
        (0, 0, "fresh"),
        (1, 50, "checkpoint"),
        (2, 50, "checkpoint"),
    ]
    assert {s.world for s in timeline.steps if s.step > 50 and s.time > 95} == {2}
