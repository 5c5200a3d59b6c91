"""ElasticTrainingJobs on the kind cluster, for the e2e tier and the benchmarks that run there: the
digits example with the CPU trainer image under the restricted Pod Security Standard, and a shared
volume for checkpoints and journals that every worker mounts (examples/volumes). Every job runs in
the e2e namespace unless told otherwise, where the chart gave workers the trainers' ServiceAccount
(progress annotation)."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from ebbflow_api.models import Checkpoint

from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.kind import (
    E2E_NAMESPACE,
    REPO,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    SHARED_VOLUMES,
    TRAINER_IMAGE,
    Kind,
)

CHECKPOINTS = Checkpoint().path  # the API's default: where the jobs here mount their checkpoint volume
JOURNAL = "journal.jsonl"  # every worker's journal, in the job's directory of the shared volume
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
    told otherwise, with progress reported every second; submitted to Kueue's LocalQueue `queue`.
    `vnode_seconds`: device time simulated per virtual node, so that a run lasts long enough to
    disturb (the CPU computes a digits step in milliseconds)."""
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
    container["volumeMounts"] = [{"name": "checkpoints", "mountPath": CHECKPOINTS}]
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


def on_shared_volume(
    job: dict[str, Any], claim: str, directory: str, checkpoint_every: int
) -> dict[str, Any]:
    """`job` with its durable checkpoint and every worker's journal (one file, `journal.jsonl`) in
    `directory` of the shared volume claimed as `claim` (`shared_claim`; `make_shared_dir` makes it)."""
    job = copy.deepcopy(job)
    job["spec"]["checkpoint"] = {"path": CHECKPOINTS, "intervalSteps": checkpoint_every}
    pod = job["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}]
    container = pod["containers"][0]
    container["volumeMounts"] = [{"name": "checkpoints", "mountPath": CHECKPOINTS, "subPath": directory}]
    container["command"] = [*container["command"], "--journal", f"{CHECKPOINTS}/{JOURNAL}"]
    return job


def make_shared_dir(shared: Path, directory: str) -> Path:
    """`directory` of the shared volume (the host's side), emptied, writable by the trainer's user."""
    path = shared / directory
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    os.chmod(path, 0o777)
    return path


def read_journal(directory: Path) -> list[dict[str, Any]]:
    """Every worker's journal events (one file for all), in time order; a half-written last line is
    left out."""
    path = directory / JOURNAL
    lines = path.read_text().splitlines() if path.exists() else []
    return sorted((json.loads(line) for line in lines if line.endswith("}")), key=lambda e: e["time"])
