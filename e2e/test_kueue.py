"""A job under a Kueue LocalQueue trained to the end through a preemption by a higher-priority job,
with Kueue installed in the cluster (hack/kueue) and the operator's integration on (the chart's
`operator.kueue`).

The ClusterQueue holds 4 GPUs: job `queued` (two workers of 2 GPUs) uses all of it; job `urgent`
(priority 100, two workers of 2 GPUs) arrives. No graceful shrink can make room (`queued` keeps one
worker at least; the integration tier checks the shrink), so Kueue evicts `queued`, whose workers
leave at a step boundary (rank 0 writes the durable checkpoint, on a shared volume); the operator
gives the quota back once they are gone, `urgent` runs, and `queued` resumes from its checkpoint
when Kueue admits it again, once `urgent` has ended. The workers' journal (on the same volume) says
where each world started: 0 steps lost. A sampler reads the pods all along: never more GPUs
requested than the quota.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ebbflow_api.contract import LABEL_JOB_NAME
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import E2E_NAMESPACE, Kind, KindError, kueue_ready, poll
from ebbflow_devtools.kind_jobs import make_shared_dir, on_shared_volume, read_journal
from ebbflow_devtools.kueue import cluster_queue, local_queue, resource_flavor
from ebbflow_devtools.waiting import NotYet

from . import jobs
from .jobs import JOB_DEADLINE_S

QUEUE, CLUSTER_QUEUE, FLAVOR = "e2e", "e2e-gpus", "e2e-default"
QUOTA_GPUS = 4
CLAIM = "e2e-kueue"
STEPS, CHECKPOINT_EVERY = 300, 50
# The job under preemption keeps its checkpoint and its workers' journal here (the claim's subPath).
QUEUED_DIR = "kueue-queued"


@pytest.fixture
def queue(kind: Kind, namespace: str) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue of QUOTA_GPUS GPUs for the e2e namespace (preempting lower
    priorities within itself) and its LocalQueue; removed after the test's jobs."""
    manifests = [
        resource_flavor(FLAVOR),
        cluster_queue(CLUSTER_QUEUE, QUOTA_GPUS, namespace, flavor=FLAVOR),
        local_queue(namespace, QUEUE, CLUSTER_QUEUE),
    ]

    def applied() -> bool | NotYet:
        try:
            kind.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        except KindError as error:  # Kueue's webhook not serving yet
            return NotYet(str(error))
        return True

    kueue_ready(kind)
    poll(applied, 120, "the queue objects admitted by Kueue's webhooks")
    yield QUEUE
    kind.kubectl("-n", namespace, "delete", "elastictrainingjobs", "--all", "--wait=true", timeout=300)
    for kind_of, name, scope in (
        ("localqueue", QUEUE, ("-n", namespace)),
        ("clusterqueue", CLUSTER_QUEUE, ()),
        ("resourceflavor", FLAVOR, ()),
    ):
        kind.kubectl("delete", *scope, kind_of, name, "--ignore-not-found", "--wait=true", timeout=180)


@pytest.fixture
def shared(kind: Kind, namespace: str) -> Iterator[Path]:
    """The queued job's directory on a shared volume (the host's side)."""
    with jobs.shared_claim(kind, CLAIM, (QUEUED_DIR,)) as volume:
        yield make_shared_dir(volume, QUEUED_DIR)


class QuotaSampler(threading.Thread):
    """Reads the namespace's pods and the queued job once a second until stopped: the most GPUs that
    pods not yet ended requested at once (a pod still terminating holds its GPUs), when each job's
    worker count changed, and each change of the queued job's Admitted condition."""

    def __init__(self, kind: Kind) -> None:
        super().__init__(daemon=True)
        self.kind = kind
        self.most_gpus = 0
        self.at_most: list[str] = []  # the pods and their GPUs when the most were requested
        self.workers: list[tuple[float, str, int]] = []  # (monotonic time, job, workers not ended)
        self.admitted: list[tuple[str, str]] = []  # the queued job's (status, reason), each change once
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(1.0):
            try:
                # The queue's jobs alone: pods of an earlier test may still be terminating.
                pods = self.kind.api.pods(E2E_NAMESPACE, f"{LABEL_JOB_NAME} in (queued,urgent)")
                condition = _condition(jobs.status(self.kind, "queued"), "Admitted")
            except KindError:
                continue
            live = [p for p in pods if not _ended(p)]
            if sum(_gpus(p) for p in live) > self.most_gpus:
                self.most_gpus = sum(_gpus(p) for p in live)
                self.at_most = sorted(f"{p['metadata']['name']}: {_gpus(p)}" for p in live)
            for job in ("queued", "urgent"):
                count = sum(p["metadata"]["name"].startswith(f"{job}-worker-") for p in live)
                if not any(j == job for _, j, _ in self.workers) or self._last(job) != count:
                    self.workers.append((time.monotonic(), job, count))
            seen = (condition.get("status", ""), condition.get("reason", ""))
            if condition and (not self.admitted or self.admitted[-1] != seen):
                self.admitted.append(seen)

    def _last(self, job: str) -> int:
        return next(count for _, j, count in reversed(self.workers) if j == job)

    def first(self, job: str, after: float, count: int) -> float | None:
        """Seconds from `after` until `job` was first seen with `count` workers."""
        return next((t - after for t, j, n in self.workers if j == job and n == count and t >= after), None)

    def stop(self) -> None:
        self._stopped.set()
        self.join(10)


def _gpus(pod: dict[str, Any]) -> int:
    return sum(
        int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0)) for c in pod["spec"]["containers"]
    )


def _ended(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") in ("Succeeded", "Failed")


def _condition(status: dict[str, Any], kind_of: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind_of), {})


def _worlds_started_behind(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `generation` events that started a world at a step below one already trained: lost steps."""
    reached, behind = 0, []
    for event in events:
        if event["event"] == "generation" and event["step"] < reached:
            behind.append({**event, "reached": reached})
        reached = max(reached, int(event.get("step", 0)))
    return behind


def _queued_job(directory: str) -> dict[str, Any]:
    job = jobs.digits_job("queued", 1, 2, steps=STEPS, vnode_seconds=0.03, gpus=2, queue=QUEUE)
    return on_shared_volume(job, CLAIM, directory, CHECKPOINT_EVERY)


def test_a_queued_job_preempted_by_a_higher_priority_one_suspends_and_resumes_without_losing_a_step(
    kind: Kind, namespace: str, operator: str, queue: str, shared: Path
) -> None:
    sampler = QuotaSampler(kind)
    sampler.start()
    try:
        jobs.apply(kind, _queued_job(QUEUED_DIR))
        poll(
            lambda: (
                jobs.all_training_together(kind, "queued", 2) and _step(kind, "queued") >= CHECKPOINT_EVERY
            ),
            JOB_DEADLINE_S,
            "the queued job admitted and training on two workers",
        )
        submitted = time.monotonic()
        urgent = jobs.digits_job(
            "urgent", 2, 2, steps=100, vnode_seconds=0.03, gpus=2, priority=100, queue=queue
        )
        jobs.apply(kind, urgent)
        # What happens in between (the queued job's workers gone, the urgent one's pods made, the
        # queued job admitted again once it ended) is seen by the sampler: each lasts seconds.
        jobs.wait_phase(kind, "urgent", "Succeeded", timeout=2 * JOB_DEADLINE_S)
        final = jobs.wait_phase(kind, "queued", "Succeeded", timeout=2 * JOB_DEADLINE_S)
    finally:
        sampler.stop()

    assert final["progress"]["step"] == STEPS, final["progress"]
    assert sampler.most_gpus <= QUOTA_GPUS, (
        f"{sampler.most_gpus} GPUs requested under a quota of {QUOTA_GPUS}: {sampler.at_most}"
    )
    assert ("False", "EvictedPreempted") in sampler.admitted, sampler.admitted
    events = read_journal(shared)
    assert not _worlds_started_behind(events), _worlds_started_behind(events)
    left = [e for e in events if e["event"] == "left"]
    # One suspension, one world from the checkpoint: growing back takes no restart.
    resumed = [
        e for e in events if e["event"] == "generation" and e["source"] == "checkpoint" and e["rank"] == 0
    ]
    assert left and len(resumed) == 1 and resumed[0]["time"] > left[0]["time"], (left, resumed)
    logs = [jobs.logs(kind, p["metadata"]["name"]) for p in jobs.worker_pods(kind, "queued")]
    jobs.record_figures(
        "kueue-preemption",
        {
            "urgent_submitted_to_queued_workers_gone_seconds": sampler.first("queued", submitted, 0),
            "urgent_submitted_to_urgent_workers_created_seconds": sampler.first("urgent", submitted, 2),
            "queued_workers_stopped_at_steps": sorted({e["step"] for e in left}),
            "queued_resumed_from_checkpoint_at_step": resumed[0]["step"],
            "admitted_conditions": sampler.admitted,
            "worker_counts": [(round(t - submitted, 1), job, n) for t, job, n in sampler.workers],
            "most_gpus_requested": sampler.most_gpus,
            "worlds_after_the_preemption": [vars(w) for w in trainer_logs.worlds(logs)],
        },
    )


def _step(kind: Kind, name: str) -> int:
    return int((jobs.status(kind, name).get("progress") or {}).get("step") or 0)
