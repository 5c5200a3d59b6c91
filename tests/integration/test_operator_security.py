"""What keeps other pods out of a job, against the real API server: each job's NetworkPolicy (owned
by the job, put back when deleted), and the real PodSecurity admission of a namespace that enforces
the `restricted` standard, which admits the operator's rendezvous pod and the examples' workers.

Whether the NetworkPolicy is enforced depends on the network plugin, which this control plane does
not have (KWOK pods have no network): the objects are checked here."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ebbflow_api import contract
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.model import parse_job
from ebbflow_operator.decision.plan import PlannerConfig
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .conftest import REPO, GpuNodes, Kube
from .operator_helpers import (
    GROUP,
    KUBECTL,
    PLURAL,
    SETTLE,
    VERSION,
    OperatorProcess,
    create_job,
    events,
    get_job,
    job_manifest,
    running_operator,
    settled,
    status,
)

pytestmark = pytest.mark.usefixtures("crd")

EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.yaml"))
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@pytest.fixture
def operator(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[OperatorProcess]:
    with running_operator(control_plane, namespace, gpu_nodes.selector, tmp_path / "operator.log") as process:
        yield process
        print(process.log())  # shown by pytest when the test failed


def network_policy(kube: Kube, namespace: str, job: str) -> client.V1NetworkPolicy | None:
    try:
        return client.NetworkingV1Api(kube.api).read_namespaced_network_policy(
            manifests.network_policy_name(job), namespace
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def restricted_template(manifest: dict[str, Any]) -> dict[str, Any]:
    """The job's worker template made to pass the `restricted` standard, as the examples do."""
    spec = manifest["spec"]["template"]["spec"]
    spec["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    for container in spec["containers"]:
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return manifest


def test_each_job_gets_its_network_policy_and_gets_it_back_when_deleted(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    gpu_nodes.add(1)
    create_job(kube, namespace, job_manifest("fenced", 1, 2, gpu_nodes.selector))
    wait_for(lambda: settled(kube, namespace, "fenced", 2), SETTLE, "2 workers")
    policy = wait_for(lambda: network_policy(kube, namespace, "fenced"), SETTLE, "the job's NetworkPolicy")
    uid = get_job(kube, namespace, "fenced")["metadata"]["uid"]
    assert [(o.kind, o.uid, o.controller) for o in policy.metadata.owner_references] == [
        ("ElasticTrainingJob", uid, True)
    ]
    job_pods = {contract.LABEL_JOB_NAME: "fenced"}
    assert policy.spec.pod_selector.match_labels == job_pods
    assert policy.spec.policy_types == ["Ingress"]
    own, metrics, declarations = policy.spec.ingress
    assert [peer.pod_selector.match_labels for peer in own._from] == [job_pods] and own.ports is None
    assert metrics._from is None and [p.port for p in metrics.ports] == [contract.METRICS_PORT]
    assert declarations._from is None and [p.port for p in declarations.ports] == [contract.DECLARATIONS_PORT]

    client.NetworkingV1Api(kube.api).delete_namespaced_network_policy(policy.metadata.name, namespace)

    def recreated() -> client.V1NetworkPolicy | None:
        found = network_policy(kube, namespace, "fenced")
        return found if found is not None and found.metadata.uid != policy.metadata.uid else None

    wait_for(recreated, SETTLE, "the deleted NetworkPolicy put back")


def test_a_restricted_namespace_admits_the_rendezvous_pod_and_compliant_workers(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, operator: OperatorProcess
) -> None:
    kube.core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    gpu_nodes.add(1)
    # A template that does not meet the standard: the API server refuses its workers, and only them;
    # the job's status says so, names what to change, and the operator tries again only after its
    # back-off (it used to re-plan at once, a new world generation and a refused pod each time, about
    # ten times a second).
    create_job(kube, namespace, job_manifest("careless", 1, 1, gpu_nodes.selector))
    refused = wait_for(lambda: _refused(kube, namespace, "careless"), SETTLE, "a careless worker refused")
    assert "PodSecurity" in refused["message"] and "spec.template" in refused["message"], refused
    reported = events(kube, namespace, "careless", "ReconcileError")
    assert any("PodSecurity" in (e.message or "") for e in reported)
    rendezvous = manifests.rendezvous_name("careless")
    assert kube.core.read_namespaced_pod(rendezvous, namespace).metadata.name == rendezvous
    generation, since = status(kube, namespace, "careless")["worldGeneration"], time.monotonic()

    # The careful job's passes (its pods, its status) are passes over the careless job too.
    create_job(kube, namespace, restricted_template(job_manifest("careful", 1, 2, gpu_nodes.selector)))
    wait_for(lambda: settled(kube, namespace, "careful", 2), SETTLE, "2 workers admitted and running")
    kube.core.read_namespaced_pod(manifests.rendezvous_name("careful"), namespace)
    retries = (time.monotonic() - since) // PlannerConfig().refusal_backoff + 1
    assert status(kube, namespace, "careless")["worldGeneration"] <= generation + retries
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "careless")


def _refused(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The job's Schedulable condition once it says a worker was refused."""
    conditions = status(kube, namespace, name).get("conditions", [])
    refused = (c for c in conditions if c["type"] == "Schedulable" and c["reason"] == "WorkerRefused")
    return next(refused, None)


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_examples_worker_pods_pass_the_restricted_standard(
    kube: Kube, control_plane: ControlPlane, namespace: str, example: Path
) -> None:
    """The pods the operator would create for the example, dry-run through the API server's
    PodSecurity admission in a restricted namespace (no operator needed)."""
    kube.core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    manifest = yaml.safe_load(example.read_text())
    created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    job = parse_job(created)  # as the API server defaulted it
    for pod in (manifests.worker_pod(job, 0, world_generation=1), manifests.rendezvous_pod(job)):
        answer = subprocess.run(
            [
                str(KUBECTL),
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "create",
                "--dry-run=server",
                "-f",
                "-",
            ],
            input=json.dumps(pod),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.returncode == 0, f"{pod['metadata']['name']} refused: {answer.stderr}"
