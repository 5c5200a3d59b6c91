"""Trainer stand-ins for the fidelity bench (bench/sim_fidelity.py): the trainers of every job of a
simulator trace, played on KWOK pods by one loop, with the simulator's own true models.

Each `tick(now, pods)` looks at every arrived job's running workers (K pods on N nodes) and, for the
time since the last tick, advances its progress at `SimJob.model().goodput(Placement(K, N))`, the
rate the simulator gives it, except while it is paused: a change of its workers pauses it for the
rescale pause (a first start pauses nothing, a start after losing every worker the restart cost), as
the simulator charges. Rank 0's progress annotation is written as the trainer writes it (the
contract's fields, at most once per REPORT_INTERVAL_S per job); a job whose work is done ends its
workers with KWOK's fake exit code 0 and records when. Pure but for `Reporter`, the API writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ebbflow_api import contract
from ebbflow_operator.policies.throughput import Placement, step_shape
from ebbflow_sim.trace import SimJob

REPORT_INTERVAL_S = 1.0

# (pod name, annotations) -> None: one pod's annotations patched.
Annotate = Callable[[str, dict[str, str]], None]


@dataclass
class StandIn:
    """One job's trainers: progress in samples at B0 (as the simulator counts it), the workers they
    last saw, the pause they are in, and when they finished."""

    job: SimJob
    progress: float = 0.0
    workers: tuple[str, ...] = ()
    nodes: int = 0
    paused_until: float = 0.0
    started: bool = False
    finished_at: float | None = None
    rescales: int = 0
    last_report: float = -1e9
    last_tick: float | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds, workers) at each change

    @property
    def steps(self) -> float:
        return self.progress / self.job.global_batch

    def placement(self) -> Placement:
        return Placement(len(self.workers), max(1, self.nodes), 1.0, 1.0)

    def rate(self) -> float:
        return self.job.model(self.steps).goodput(self.placement()) if self.workers else 0.0

    def see(self, now: float, workers: tuple[str, ...], nodes: int, pause_s: float, restart_s: float) -> None:
        """The running workers at `now`: a change pauses the job (see the module's docstring)."""
        if workers == self.workers:
            return
        if workers and self.workers:
            self.paused_until, self.rescales = now + pause_s, self.rescales + 1
        elif workers and self.started:
            self.paused_until = now + restart_s
        self.started = self.started or bool(workers)
        self.workers, self.nodes = workers, nodes
        self.timeline.append((round(now, 1), len(workers)))

    def advance(self, now: float) -> None:
        """Trains from the last tick to `now` at the current rate, skipping the paused part."""
        since = self.last_tick if self.last_tick is not None else now
        self.last_tick = now
        active = now - max(since, self.paused_until)
        if active > 0:
            self.progress = min(self.job.work_samples, self.progress + self.rate() * active)

    @property
    def done(self) -> bool:
        return self.progress >= self.job.work_samples

    def report(self, now: float, pause_s: float) -> dict[str, Any]:
        """Rank 0's progress annotation, as the trainer writes it (ebbflow_trainer/launch/progress.py)."""
        job, placement = self.job, self.placement()
        model = job.model(self.steps)
        micro, accum = step_shape(job.global_batch, job.virtual_nodes, placement.workers)
        step_s = model.step_s(placement)
        compute_s = job.params.compute_s(micro)
        return {
            "step": int(self.steps),
            "samples": int(self.progress),
            "loss": job.loss.loss(self.steps),
            "samplesPerSecond": job.global_batch / step_s,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "eval": None,
            "worldSize": placement.workers,
            "microBatch": int(micro),
            "accumulationSteps": accum,
            "stepSeconds": step_s,
            "computeSeconds": compute_s,
            "communicationSeconds": max(0.0, step_s - (accum + 1) * compute_s),
            "noiseScale": job.noise_scale_at(self.steps) or None,
            "rescalePauseSeconds": pause_s,
        }


@dataclass
class StandIns:
    """Every job of a trace; `tick` once in a while with the namespace's pods (the API's dicts)."""

    jobs: list[SimJob]
    annotate: Annotate
    pause_s: float
    restart_s: float
    states: dict[str, StandIn] = field(init=False)

    def __post_init__(self) -> None:
        self.states = {job.name: StandIn(job) for job in self.jobs}

    def tick(self, now: float, pods: list[dict[str, Any]]) -> None:
        running = running_workers(pods)
        for name, stand_in in self.states.items():
            if stand_in.finished_at is not None or (name not in running and not stand_in.started):
                continue
            workers = running.get(name, [])
            stand_in.advance(now)
            names = tuple(sorted(p["metadata"]["name"] for p in workers))
            nodes = len({p["spec"].get("nodeName") for p in workers})
            stand_in.see(now, names, nodes, self.pause_s, self.restart_s)
            if stand_in.done and stand_in.workers:
                for pod in stand_in.workers:
                    self.annotate(pod, {"ebbflow.dev/fake-exit-code": "0"})
                stand_in.finished_at = now
            elif stand_in.workers and now - stand_in.last_report >= REPORT_INTERVAL_S:
                report = json.dumps(stand_in.report(now, self.pause_s))
                self.annotate(stand_in.workers[0], {contract.ANNOTATION_PROGRESS: report})
                stand_in.last_report = now

    def finished(self) -> dict[str, float]:
        """Each finished job's completion time since its arrival."""
        return {
            name: s.finished_at - s.job.arrival_s
            for name, s in self.states.items()
            if s.finished_at is not None
        }


def running_workers(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Running worker pods by job, those being deleted left out (their trainers are leaving)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(contract.LABEL_ROLE) != contract.ROLE_WORKER or pod["metadata"].get(
            "deletionTimestamp"
        ):
            continue
        if (pod.get("status") or {}).get("phase") == "Running":
            found.setdefault(labels[contract.LABEL_JOB_NAME], []).append(pod)
    return found
