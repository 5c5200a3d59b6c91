"""Kueue in the kind cluster, installed as its release install does: `kubectl kustomize` of the pinned
module's config/default (CRDs, RBAC, the manager's Deployment, its webhook Service and
configurations, and internal certificate management, which makes the webhook certificate and
injects its CA), applied with these changes (`in_cluster`, pure):
- the image built here from the same binary (hack/kueue/build-image.sh), run on the control-plane
  node (tolerating its taint), so that the workers the tests take away never take the webhooks;
- the ElasticJobsViaWorkloadSlices gate on and only the batch/job integration (the one linked);
  the webhooks kept are those on Kueue's own API group: the job-framework ones (pods, Deployments,
  ...) would call handlers the binary does not have, and every pod creation would fail;
- the visibility API server off (its APIServices dropped: an aggregated API nobody serves breaks
  discovery, and with it namespace deletion).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from ebbflow_devtools.kueue import FEATURE_GATES, on_kueue_objects

NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
CONFIG_KEY = "controller_manager_config.yaml"
CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"
# A kind control-plane node's two cores serve the API server too: the manager asks for little.
REQUESTS = {"cpu": "50m", "memory": "128Mi"}


def in_cluster(rendered: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    """Kueue's rendered release install, changed as the module's docstring says."""
    manifests = []
    for original in rendered:
        manifest = copy.deepcopy(original)
        kind = manifest["kind"]
        if kind == "APIService":
            continue
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            manifest["webhooks"] = [h for h in manifest["webhooks"] if on_kueue_objects(h)]
        elif kind == "ConfigMap" and CONFIG_KEY in manifest.get("data", {}):
            config = yaml.safe_load(manifest["data"][CONFIG_KEY])
            config["integrations"] = {"frameworks": ["batch/job"]}
            manifest["data"][CONFIG_KEY] = yaml.safe_dump(config)
        elif kind == "Deployment" and manifest["metadata"]["name"] == DEPLOYMENT:
            _on_control_plane(manifest["spec"]["template"]["spec"], image)
        manifests.append(manifest)
    return manifests


def _on_control_plane(pod: dict[str, Any], image: str) -> None:
    (manager,) = pod["containers"]
    manager["image"], manager["imagePullPolicy"] = image, "IfNotPresent"
    manager["args"] = [*manager.get("args", []), f"--feature-gates={FEATURE_GATES}"]
    manager["resources"] = {**manager.get("resources", {}), "requests": dict(REQUESTS)}
    pod["nodeSelector"] = {CONTROL_PLANE_ROLE: ""}
    pod["tolerations"] = [{"key": CONTROL_PLANE_ROLE, "operator": "Exists", "effect": "NoSchedule"}]
