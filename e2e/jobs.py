"""Jobs on the kind cluster for the e2e tests: the digits example as an ElasticTrainingJob with the CPU
trainer image, and kubectl reads of the job, its pods and their logs. Every job runs in the e2e
namespace, where the chart gave workers the trainers' ServiceAccount (progress annotation)."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from ebbflow_api.contract import API_GROUP, API_VERSION, LABEL_JOB_NAME
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.kind import (
    E2E_NAMESPACE,
    REPO,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    SHARED_VOLUMES,
    TRAINER_IMAGE,
    Kind,
    KindError,
    poll,
)

JOB_DEADLINE_S = 420
# Each scenario's figures, for the issue notes and docs.
FIGURES = REPO / ".cluster" / "e2e"
# Device time simulated per virtual node, so that a run lasts long enough to disturb (the CPU computes
# a digits step in milliseconds).
SCRIPT = "/opt/ebbflow/examples/digits/train.py"
CNN_SCRIPT = "/opt/ebbflow/examples/digits_cnn/train.py"  # band-limited convolutions (spec.bandLimit)


def digits_job(
    name: str,
    lo: int,
    hi: int,
    steps: int,
    vnode_seconds: float,
    *,
    gpus: int = 1,
    virtual_nodes: int = 4,
    node: str | None = None,
    priority: int | None = None,
    script: str = SCRIPT,
    samples_per_virtual_node: int = 64,
    queue: str | None = None,
) -> dict[str, Any]:
    """The digits example (or another `script` in the image), B = 64 samples per virtual node unless
    told otherwise, with progress reported every second; submitted to Kueue's LocalQueue `queue`."""
    builder = JobBuilder(name, E2E_NAMESPACE).replicas(lo, hi).gpus(gpus)
    batch = samples_per_virtual_node * virtual_nodes
    builder = builder.set(virtualNodes=virtual_nodes, globalBatchSize=batch)
    if node is not None:
        builder = builder.node_selector({"kubernetes.io/hostname": node})
    if priority is not None:
        builder = builder.priority(priority)
    if queue is not None:
        builder = builder.queue(queue)
    job = builder.obj()
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = TRAINER_IMAGE, "IfNotPresent"
    container["command"] = ["ebbflow-train", "run", script, "--steps", str(steps), "--progress-interval", "1"]
    container["command"] += ["--simulated-vnode-seconds", str(vnode_seconds)]
    container["volumeMounts"] = [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    container["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER_CONTEXT)
    pod = job["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "checkpoints", "emptyDir": {}}]
    pod["securityContext"] = copy.deepcopy(RESTRICTED_POD_CONTEXT)  # the namespace enforces `restricted`
    return job


def example(name: str) -> list[dict[str, Any]]:
    """The manifests of examples/`name`."""
    return list(yaml.safe_load_all((REPO / "examples" / name).read_text()))


@contextmanager
def shared_claim(kind: Kind, claim: str, job_dirs: tuple[str, ...]) -> Iterator[Path]:
    """examples/volumes/shared-checkpoints.yaml under the name `claim` (a hostPath volume on every
    worker's /shared/volumes, Retain: a claim bound once is not bound again), `job_dirs` under it
    removed first; yields the host's side of the volume. Afterwards the namespace's jobs go (their
    pods hold the claim), then the claim and its volume."""
    volume, pvc = example("volumes/shared-checkpoints.yaml")
    volume["metadata"]["name"] = f"ebbflow-{claim}"
    pvc["metadata"]["name"], pvc["spec"]["volumeName"] = claim, volume["metadata"]["name"]
    for job in job_dirs:
        shutil.rmtree(SHARED_VOLUMES / job, ignore_errors=True)
    kind.kubectl("-n", E2E_NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump_all([volume, pvc]))
    yield SHARED_VOLUMES
    for what in (("elastictrainingjobs", "--all"), ("persistentvolumeclaim", claim)):
        _delete(kind, "-n", E2E_NAMESPACE, *what)
    _delete(kind, "persistentvolume", volume["metadata"]["name"])


def _delete(kind: Kind, *args: str) -> None:
    kind.kubectl("delete", *args, "--ignore-not-found", "--wait=true", timeout=180)


def record_figures(scenario: str, figures: dict[str, Any]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{scenario}.json").write_text(json.dumps(figures, indent=2) + "\n")


def apply(kind: Kind, job: dict[str, Any]) -> None:
    kind.kubectl("-n", E2E_NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(job))


def status(kind: Kind, name: str) -> dict[str, Any]:
    job = kind.api.custom_object(f"{API_GROUP}/{API_VERSION}", E2E_NAMESPACE, "elastictrainingjobs", name)
    return dict(job.get("status") or {})


def remove(kind: Kind, *names: str) -> None:
    """Delete the jobs, then give their pods one second to stop, as the namespace fixture does at a
    test's end (a graceful leave would hand a state over to nobody)."""
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjobs", *names, timeout=300)
    selector = f"{LABEL_JOB_NAME} in ({','.join(names)})"
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "pods", "-l", selector, "--grace-period=1", "--wait=false")


def describe(kind: Kind) -> str:
    return kind.kubectl("-n", E2E_NAMESPACE, "get", "pods,elastictrainingjob", "-o", "wide")


def wait_phase(kind: Kind, name: str, phase: str, timeout: float = JOB_DEADLINE_S) -> dict[str, Any]:
    """The job's status once it reaches `phase`; fails at once when it fails instead."""

    def reached() -> dict[str, Any] | None:
        current = status(kind, name)
        assert current.get("phase") != "Failed" or phase == "Failed", f"job failed: {describe(kind)}"
        return current if current.get("phase") == phase else None

    return poll(reached, timeout, f"job {name} {phase}")


def worker_pods(kind: Kind, name: str) -> list[dict[str, Any]]:
    pods = kind.api.pods(E2E_NAMESPACE, f"ebbflow.dev/job-name={name}")
    return [p for p in pods if p["metadata"]["name"].startswith(f"{name}-worker-")]


def running_workers(kind: Kind, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in worker_pods(kind, name) if p["status"]["phase"] == "Running"]


def logs(kind: Kind, pod: str) -> str:
    try:
        return kind.api.log(E2E_NAMESPACE, pod)
    except KindError:
        return ""  # not started yet, or gone


def resumptions(kind: Kind, pod: str) -> list[trainer_logs.Resumption]:
    return trainer_logs.resumptions(logs(kind, pod))


def exit_codes(pods: list[dict[str, Any]]) -> list[int]:
    return [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in pods]


def all_training_together(kind: Kind, name: str, size: int) -> bool:
    """`size` workers running, each of which last joined a world of `size`."""
    running = running_workers(kind, name)
    latest = [resumptions(kind, pod) for pod in running]
    return len(running) == size and all(r and r[-1].world_size == size for r in latest)
