"""Loops that close only in real pods: a trainer's exit code and termination message reaching the
operator through the kubelet, and a spec change reaching the trainers through the operator's pod
annotation and the kubelet's downward-API projection.

- A diverging script (a ConfigMap, mounted as a user would): the job ends Failed with reason
  NonFiniteLoss and the trainer's own words; the checkpoint on its volume is the last finite state.
- `kubectl patch` of spec.bandLimit.memoryBudgetMiB: every worker switches to the compression rate
  that fits, at the same step, and the job's status shows it.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import yaml
from ebbflow_api import contract
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import (
    E2E_NAMESPACE,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    TRAINER_IMAGE,
    Kind,
    poll,
)

from . import jobs
from .jobs import JOB_DEADLINE_S

# A learning rate that doubles every step (a warm-up gone wrong): the digits model trains for a few
# steps, then its loss overflows and every step after is non-finite.
DIVERGING_SCRIPT = '''\
"""The digits example with a learning rate that doubles every step: it diverges within 25 steps."""

import torch
from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec


def build() -> TrainingSpec:
    spec = load_spec("/opt/ebbflow/examples/digits/train.py")
    spec.scheduler = torch.optim.lr_scheduler.LambdaLR(spec.optimizer, lambda step: 2.0**step)
    return spec
'''
SCRIPTS_DIR = "/scripts"
# Reads the job's checkpoint with the trainer's own reader (checksum checked) and says its step and
# whether every floating-point value in it is finite.
READ_CHECKPOINT = """
import json, math
from pathlib import Path
import torch
from ebbflow_trainer.launch import state
saved = state.read(Path("/checkpoints") / state.CHECKPOINT_FILE)
tensors = [t for t in saved["model"].values() if t.is_floating_point()]
print(json.dumps({"step": saved["step"], "finite": all(bool(torch.isfinite(t).all()) for t in tensors)}))
"""
# The trainer's termination message: the skipped steps, and the last finite step whose parameters it kept.
DIVERGED = re.compile(r"non-finite for (\d+) consecutive steps \(steps (\d+)-(\d+)\).*after step (\d+)")


def _apply(kind: Kind, manifest: dict[str, Any]) -> None:
    kind.kubectl("-n", E2E_NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(manifest))


def _condition(status: dict[str, Any], kind_of: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind_of), {})


def _diverging_job(kind: Kind) -> dict[str, Any]:
    """One worker running the diverging script from a ConfigMap, its checkpoints on a PVC."""
    _apply(
        kind,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "diverging", "namespace": E2E_NAMESPACE},
            "data": {"train.py": DIVERGING_SCRIPT},
        },
    )
    _apply(kind, _claim("diverging-checkpoints"))
    job = jobs.digits_job("diverging", 1, 1, steps=200, vnode_seconds=0.0, script=f"{SCRIPTS_DIR}/train.py")
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["volumeMounts"].append({"name": "scripts", "mountPath": SCRIPTS_DIR})
    pod["volumes"] = [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "diverging-checkpoints"}},
        {"name": "scripts", "configMap": {"name": "diverging"}},
    ]
    return job


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": E2E_NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }


def _read_checkpoint(kind: Kind, claim: str) -> dict[str, Any]:
    """The checkpoint on `claim`, as a pod of the trainer image reads it after the job ended."""
    reader = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{claim}-reader", "namespace": E2E_NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": copy.deepcopy(RESTRICTED_POD_CONTEXT),
            "containers": [
                {
                    "name": "reader",
                    "image": TRAINER_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", READ_CHECKPOINT],
                    "securityContext": copy.deepcopy(RESTRICTED_CONTAINER_CONTEXT),
                    "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }
    _apply(kind, reader)
    name = reader["metadata"]["name"]

    def finished() -> str | None:
        phase = kind.json("-n", E2E_NAMESPACE, "get", "pod", name)["status"].get("phase")
        assert phase != "Failed", kind.kubectl("-n", E2E_NAMESPACE, "logs", name)
        return phase if phase == "Succeeded" else None

    poll(finished, JOB_DEADLINE_S, "the checkpoint read")
    return dict(json.loads(kind.kubectl("-n", E2E_NAMESPACE, "logs", name).strip().splitlines()[-1]))


def test_a_diverging_script_fails_the_job_with_its_words_and_keeps_the_last_finite_checkpoint(
    kind: Kind, namespace: str, operator: str
) -> None:
    try:
        jobs.apply(kind, _diverging_job(kind))
        final = jobs.wait_phase(kind, "diverging", "Failed")
        failed = _condition(final, "Failed")
        assert failed.get("reason") == "NonFiniteLoss", final
        # What the trainer wrote to its termination message, carried by the kubelet to the pod's
        # status and by the operator to the condition, after the exit code that names the reason.
        (pod,) = jobs.worker_pods(kind, "diverging")
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == contract.EXIT_NONFINITE_LOSS, terminated
        assert terminated["message"] and terminated["message"] in failed["message"], (terminated, failed)
        assert failed["message"].startswith(f"diverging-worker-0 exited {contract.EXIT_NONFINITE_LOSS} ")
        match = DIVERGED.search(failed["message"])
        assert match, failed["message"]
        streak, first_skipped, last_skipped, last_finite = map(int, match.groups())
        assert 0 < last_finite < 25, "the doubling learning rate trains a few steps, then diverges"
        assert streak == 3 and (first_skipped, last_skipped) == (last_finite + 1, last_finite + streak)
        assert final.get("restarts", 0) <= 1, "a diverged job is not restarted"

        # Skipped steps change no parameter: the checkpoint holds those after the last finite step,
        # with the data position after the last skipped one.
        saved = _read_checkpoint(kind, "diverging-checkpoints")
        assert saved == {"step": last_skipped, "finite": True}, saved
    finally:
        # The reader goes now; the worker pod (the namespace fixture deletes it) releases the claim.
        delete = ("-n", E2E_NAMESPACE, "delete", "--ignore-not-found", "--wait=false")
        kind.kubectl(*delete, "pod", "diverging-checkpoints-reader")
        kind.kubectl(*delete, "configmap/diverging", "persistentvolumeclaim/diverging-checkpoints")


def _rate_in_status(kind: Kind, name: str) -> float | None:
    rate = (jobs.status(kind, name).get("progress") or {}).get("compressionRate")
    return None if rate is None else float(rate)


def test_a_patched_memory_budget_changes_the_compression_rate_in_every_pod_and_the_status(
    kind: Kind, namespace: str, operator: str
) -> None:
    # The band-limited digits CNN at 16 samples per virtual node: a worker needs 14.0, 11.0, 8.1 and
    # 4.8 MiB at rates 0, 0.25, 0.5 and 0.75 (examples/jobs/digits-cnn-bandlimit.yaml), so 16 MiB
    # trains the full spectrum and 9 MiB at rate 0.5.
    job = jobs.digits_job(
        "budget", 2, 2, steps=100_000, vnode_seconds=0.05, script=jobs.CNN_SCRIPT, samples_per_virtual_node=16
    )
    job["spec"]["bandLimit"] = {"memoryBudgetMiB": 16, "maxCompressionRate": 0.75}
    jobs.apply(kind, job)
    poll(lambda: jobs.all_training_together(kind, "budget", 2), JOB_DEADLINE_S, "two workers training")
    poll(lambda: _rate_in_status(kind, "budget") == 0.0, JOB_DEADLINE_S, "the full spectrum in the status")
    workers = jobs.running_workers(kind, "budget")

    patch = json.dumps({"spec": {"bandLimit": {"memoryBudgetMiB": 9}}})
    kind.kubectl("-n", E2E_NAMESPACE, "patch", "elastictrainingjob", "budget", "--type=merge", "-p", patch)
    # The operator annotates the pods, the kubelet projects the annotation into the file the trainers
    # read, rank 0 chooses the rate and the step's collective carries it to every worker.
    poll(lambda: _rate_in_status(kind, "budget") == 0.5, JOB_DEADLINE_S, "rate 0.5 in the status")
    for pod in jobs.worker_pods(kind, "budget"):
        budget = pod["metadata"]["annotations"].get(contract.ANNOTATION_MEMORY_BUDGET)
        assert budget == "9", (pod["metadata"]["name"], budget)
    switches = {pod: trainer_logs.rate_switches(jobs.logs(kind, pod)) for pod in workers}
    assert all(s and s[-1].rate == 0.5 and s[-1].previous == 0.0 for s in switches.values()), switches
    assert len({s[-1].step for s in switches.values()}) == 1, f"every worker switches at one step: {switches}"
    assert jobs.running_workers(kind, "budget") == workers, "the rate changes in the running pods"
