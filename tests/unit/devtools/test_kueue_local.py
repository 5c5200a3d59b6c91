"""Kueue beside the local control plane: only the webhooks on Kueue's own objects are registered,
each calling the manager on 127.0.0.1 and trusting the plane's CA (ebbflow_devtools.kueue)."""

from __future__ import annotations

import base64
from typing import Any

from ebbflow_devtools.kueue import cluster_queue, local_webhooks


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
