"""Checkpoints in object storage, on kind: the job of examples/jobs/digits-object-store.yaml keeps
its durable checkpoints in the cluster's SeaweedFS (devtools/ebbflow_devtools/object_store.py). Every
worker is killed at once (SIGKILL on its node: no leave, no handoff, no state left in any memory);
the operator declares them gone to the job's rendezvous and replaces the failed pods, and the new
world resumes from the newest complete checkpoint in the store and ends Succeeded."""

from __future__ import annotations

import ast
import json
import time
from datetime import UTC, datetime
from typing import Any

from ebbflow_devtools import object_store, trainer_logs
from ebbflow_devtools.demo import target_accuracy
from ebbflow_devtools.kind import E2E_NAMESPACE, Kind, make_bucket, poll
from ebbflow_devtools.kind_jobs import example

from . import jobs
from .jobs import JOB_DEADLINE_S

NAME, STEPS, EVERY = "digits-object-store", 400, 50
# Checkpoints complete before the kill: the job then resumes at one of them, past the first.
COMMITTED_BEFORE_KILL = 2


def _job() -> dict[str, Any]:
    """The example, shorter: 400 steps with device time simulated so that they last about a minute
    on three workers, a checkpoint every 50, in a prefix of its own."""
    (job,) = example("jobs/digits-object-store.yaml")
    spec = job["spec"]
    spec["checkpoint"]["intervalSteps"] = EVERY
    # A prefix of this run's own: a job resumes from whatever its prefix holds, and the store keeps
    # an earlier run's checkpoints for as long as the cluster lives.
    spec["checkpoint"]["path"] += f"-{time.time_ns()}"
    container = spec["template"]["spec"]["containers"][0]
    command = container["command"]
    command[command.index("--steps") + 1] = str(STEPS)
    container["command"] = [*command, "--simulated-vnode-seconds", "0.03"]
    return job


def _logs(kind: Kind) -> list[str]:
    return [jobs.logs(kind, p["metadata"]["name"]) for p in jobs.worker_pods(kind, NAME)]


def _committed(kind: Kind) -> list[int]:
    return sorted(step for log in _logs(kind) for step in trainer_logs.committed_checkpoints(log))


def _declarations(operator_log: str) -> dict[str, str]:
    """What the job's rendezvous answered the operator's declarations, by pod (reconciler.py's line)."""
    answered: dict[str, str] = {}
    for line in operator_log.splitlines():
        _, found, answer = line.partition(f"{E2E_NAMESPACE}/{NAME}: declared gone to the rendezvous: ")
        if found:
            answered |= ast.literal_eval(answer)
    return answered


def test_a_job_whose_every_worker_is_killed_resumes_from_the_object_store_and_succeeds(
    kind: Kind, namespace: str, operator: str
) -> None:
    job = _job()
    bucket = job["spec"]["checkpoint"]["path"].removeprefix("s3://").split("/")[0]
    make_bucket(kind, bucket)
    secret = object_store.credentials_secret("object-store-credentials", E2E_NAMESPACE)
    kind.kubectl("apply", "-f", "-", input=json.dumps(secret))
    jobs.apply(kind, job)

    def checkpointed() -> list[int] | None:
        committed = _committed(kind)
        together = jobs.all_training_together(kind, NAME, 3)
        return committed if together and len(committed) >= COMMITTED_BEFORE_KILL else None

    committed = poll(checkpointed, JOB_DEADLINE_S, f"{COMMITTED_BEFORE_KILL} checkpoints in the store")
    before = trainer_logs.worlds(_logs(kind))
    pods = jobs.worker_pods(kind, NAME)
    killed_at, since = time.monotonic(), datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kind.kill_containers(pods)
    # The furthest step known reached: rank 0's last progress report may predate the newest commit.
    reported = int((jobs.status(kind, NAME).get("progress") or {}).get("step") or 0)
    step_at_kill = max(reported, committed[-1])

    def resumed() -> trainer_logs.World | None:
        newer = [w for w in trainer_logs.worlds(_logs(kind)) if w.generation > before[-1].generation]
        return newer[0] if newer else None

    world = poll(resumed, JOB_DEADLINE_S, "a new world of the replaced workers")
    resumed_after_s = time.monotonic() - killed_at
    # The operator told the job's rendezvous pod about each killed worker (its token accepted, the
    # NetworkPolicy open to it), whether the rendezvous still counted it as a member or not.
    declared = _declarations(jobs.operator_log(kind, since))
    assert {p["metadata"]["name"] for p in pods} <= declared.keys(), declared
    replaced = {p["metadata"]["uid"] for p in jobs.worker_pods(kind, NAME)}
    assert not replaced & {p["metadata"]["uid"] for p in pods}, "a killed worker's pod is still there"
    # Nothing survived in memory: the state came from the store, at the newest complete checkpoint
    # (one committed after the poll saw the last is at an interval; a world change writes one too).
    assert world.source == "checkpoint", world
    assert committed[-1] <= world.step <= step_at_kill, (world, committed)
    assert world.step in committed or world.step % EVERY == 0, (world, committed)

    final = jobs.wait_phase(kind, NAME, "Succeeded", timeout=2 * JOB_DEADLINE_S)
    steps, _ = poll(lambda: trainer_logs.finished(_logs(kind)), 60, f"{NAME}'s final digest")
    accuracy = final["progress"]["eval"]["metrics"]["accuracy"]
    assert steps == STEPS and accuracy >= target_accuracy(), final["progress"]
    assert final.get("restarts", 0) == 0, "SIGKILLed workers count as preempted, not as failures"
    jobs.record_figures(
        "object_store",
        {
            "committed_before_kill": committed,
            "step_at_kill": step_at_kill,
            "resumed": vars(world),
            "kill_to_new_world_seconds": round(resumed_after_s, 1),
            "declared": declared,
            "accuracy": accuracy,
        },
    )
