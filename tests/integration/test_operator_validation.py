"""The API server itself rejects bad ElasticTrainingJobs (structural schema + CEL), naming the field
and the fix; checked with `kubectl apply --dry-run=server`, as a user would meet them."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from ebbflow_api.contract import API_GROUP, API_VERSION, PLURAL, RENDEZVOUS_PORT
from ebbflow_api.models import GPU_RESOURCE
from ebbflow_devtools.controlplane import ControlPlane

from .conftest import Kube
from .operator_helpers import KUBECTL, REPO

Manifest = dict[str, Any]
EXAMPLE = yaml.safe_load((REPO / "examples" / "jobs" / "resnet-elastic.yaml").read_text())
KUBECTL_TIMEOUT = 60  # seconds for one kubectl call against the local control plane

pytestmark = pytest.mark.usefixtures("crd")


def kubectl_apply(
    plane: ControlPlane, namespace: str, manifest: Manifest
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(plane.kubeconfig),
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            "-f",
            "-",
        ],
        input=yaml.safe_dump(manifest),
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT,
    )


def edit(change: Callable[[Manifest], None]) -> Manifest:
    manifest = copy.deepcopy(EXAMPLE)
    change(manifest)
    return manifest


def spec_set(path: str, value: Any) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        *parents, last = path.split(".")
        node = manifest["spec"]
        for key in parents:
            node = node[key]
        node[last] = value

    return change


def spec_del(path: str) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        *parents, last = path.split(".")
        node = manifest["spec"]
        for key in parents:
            node = node[key]
        del node[last]

    return change


def container(key: str, value: Any = None, delete: bool = False) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        target = manifest["spec"]["template"]["spec"]["containers"][0]
        if delete:
            del target[key]
        else:
            target[key] = value

    return change


def gpus(value: Any) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = value

    return change


def rename(name: str) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        manifest["metadata"]["name"] = name

    return change


BAD = [
    (
        "min-above-max",
        spec_set("replicas", {"min": 9, "max": 8}),
        ["spec.replicas.min must be <= spec.replicas.max"],
    ),
    ("min-zero", spec_set("replicas.min", 0), ["spec.replicas.min", "greater than or equal to 1"]),
    ("min-negative", spec_set("replicas.min", -2), ["spec.replicas.min", "greater than or equal to 1"]),
    (
        "max-zero",
        spec_set("replicas", {"min": 1, "max": 0}),
        ["spec.replicas.max", "greater than or equal to 1"],
    ),
    ("max-absurd", spec_set("replicas.max", 100000), ["spec.replicas.max", "less than or equal to 1024"]),
    ("max-missing", spec_del("replicas.max"), ["spec.replicas.max", "Required"]),
    ("replicas-missing", spec_del("replicas"), ["spec.replicas", "Required"]),
    (
        "virtual-nodes-below-max",
        spec_set("virtualNodes", 4),
        ["spec.virtualNodes must be >= spec.replicas.max"],
    ),
    ("virtual-nodes-zero", spec_set("virtualNodes", 0), ["spec.virtualNodes", "greater than or equal to 1"]),
    ("virtual-nodes-absurd", spec_set("virtualNodes", 10**6), ["spec.virtualNodes", "less than or equal to"]),
    (
        "batch-not-multiple-of-v",
        spec_set("globalBatchSize", 1000),
        ["spec.globalBatchSize must be a multiple"],
    ),
    (
        "batch-not-multiple-of-max",
        lambda m: (spec_del("virtualNodes")(m), spec_set("globalBatchSize", 1001)(m)),
        ["spec.globalBatchSize must be a multiple", "replicas.max when virtualNodes is unset"],
    ),
    ("batch-zero", spec_set("globalBatchSize", 0), ["spec.globalBatchSize", "greater than or equal to 1"]),
    (
        "max-batch-below-batch",
        lambda m: (spec_set("lrScaling", "adascale")(m), spec_set("maxGlobalBatchSize", 8)(m)),
        ["spec.maxGlobalBatchSize must be >= spec.globalBatchSize"],
    ),
    (
        "max-batch-not-multiple-of-v",
        lambda m: (spec_set("lrScaling", "adascale")(m), spec_set("maxGlobalBatchSize", 100001)(m)),
        ["spec.maxGlobalBatchSize must be a multiple"],
    ),
    (
        "max-batch-without-adascale",
        spec_set("maxGlobalBatchSize", 4096),
        ["spec.maxGlobalBatchSize needs spec.lrScaling adascale"],
    ),
    (
        "momentum-correction-without-lr-scaling",
        spec_set("momentumCorrection", True),
        ["spec.momentumCorrection needs spec.lrScaling linear, sqrt or adascale"],
    ),
    (
        "band-limit-rate-one",
        spec_set("bandLimit", {"maxCompressionRate": 1}),
        ["spec.bandLimit.maxCompressionRate", "should be less than 1"],
    ),
    (
        "band-limit-rate-negative",
        spec_set("bandLimit", {"maxCompressionRate": -0.25}),
        ["spec.bandLimit.maxCompressionRate", "greater than or equal to 0"],
    ),
    (
        "band-limit-budget-zero",
        spec_set("bandLimit", {"memoryBudgetMiB": 0}),
        ["spec.bandLimit.memoryBudgetMiB", "greater than or equal to 1"],
    ),
    (
        "batch-negative",
        spec_set("globalBatchSize", -64),
        ["spec.globalBatchSize", "greater than or equal to 1"],
    ),
    ("batch-missing", spec_del("globalBatchSize"), ["spec.globalBatchSize", "Required"]),
    ("batch-not-a-number", spec_set("globalBatchSize", "lots"), ["spec.globalBatchSize", "integer"]),
    (
        "batching-unknown",
        spec_set("batching", "adaptive"),
        ["spec.batching", "Unsupported value", '"dynamic"'],
    ),
    ("lr-scaling-unknown", spec_set("lrScaling", "cubic"), ["spec.lrScaling", "Unsupported value", '"sqrt"']),
    (
        "image-missing",
        container("image", delete=True),
        ["spec.template.spec.containers[0].image", "Required"],
    ),
    ("image-empty", container("image", ""), ["containers[0].image", "at least 1 chars"]),
    (
        "no-containers",
        spec_set("template.spec.containers", []),
        ["spec.template.spec.containers", "at least 1 items"],
    ),
    ("template-missing", spec_del("template"), ["spec.template", "Required"]),
    (
        "several-gpus-per-worker-v-below-max-times-gpus",
        gpus(4),  # 4 GPUs x max 8 needs 32 virtual nodes; the example has 16
        ["a worker with several GPUs runs one training process per GPU", "spec.virtualNodes"],
    ),
    (
        "several-gpus-per-worker-v-unset",
        lambda m: (gpus("2")(m), spec_del("virtualNodes")(m)),
        ["a worker with several GPUs runs one training process per GPU"],
    ),
    ("gpus-absurd", gpus(1000), ["nvidia.com/gpu must be a whole number of GPUs between 0 and 64"]),
    ("gpus-fractional", gpus("0.5"), ["nvidia.com/gpu must be a whole number of GPUs", "time-slicing"]),
    ("checkpoint-interval-zero", spec_set("checkpoint.intervalSteps", 0), ["spec.checkpoint.intervalSteps"]),
    (
        "checkpoint-path-relative",
        spec_set("checkpoint.path", "ckpt/run1"),
        ["spec.checkpoint.path", "should match"],
    ),
    ("checkpoint-path-other-scheme", spec_set("checkpoint.path", "gs://bucket/x"), ["spec.checkpoint.path"]),
    (
        "checkpoint-s3-without-endpoint-and-secret",
        spec_set("checkpoint", {"path": "s3://bucket/run1"}),
        ["spec.checkpoint.path s3://... needs spec.checkpoint.endpoint", "credentialsSecret", "set both"],
    ),
    (
        "checkpoint-s3-bucket-invalid",
        spec_set(
            "checkpoint",
            {"path": "s3://Bad_Bucket/x", "endpoint": "http://s3:8333", "credentialsSecret": "k"},
        ),
        ["spec.checkpoint.path must be s3://<bucket>[/<prefix>]", "fix the bucket name"],
    ),
    (
        "checkpoint-endpoint-on-a-volume-path",
        spec_set("checkpoint", {"path": "/checkpoints", "endpoint": "http://s3:8333"}),
        ["apply to an s3:// path only"],
    ),
    (
        "checkpoint-secret-not-a-name",
        spec_set(
            "checkpoint", {"path": "s3://bucket/x", "endpoint": "http://s3:8333", "credentialsSecret": "A_b"}
        ),
        ["spec.checkpoint.credentialsSecret"],
    ),
    (
        "max-restarts-negative",
        spec_set("maxRestarts", -1),
        ["spec.maxRestarts", "greater than or equal to 0"],
    ),
    ("priority-absurd", spec_set("priority", 10**9), ["spec.priority", "less than or equal to 1000000"]),
    ("leave-grace-zero", spec_set("leaveGraceSeconds", 0), ["spec.leaveGraceSeconds"]),
    (
        "clean-pod-policy-unknown",
        spec_set("cleanPodPolicy", "Some"),
        ["spec.cleanPodPolicy", "Unsupported value"],
    ),
    ("rendezvous-port-out-of-range", spec_set("rendezvous", {"port": 70000}), ["spec.rendezvous.port"]),
    ("unknown-field", spec_set("replica", 3), ['unknown field "spec.replica"']),
    ("name-too-long", rename("a" * 41), ["metadata.name must be at most 40 characters", "shorter name"]),
    ("name-not-dns-1035", rename("1job"), ["metadata.name must start with a letter"]),
]


@pytest.mark.parametrize(("change", "expected"), [pytest.param(c, e, id=i) for i, c, e in BAD])
def test_bad_manifest_is_rejected_by_the_api_server(
    control_plane: ControlPlane, namespace: str, change: Callable[[Manifest], None], expected: list[str]
) -> None:
    result = kubectl_apply(control_plane, namespace, edit(change))
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert "is invalid" in result.stderr or "Error from server" in result.stderr, result.stderr
    for text in expected:
        assert text in result.stderr, f"{text!r} not in {result.stderr}"


@pytest.mark.parametrize("example", sorted((REPO / "examples" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_accepted_and_defaulted(
    control_plane: ControlPlane, namespace: str, example: Any
) -> None:
    manifest = yaml.safe_load(example.read_text())
    result = subprocess.run(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            "-o",
            "yaml",
            "-f",
            str(example),
        ],
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    applied = yaml.safe_load(result.stdout)
    assert applied["spec"]["replicas"] == manifest["spec"]["replicas"]
    assert applied["spec"]["rendezvous"]["port"] == RENDEZVOUS_PORT
    assert applied["spec"]["cleanPodPolicy"] == "Running"


def test_kubectl_scale_moves_max_and_validation_still_applies(
    control_plane: ControlPlane, namespace: str, kube: Kube
) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    kube.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, manifest)

    def scale(replicas: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(KUBECTL),
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "-n",
                namespace,
                "scale",
                "etj/resnet-elastic",
                f"--replicas={replicas}",
            ],
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT,
        )

    scaled = scale(12)
    assert scaled.returncode == 0, scaled.stderr
    job = kube.custom.get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, "resnet-elastic"
    )
    assert job["spec"]["replicas"] == {"min": 2, "max": 12}
    too_far = scale(20)
    assert too_far.returncode != 0 and "spec.virtualNodes must be >= spec.replicas.max" in too_far.stderr


def test_kubectl_get_shows_workers_phase_step_and_loss(
    control_plane: ControlPlane, namespace: str, kube: Kube
) -> None:
    """README's `kubectl get etj -w`: the columns it promises, filled from the status the operator
    writes (the printer columns are the API server's, from the CRD)."""
    kube.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, EXAMPLE)
    status = {"phase": "Running", "desiredReplicas": 3, "readyReplicas": 2}
    status["progress"] = {"step": 120, "loss": 0.25}
    kube.custom.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, PLURAL, "resnet-elastic", {"status": status}
    )
    get = ["get", "etj", "resnet-elastic"]
    result = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(control_plane.kubeconfig), "-n", namespace, *get],
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    header, row = (line.split() for line in result.stdout.splitlines())
    assert header == ["NAME", "MIN", "MAX", "DESIRED", "READY", "PHASE", "STEP", "LOSS", "AGE"]
    assert row[:-1] == ["resnet-elastic", "2", "8", "3", "2", "Running", "120", "0.25"]
