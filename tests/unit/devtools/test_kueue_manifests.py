"""Kueue's manifests: beside the local control plane only the webhooks on Kueue's own objects are
registered, each calling the manager on 127.0.0.1 and trusting the plane's CA (ebbflow_devtools.kueue);
in the kind cluster its release install runs our image on the control-plane node, with the elastic
gate on and nothing that calls a handler the binary lacks (ebbflow_devtools.kueue_cluster)."""

from __future__ import annotations

import base64
from typing import Any

import yaml
from ebbflow_devtools.kueue import FEATURE_GATES, cluster_queue, local_webhooks
from ebbflow_devtools.kueue_cluster import CONFIG_KEY, CONTROL_PLANE_ROLE, DEPLOYMENT, in_cluster


def hook(name: str, group: str, resource: str) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "kueue-webhook-service", "path": f"/validate-{resource}"}},
        "rules": [{"apiGroups": [group], "resources": [resource], "operations": ["CREATE"]}],
        "failurePolicy": "Fail",
    }


def test_only_the_webhooks_on_kueues_objects_are_registered_at_the_local_manager() -> None:
    manifests = [
        {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [hook("vjob", "batch", "jobs"), hook("vworkload", "kueue.x-k8s.io", "workloads")],
        },
        {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "pods-only"},
            "webhooks": [hook("mpod", "", "pods")],
        },
    ]
    [local] = local_webhooks(manifests, 9443, b"CA PEM")
    assert local["metadata"] == {"name": "ebbflow-local-validating-webhook-configuration"}
    [workload] = local["webhooks"]
    assert workload["name"] == "vworkload" and workload["failurePolicy"] == "Fail"
    assert workload["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-workloads",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert (
        manifests[0]["webhooks"][1]["clientConfig"]["service"]["name"] == "kueue-webhook-service"
    )  # untouched


def test_a_tests_cluster_queue_admits_its_namespace_alone() -> None:
    queue = cluster_queue("team-t1", 8, "t1")
    assert queue["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "t1"}}
    [group] = queue["spec"]["resourceGroups"]
    quotas = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quotas["nvidia.com/gpu"] == 8 and set(group["coveredResources"]) == set(quotas)


def release_install() -> list[dict[str, Any]]:
    """The parts of Kueue's rendered config/default that `in_cluster` changes or drops."""
    manager = {
        "name": "manager",
        "image": "registry.example/kueue:main",
        "imagePullPolicy": "Always",
        "args": ["--config=/controller_manager_config.yaml"],
        "resources": {
            "limits": {"cpu": "2", "memory": "512Mi"},
            "requests": {"cpu": "500m", "memory": "512Mi"},
        },
    }
    config = {"kind": "Configuration", "integrations": {"frameworks": ["batch/job", "pod", "ray.io/rayjob"]}}
    return [
        {"kind": "Namespace", "metadata": {"name": "kueue-system"}},
        {"kind": "APIService", "metadata": {"name": "v1beta2.visibility.kueue.x-k8s.io"}},
        {
            "kind": "ConfigMap",
            "metadata": {"name": "kueue-manager-config"},
            "data": {CONFIG_KEY: yaml.safe_dump(config)},
        },
        {
            "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT},
            "spec": {"template": {"spec": {"containers": [manager]}}},
        },
        {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "kueue-mutating-webhook-configuration"},
            "webhooks": [hook("mpod", "", "pods"), hook("mworkload", "kueue.x-k8s.io", "workloads")],
        },
    ]


def test_in_the_cluster_kueue_runs_our_image_on_the_control_plane_with_the_elastic_gate_on() -> None:
    rendered = release_install()
    installed = {m["kind"]: m for m in in_cluster(rendered, "ebbflow/kueue:abc")}
    assert "APIService" not in installed and "Namespace" in installed
    pod = installed["Deployment"]["spec"]["template"]["spec"]
    [manager] = pod["containers"]
    assert (manager["image"], manager["imagePullPolicy"]) == ("ebbflow/kueue:abc", "IfNotPresent")
    assert manager["args"][-1] == f"--feature-gates={FEATURE_GATES}"
    assert manager["resources"]["limits"] == {"cpu": "2", "memory": "512Mi"}
    assert manager["resources"]["requests"]["cpu"] == "50m"
    assert pod["nodeSelector"] == {CONTROL_PLANE_ROLE: ""}
    assert pod["tolerations"][0]["key"] == CONTROL_PLANE_ROLE
    config = yaml.safe_load(installed["ConfigMap"]["data"][CONFIG_KEY])
    assert config["integrations"] == {"frameworks": ["batch/job"]} and config["kind"] == "Configuration"
    # The pod webhook would call a handler the binary lacks: every pod creation would fail.
    assert [h["name"] for h in installed["MutatingWebhookConfiguration"]["webhooks"]] == ["mworkload"]
    assert rendered[3]["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/kueue:main"
