"""SeaweedFS as the kind cluster's object store, where the e2e tier's jobs keep their checkpoints: one
`weed server` (master, volume server, filer and S3 gateway in one process) in the namespace
NAMESPACE, its S3 gateway behind the Service `seaweedfs`, which workers reach at ENDPOINT. The
manifests are pure (`manifests`); `kind.apply_object_store` applies them. Invariants:
- the store runs on the control-plane node (tolerating its taint): a worker node taken away never
  takes it; its data lives on an emptyDir, as long as the cluster's set-up;
- one identity (ACCESS_KEY, SECRET_KEY) may do every S3 action; the gateway reads it from a Secret
  (`s3_config`, also the trainer tier's local store's), and `credentials_secret` gives a job's
  namespace the same identity under the names spec.checkpoint.credentialsSecret asks for;
- the pod passes the `restricted` Pod Security Standard (hack/seaweedfs's image runs as 65534);
- buckets are made by `weed shell` inside the pod (`bucket_command`): the S3 port is not reachable
  from outside the cluster.
"""

from __future__ import annotations

import json
from typing import Any

from ebbflow_devtools.kueue_cluster import CONTROL_PLANE_ROLE

NAMESPACE, SERVICE, S3_PORT = "object-store", "seaweedfs", 8333
ENDPOINT = f"http://{SERVICE}.{NAMESPACE}.svc:{S3_PORT}"
ACCESS_KEY, SECRET_KEY = "ebbflow-test", "ebbflow-test-secret"
CONFIG_SECRET, CONFIG_DIR = "seaweedfs-s3-config", "/etc/seaweedfs"
# Beside Kueue's manager on the control-plane node, whose two cores serve the API server too.
REQUESTS = {"cpu": "50m", "memory": "128Mi"}
LABELS = {"app.kubernetes.io/name": SERVICE}
USER = 65534  # hack/images/import-binary.sh: the image's user


def s3_config(access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, Any]:
    """The S3 gateway's -s3.config: one identity allowed every action."""
    credentials = [{"accessKey": access_key, "secretKey": secret_key}]
    actions = ["Admin", "Read", "Write", "List", "Tagging"]
    return {"identities": [{"name": "ebbflow", "credentials": credentials, "actions": actions}]}


def server_arguments() -> list[str]:
    """`weed server` in the pod: every component on loopback inside it, only the S3 gateway bound to
    the pod's address for the Service."""
    return [
        "server",
        "-dir=/data",
        "-ip=127.0.0.1",
        "-ip.bind=0.0.0.0",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=256",
        # Each bucket is a collection that takes 7 volumes at its first write: 0, as many as fit.
        "-volume.max=0",
        "-s3",
        f"-s3.port={S3_PORT}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={CONFIG_DIR}/s3.json",
    ]


def manifests(image: str) -> list[dict[str, Any]]:
    """The namespace, the gateway's identity, the store's Deployment and its Service."""
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}}
    config = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CONFIG_SECRET, "namespace": NAMESPACE},
        "stringData": {"s3.json": json.dumps(s3_config())},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"selector": LABELS, "ports": [{"name": "s3", "port": S3_PORT, "targetPort": S3_PORT}]},
    }
    return [namespace, config, _deployment(image), service]


def _deployment(image: str) -> dict[str, Any]:
    container = {
        "name": "weed",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": server_arguments(),
        "ports": [{"name": "s3", "containerPort": S3_PORT}],
        "readinessProbe": {"tcpSocket": {"port": S3_PORT}, "periodSeconds": 2},
        "resources": {"requests": dict(REQUESTS)},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }
    pod = {
        "containers": [container],
        "nodeSelector": {CONTROL_PLANE_ROLE: ""},
        "tolerations": [{"key": CONTROL_PLANE_ROLE, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [
            {"name": "data", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "config", "secret": {"secretName": CONFIG_SECRET}},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one store on one emptyDir: never two at once
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS}, "spec": pod},
        },
    }


def credentials_secret(name: str, namespace: str) -> dict[str, Any]:
    """The store's identity as a job's spec.checkpoint.credentialsSecret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }


def bucket_command(bucket: str) -> tuple[list[str], str]:
    """The command run in the store's container and its standard input that make `bucket` (weed
    shell prints `created bucket`; for an existing one it fails with `already exists`)."""
    return ["/weed", "shell"], f"s3.bucket.create -name {bucket}\n"


def created(bucket: str, output: str) -> bool:
    """Whether weed shell's output (stdout, or the error of its failure) says `bucket` exists now."""
    return f"created bucket {bucket}" in output or f"bucket {bucket} already exists" in output
