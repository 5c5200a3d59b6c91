"""How a training job came through a disruption, read from its trainers' own journals, never from pod
phases (bench/vs_kubeflow.py compares Ebbflow with Kubeflow's PyTorchJob this way). Pure.

Both systems' records become one `Timeline` of worlds (an Ebbflow generation, or one start of the
torchrun baseline's processes) and steps; every step belongs to the latest world started before it.
A disruption's figures: ``resumed_after_s`` (to the first step of a world started after it; None if
none before ``until``), ``steps_lost`` (work done again), ``source`` (what that world resumed from:
memory, peer, checkpoint or fresh) and ``worlds_started`` (more than one: it restarted again before
it trained, e.g. a crash loop).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorldStart:
    time: float
    world: int
    size: int
    resumed_step: int
    source: str


@dataclass(frozen=True)
class Step:
    time: float
    step: int
    world: int


@dataclass(frozen=True)
class Timeline:
    starts: tuple[WorldStart, ...]
    steps: tuple[Step, ...]

    def finished_at(self, last_step: int) -> float | None:
        """When the job completed its last step."""
        return next((s.time for s in self.steps if s.step >= last_step), None)


@dataclass(frozen=True)
class Recovery:
    disruption: str
    at: float
    resumed_after_s: float | None
    steps_lost: int | None
    source: str | None
    size_after: int | None
    worlds_started: int


def ebbflow_timeline(records: Iterable[Mapping[str, Any]]) -> Timeline:
    """From the Ebbflow trainers' journals (every worker's; rank 0's records speak for the world)."""
    ordered = sorted((r for r in records if r.get("rank") == 0), key=lambda r: float(r["time"]))
    starts = [
        WorldStart(float(r["time"]), int(r["generation"]), int(r["world"]), int(r["step"]), str(r["source"]))
        for r in ordered
        if r["event"] == "generation"
    ]
    steps = [
        Step(float(r["time"]), int(r["step"]), int(r["generation"])) for r in ordered if r["event"] == "step"
    ]
    return Timeline(tuple(starts), tuple(steps))


def torchrun_timeline(records: Iterable[Mapping[str, Any]]) -> Timeline:
    """From the torchrun baseline's events (rank 0's ``start``/``step``/``done`` lines); each start is
    a new world, numbered in order."""
    starts: list[WorldStart] = []
    steps: list[Step] = []
    for record in sorted(records, key=lambda r: float(r["time"])):
        if record["event"] == "start":
            source = "checkpoint" if int(record["step"]) > 0 else "fresh"
            starts.append(
                WorldStart(
                    float(record["time"]), len(starts), int(record["world"]), int(record["step"]), source
                )
            )
        elif record["event"] == "step" and starts:
            steps.append(Step(float(record["time"]), int(record["step"]), starts[-1].world))
    return Timeline(tuple(starts), tuple(steps))


def recovery(timeline: Timeline, disruption: str, at: float, until: float) -> Recovery:
    """What the job did between the disruption at ``at`` and ``until`` (see the module docstring)."""
    later = [s for s in timeline.starts if at < s.time <= until]
    fresh_worlds = {s.world for s in later}
    first = next((s for s in timeline.steps if s.world in fresh_worlds and s.time <= until), None)
    if first is None:
        return Recovery(disruption, at, None, None, None, None, len(later))
    world = next(s for s in later if s.world == first.world)
    done_before = [s.step for s in timeline.steps if s.time < world.time]
    lost = max(0, max(done_before, default=0) - world.resumed_step)
    restarts = sum(1 for s in later if s.time <= first.time)
    return Recovery(disruption, at, first.time - at, lost, world.source, world.size, restarts)
