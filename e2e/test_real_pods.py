"""The operator and the trainer together on real pods: a job trains to the end on real containers
across the kind workers (time-sliced fake GPUs); a worker deleted mid-run leaves through SIGTERM at
a step boundary and no step is lost."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml
from ebbflow_api.builders import JobBuilder
from ebbflow_api.waiting import wait_for

from .conftest import TRAINER_IMAGE, WORKERS, Kind

JOB_DEADLINE_S = 420
# The digits example with device time simulated per virtual node, so a run lasts long enough to
# disturb (the CPU computes a step in milliseconds).
SCRIPT = "/opt/ebbflow/examples/digits/train.py"
RESUMED = re.compile(
    r"generation (\d+): rank (\d+) of (\d+) resumes at step (\d+) from (\w+)(?:, (\d+) step)?"
)


def _job(name: str, lo: int, hi: int, steps: int, vnode_seconds: float, **spec: Any) -> dict[str, Any]:
    job = JobBuilder(name).replicas(lo, hi).gpus(1).set(virtualNodes=4, globalBatchSize=256, **spec).obj()
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = TRAINER_IMAGE, "IfNotPresent"
    container["command"] = ["ebbflow-train", "run", SCRIPT, "--steps", str(steps)]
    container["command"] += ["--simulated-vnode-seconds", str(vnode_seconds)]
    container["volumeMounts"] = [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "checkpoints", "emptyDir": {}}]
    return job


def _apply(kind: Kind, namespace: str, job: dict[str, Any]) -> None:
    kind.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(job))


def _phase(kind: Kind, namespace: str, name: str) -> str:
    return str(kind.json("-n", namespace, "get", "elastictrainingjob", name).get("status", {}).get("phase"))


def _wait_phase(kind: Kind, namespace: str, name: str, phase: str) -> None:
    def reached() -> bool:
        current = _phase(kind, namespace, name)
        assert current != "Failed" or phase == "Failed", f"job failed: {_describe(kind, namespace)}"
        return current == phase

    wait_for(reached, JOB_DEADLINE_S, f"job {name} {phase}")


def _describe(kind: Kind, namespace: str) -> str:
    return kind.kubectl("-n", namespace, "get", "pods,elastictrainingjob", "-o", "wide")


def _worker_pods(kind: Kind, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = kind.json("-n", namespace, "get", "pods", "-l", f"ebbflow.dev/job-name={name}")["items"]
    return [p for p in pods if p["metadata"]["name"].startswith(f"{name}-worker-")]


def _logs(kind: Kind, namespace: str, pod: str) -> str:
    try:
        return kind.kubectl("-n", namespace, "logs", pod)
    except RuntimeError:
        return ""


def _resumptions(log: str) -> list[tuple[int, int, int, int, str, int | None]]:
    return [
        (int(g), int(r), int(w), int(s), source, int(lost) if lost else None)
        for g, r, w, s, source, lost in RESUMED.findall(log)
    ]


def test_a_job_trains_to_the_end_on_real_pods(
    kind: Kind, namespace: str, operator: subprocess.Popen[bytes]
) -> None:
    _apply(kind, namespace, _job("digits", 1, 3, steps=60, vnode_seconds=0.0))
    _wait_phase(kind, namespace, "digits", "Succeeded")
    pods = _worker_pods(kind, namespace, "digits")
    assert pods and all(p["status"]["phase"] == "Succeeded" for p in pods), _describe(kind, namespace)
    assert {p["spec"]["nodeName"] for p in pods} <= set(WORKERS)
    exits = [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in pods]
    assert exits == [0] * len(pods)
    worlds = [r[2] for p in pods for r in _resumptions(_logs(kind, namespace, p["metadata"]["name"]))]
    assert worlds and max(worlds) >= 2, "no worker trained in a world of several pods"
    # cleanPodPolicy Running: the finished job's rendezvous pod is gone, its workers stay for their logs.
    assert not kind.json("-n", namespace, "get", "pods", "-l", "ebbflow.dev/role=rendezvous")["items"]


def _running_workers(kind: Kind, namespace: str, name: str) -> list[str]:
    pods = _worker_pods(kind, namespace, name)
    return [p["metadata"]["name"] for p in pods if p["status"]["phase"] == "Running"]


def test_a_deleted_worker_leaves_by_sigterm_and_no_step_is_lost(
    kind: Kind, namespace: str, operator: subprocess.Popen[bytes]
) -> None:
    _apply(kind, namespace, _job("leave", 1, 3, steps=1500, vnode_seconds=0.05))

    def three_training() -> bool:
        running = _running_workers(kind, namespace, "leave")
        logs = [_resumptions(_logs(kind, namespace, pod)) for pod in running]
        return len(running) == 3 and all(r and r[-1][2] == 3 for r in logs)

    wait_for(three_training, JOB_DEADLINE_S, "three workers training together")
    running = _running_workers(kind, namespace, "leave")
    ranks = {pod: _resumptions(_logs(kind, namespace, pod))[-1][1] for pod in running}
    victim = next(pod for pod, rank in ranks.items() if rank != 0)
    survivors = [pod for pod in running if pod != victim]
    kind.kubectl("-n", namespace, "delete", "pod", victim, timeout=120)  # default grace: SIGTERM first

    def reformed() -> bool:
        return any(r[2] == 2 for pod in survivors for r in _resumptions(_logs(kind, namespace, pod)))

    wait_for(reformed, JOB_DEADLINE_S, "the survivors to re-form a world of two")
    resumed = [r for pod in survivors for r in _resumptions(_logs(kind, namespace, pod)) if r[2] == 2]
    first = min(r[0] for r in resumed)
    sources = {r[4] for r in resumed if r[0] == first}
    assert sources <= {"memory", "peer"} and "memory" in sources, resumed
    lost = [r[5] for r in resumed if r[0] == first and r[1] == 0]
    assert lost == [0], f"rank 0 of the new world reports lost steps: {resumed}"
    _wait_phase(kind, namespace, "leave", "Succeeded")
