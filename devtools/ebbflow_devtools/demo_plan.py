"""The demo's decisions, pure: what it observes of the job, when it takes a node away and brings one
back, and how it describes the job's life. `demo.py` polls the cluster, feeds `Snapshot`s to
`Plan.next` and carries out the actions it returns.

The script, as a state machine (one disruption of each kind; the job must be at full size first):

    FILLING --(max workers ready, past `away_at` of the steps)--> [take a node away] --> SHRINKING
    SHRINKING --(fewer workers desired, `back_after` more steps trained)--> [bring it back] --> GROWING
    GROWING --(max workers desired again)--> CALM
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Stage(StrEnum):
    FILLING = "filling"
    SHRINKING = "shrinking"
    GROWING = "growing"
    CALM = "calm"


class Action(StrEnum):
    NONE = "none"
    TAKE_NODE_AWAY = "take a node away"
    BRING_NODE_BACK = "bring the node back"


@dataclass(frozen=True)
class Snapshot:
    """What the job's status says at one moment (seconds since the job was submitted)."""

    at: float
    phase: str
    desired: int
    ready: int
    step: int
    loss: float | None
    accuracy: float | None
    samples_per_second: float | None
    worker_nodes: Mapping[str, str]  # worker pod -> node ('' while unscheduled)
    preemptions: int

    @classmethod
    def of(cls, job: Mapping[str, Any], at: float) -> Snapshot:
        status = job.get("status") or {}
        progress = status.get("progress") or {}
        evaluation = (progress.get("eval") or {}).get("metrics") or {}
        return cls(
            at=at,
            phase=str(status.get("phase") or "Pending"),
            desired=int(status.get("desiredReplicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            step=int(progress.get("step") or 0),
            loss=progress.get("loss"),
            accuracy=evaluation.get("accuracy"),
            samples_per_second=progress.get("samplesPerSecond"),
            worker_nodes=dict(status.get("workerNodes") or {}),
            preemptions=int(status.get("preemptions") or 0),
        )

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Plan:
    """When to disturb a job of `steps` steps and at most `full` workers."""

    steps: int
    full: int
    away_at: float = 0.25  # fraction of the steps trained at full size before a node goes
    back_after: int = 150  # steps trained on fewer workers before the node comes back

    def next(self, stage: Stage, now: Snapshot, since: Snapshot) -> tuple[Stage, Action]:
        """The stage after `now` and what to do; `since` is the snapshot at which `stage` began."""
        if now.finished:
            return stage, Action.NONE
        if stage is Stage.FILLING and now.ready >= self.full and now.step >= self.away_at * self.steps:
            return Stage.SHRINKING, Action.TAKE_NODE_AWAY
        if stage is Stage.SHRINKING and now.desired < self.full and now.step >= since.step + self.back_after:
            return Stage.GROWING, Action.BRING_NODE_BACK
        if stage is Stage.GROWING and now.desired >= self.full:
            return Stage.CALM, Action.NONE
        return stage, Action.NONE


def node_to_take(worker_nodes: Mapping[str, str], rendezvous_node: str) -> str:
    """A node with the job's workers on it but not its rendezvous store (losing that is another
    scenario); the one with the most workers, then by name."""
    counts: dict[str, int] = {}
    for node in worker_nodes.values():
        if node and node != rendezvous_node:
            counts[node] = counts.get(node, 0) + 1
    if not counts:
        raise ValueError(
            f"no worker runs away from the rendezvous node {rendezvous_node}: {dict(worker_nodes)}"
        )
    return min(counts, key=lambda node: (-counts[node], node))


def progress_line(now: Snapshot, steps: int, full: int, width: int = 24) -> str:
    """One line: time, a bar of the steps, loss, accuracy, workers, throughput."""
    done = min(width, width * now.step // max(steps, 1))
    bar = "#" * done + "." * (width - done)
    parts = [f"[{now.at:5.0f} s] {now.phase:<9} step {now.step:>5}/{steps} [{bar}]"]
    if now.loss is not None:
        parts.append(f"loss {now.loss:.3f}")
    if now.accuracy is not None:
        parts.append(f"accuracy {now.accuracy:.3f}")
    parts.append(f"workers {now.ready}/{now.desired} (max {full})")
    if now.samples_per_second:
        parts.append(f"{now.samples_per_second:,.0f} samples/s")
    return "  ".join(parts)
