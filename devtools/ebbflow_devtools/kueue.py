"""Kueue's manager beside a local control plane (the integration tier's), and the queue objects the
tests build on it.

`start_kueue` installs the pinned Kueue's CRDs (`make tools` copies the module's config/ tree, with
its webhook configurations, next to the binaries), writes the manager's Configuration and starts it as one
more component of the plane: no leader election and no internal certificate management (its webhook
server serves the plane's own 127.0.0.1 certificate), the ElasticJobsViaWorkloadSlices gate on.
Once the manager is ready, Kueue's own webhooks on its API group (Workloads, ClusterQueues,
ResourceFlavors, Cohorts) are registered with the API server at that address, so every Workload the
operator writes is defaulted and validated by Kueue's code; the job-framework webhooks (Jobs,
pods) are not, as the manager runs no such integration here. The plane's `stop` stops it too.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ebbflow_devtools.controlplane import DEFAULT_TOOLS_BIN, ControlPlane, ControlPlaneError
from ebbflow_devtools.ports import free_ports

# The visibility API server (on by default) wants its own certificate in /visibility: not needed here.
FEATURE_GATES = "ElasticJobsViaWorkloadSlices=true,VisibilityOnDemand=false"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
NAMESPACE = "kueue-system"  # Kueue's own namespace (its events and, with it on, leader election)


def manifests_dir(tools_bin: Path = DEFAULT_TOOLS_BIN) -> Path:
    """The pinned module's config/ tree (hack/build-tools.sh kueue)."""
    return tools_bin.parent / "kueue" / "config"


def webhook_manifests(manifests: Path) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, as its release install names them before kustomize's prefix."""
    text = (manifests / "components" / "webhook" / "manifests.yaml").read_text()
    return [m for m in yaml.safe_load_all(text) if m]


def missing(tools_bin: Path = DEFAULT_TOOLS_BIN) -> str | None:
    """Why Kueue cannot start here (None when it can)."""
    manifests = manifests_dir(tools_bin)
    if not (tools_bin / "kueue").exists() or not (manifests / "components" / "webhook").is_dir():
        return f"Kueue is not built in {tools_bin}: run `make tools TOOLS=kueue`"
    return None


def local_webhooks(manifests: list[dict[str, Any]], port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations cut to the webhooks on its own API group, each calling the
    manager at 127.0.0.1:`port` (the path its Service would have served), trusting `ca_bundle`."""
    local = []
    for original in manifests:
        manifest = copy.deepcopy(original)
        hooks = [h for h in manifest.get("webhooks") or [] if on_kueue_objects(h)]
        if not hooks:
            continue
        manifest["metadata"] = {"name": f"ebbflow-local-{manifest['metadata']['name']}"}
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        manifest["webhooks"] = hooks
        local.append(manifest)
    return local


def on_kueue_objects(hook: dict[str, Any]) -> bool:
    """A webhook on Kueue's own objects (Workloads, queues, flavors), not on a job framework's."""
    return all(group == KUEUE_GROUP for rule in hook.get("rules") or [] for group in rule["apiGroups"])


def configuration(health_port: int, metrics_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
    }


def start_kueue(
    plane: ControlPlane,
    apply: Callable[[dict[str, Any]], object],
    tools_bin: Path = DEFAULT_TOOLS_BIN,
    timeout: float = 90.0,
) -> None:
    """Installs Kueue's CRDs and its namespace through `apply(manifest)` (create or replace, waiting
    until served), starts the manager as a component of `plane`, then registers its webhooks."""
    reason = missing(tools_bin)
    if reason:
        raise ControlPlaneError(reason)
    manifests = manifests_dir(tools_bin)
    for path in sorted((manifests / "components" / "crd" / "bases").glob("*.yaml")):
        apply(yaml.safe_load(path.read_text()))
    apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    root = plane.workdir / "kueue"
    cert_dir = root / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(plane.workdir / "pki" / "server.crt", cert_dir / "tls.crt")
    shutil.copy(plane.workdir / "pki" / "server.key", cert_dir / "tls.key")
    env = {**os.environ, "KUEUE_METRICS_CERT_DIR": str(cert_dir)}  # hack/tools/kueue/go.mod
    health, metrics, webhook = free_ports(3)
    config_file = root / "config.yaml"
    config_file.write_text(yaml.safe_dump(configuration(health, metrics, webhook, cert_dir)))
    command = [
        str(tools_bin / "kueue"),
        f"--config={config_file}",
        f"--feature-gates={FEATURE_GATES}",
        f"--kubeconfig={plane.kubeconfig}",
    ]
    plane.start_component("kueue", command, env)
    plane.await_http("Kueue's manager ready", f"http://127.0.0.1:{health}/readyz", timeout)
    webhooks = webhook_manifests(manifests)
    ca_bundle = (plane.workdir / "pki" / "ca.crt").read_bytes()
    for manifest in local_webhooks(webhooks, webhook, ca_bundle):
        apply(manifest)


def resource_flavor(name: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
    }


def cluster_queue(
    name: str, gpus: int, namespace: str, flavor: str = "default", preemption: str = "LowerPriority"
) -> dict[str, Any]:
    """A ClusterQueue of `gpus` GPUs (and room for the pods' CPU and memory) for `namespace` alone,
    that preempts lower priorities within itself."""
    quotas: dict[str, int | str] = {"nvidia.com/gpu": gpus, "cpu": 1000, "memory": "10Ti"}
    resources = [{"name": name, "nominalQuota": quota} for name, quota in quotas.items()]
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"withinClusterQueue": preemption},
            "resourceGroups": [
                {
                    "coveredResources": list(quotas),
                    "flavors": [{"name": flavor, "resources": resources}],
                }
            ],
        },
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }
