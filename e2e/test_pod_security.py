"""Pod Security as platform teams set it: the jobs' namespaces enforce the `restricted` standard
(devtools' `Kind.ensure_namespace`), so every e2e job and the demo's example run under it, and the
API server's admission turns away a pod that would not pass. Checked by server-side dry runs: the
admission decision without a pod to clean up."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ebbflow_devtools.kind import (
    DEMO_NAMESPACE,
    E2E_NAMESPACE,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    TRAINER_IMAGE,
    Kind,
    KindError,
)


def trainer_pod(restricted: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "trainer", "image": TRAINER_IMAGE, "command": ["sleep", "1"]}
    spec: dict[str, Any] = {"containers": [container]}
    if restricted:
        container["securityContext"] = RESTRICTED_CONTAINER_CONTEXT
        spec["securityContext"] = RESTRICTED_POD_CONTEXT
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pss-probe"}, "spec": spec}


def dry_run(kind: Kind, namespace: str, manifest: dict[str, Any]) -> str:
    return kind.kubectl(
        "-n", namespace, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(manifest)
    )


@pytest.mark.parametrize("namespace", [E2E_NAMESPACE, DEMO_NAMESPACE])
def test_job_namespaces_enforce_restricted_pod_security(kind: Kind, namespace: str) -> None:
    labels = kind.json("get", "namespace", namespace)["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted"
    with pytest.raises(KindError, match=r'violates PodSecurity "restricted'):
        dry_run(kind, namespace, trainer_pod(restricted=False))
    assert "created (server dry run)" in dry_run(kind, namespace, trainer_pod(restricted=True))
