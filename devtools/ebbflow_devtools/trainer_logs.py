"""What the trainers say about each world they form, read back from their pods' logs.

Every worker of a new world logs where it resumed (`contract.RESUMES_LOG`); rank 0 adds the steps
the world lost and, after its first step, the pause since the previous world's last step
(`RESUMED_LOG`), and at the end a digest of the model (`FINISHED_LOG`); every worker says when it
switches global batch or compression rate (`BATCH_LOG`, `RATE_LOG`); rank 0's launcher says when a
checkpoint in an object store is complete (`COMMITTED_LOG`). The demo and the e2e tier use
these lines to report rescales as the trainers saw them, not as pod phases suggest. Pure: text in,
records out, with the patterns declared beside the formats in `ebbflow_api.contract`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ebbflow_api import contract

_RESUMES = re.compile(contract.RESUMES_PATTERN)
_RESUMED = re.compile(contract.RESUMED_PATTERN)
_FINISHED = re.compile(contract.FINISHED_PATTERN)
_BATCH = re.compile(contract.BATCH_PATTERN)
_RATE = re.compile(contract.RATE_PATTERN)
_COMMITTED = re.compile(contract.COMMITTED_PATTERN)


@dataclass(frozen=True)
class Resumption:
    """One worker's start in one world."""

    generation: int
    rank: int
    world_size: int
    step: int
    source: str  # memory, peer, shards (a sharded world rebuilt from its members), checkpoint or fresh
    steps_lost: int | None  # rank 0 only


@dataclass(frozen=True)
class World:
    """One world as rank 0 reported it: its size, the step it resumed at, what it lost, its pause."""

    generation: int
    size: int
    step: int
    source: str
    steps_lost: int
    pause_seconds: float | None  # None for a fresh start or a world that never completed a step


def resumptions(log: str) -> list[Resumption]:
    """Every RESUMES_LOG line of one worker's log, in order."""
    return [
        Resumption(int(g), int(r), int(w), int(s), source, int(lost) if lost else None)
        for g, r, w, s, source, lost in _RESUMES.findall(log)
    ]


def pauses(log: str) -> dict[int, float]:
    """Rank 0's pause before each generation's first step, by generation."""
    return {int(g): float(p) for g, p in _RESUMED.findall(log)}


def worlds(logs: Iterable[str]) -> list[World]:
    """The worlds that rank 0 reported in any of `logs` (workers' logs overlap), by generation."""
    found: dict[int, World] = {}
    paused: dict[int, float] = {}
    for log in logs:
        paused.update(pauses(log))
        for r in resumptions(log):
            if r.rank == 0:
                found[r.generation] = World(
                    r.generation, r.world_size, r.step, r.source, r.steps_lost or 0, None
                )
    return [
        World(w.generation, w.size, w.step, w.source, w.steps_lost, paused.get(w.generation))
        for _, w in sorted(found.items())
    ]


def finished(logs: Iterable[str]) -> tuple[int, str] | None:
    """(step, model sha256) from rank 0's FINISHED_LOG line in any of `logs`; None before the end."""
    for log in logs:
        if found := _FINISHED.search(log):
            return int(found.group(1)), found.group(2)
    return None


@dataclass(frozen=True)
class BatchSwitch:
    """One worker's switch of the global batch, from `step` on."""

    step: int
    batch: int
    previous: int
    samples_per_virtual_node: int


@dataclass(frozen=True)
class RateSwitch:
    """One worker's switch of the compression rate, from `step` on."""

    step: int
    rate: float
    previous: float


def batch_switches(log: str) -> list[BatchSwitch]:
    """Every BATCH_LOG line of one worker's log, in order."""
    return [BatchSwitch(int(s), int(b), int(p), int(v)) for s, b, p, v in _BATCH.findall(log)]


def rate_switches(log: str) -> list[RateSwitch]:
    """Every RATE_LOG line of one worker's log, in order."""
    return [RateSwitch(int(s), float(r), float(p)) for s, r, p in _RATE.findall(log)]


def committed_checkpoints(log: str) -> list[int]:
    """The steps of the object-store checkpoints one launcher's log says are complete, in order."""
    return [int(step) for step, _, _ in _COMMITTED.findall(log)]
