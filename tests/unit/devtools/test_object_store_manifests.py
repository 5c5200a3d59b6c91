"""The kind cluster's object store (ebbflow_devtools.object_store): SeaweedFS on the control-plane
node under the `restricted` Pod Security Standard, its S3 gateway behind the endpoint the example
job names, with the identity a job's credentials Secret carries; buckets made by weed shell."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from ebbflow_devtools.kind import REPO
from ebbflow_devtools.object_store import (
    ACCESS_KEY,
    CONFIG_DIR,
    ENDPOINT,
    S3_PORT,
    SECRET_KEY,
    bucket_command,
    created,
    credentials_secret,
    manifests,
    s3_config,
)

IMAGE = "ebbflow/seaweedfs:0123456789ab"


def by_kind(kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests(IMAGE) if m["kind"] == kind]
    return found


def test_the_example_job_names_the_stores_endpoint_and_a_secret_with_its_identity() -> None:
    job = yaml.safe_load((REPO / "examples" / "jobs" / "digits-object-store.yaml").read_text())
    checkpoint = job["spec"]["checkpoint"]
    assert checkpoint["endpoint"] == ENDPOINT
    assert checkpoint["path"].startswith("s3://")
    secret = credentials_secret(checkpoint["credentialsSecret"], "team-a")
    assert secret["metadata"] == {"name": "object-store-credentials", "namespace": "team-a"}
    assert secret["stringData"] == {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}


def test_the_gateway_serves_the_services_port_with_the_identity_of_its_config_secret() -> None:
    service, config, deployment = by_kind("Service"), by_kind("Secret"), by_kind("Deployment")
    metadata = service["metadata"]
    assert f"http://{metadata['name']}.{metadata['namespace']}.svc:{S3_PORT}" == ENDPOINT
    assert [p["port"] for p in service["spec"]["ports"]] == [S3_PORT]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert json.loads(config["stringData"]["s3.json"]) == s3_config()
    pod = deployment["spec"]["template"]["spec"]
    (weed,) = pod["containers"]
    assert weed["image"] == IMAGE and f"-s3.port={S3_PORT}" in weed["args"]
    assert f"-s3.config={CONFIG_DIR}/s3.json" in weed["args"]
    mounted = {m["name"]: m["mountPath"] for m in weed["volumeMounts"]}
    assert mounted["config"] == CONFIG_DIR
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"config": config["metadata"]["name"]}


def test_the_store_runs_restricted_on_the_control_plane_node() -> None:
    namespace, deployment = by_kind("Namespace"), by_kind("Deployment")
    assert namespace["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "restricted"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (weed,) = pod["containers"]
    assert weed["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert [t["key"] for t in pod["tolerations"]] == ["node-role.kubernetes.io/control-plane"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("output", "exists"),
    [
        pytest.param("create bucket under /buckets\ncreated bucket checkpoints\n", True, id="created"),
        pytest.param("error: bucket checkpoints already exists", True, id="already-there"),
        pytest.param("error: bucket other already exists", False, id="another-bucket"),
        pytest.param("cannot connect to master localhost:9333 within 30s", False, id="master-not-up"),
    ],
)
def test_weed_shells_answer_says_whether_the_bucket_exists(output: str, exists: bool) -> None:
    assert bucket_command("checkpoints") == (["/weed", "shell"], "s3.bucket.create -name checkpoints\n")
    assert created("checkpoints", output) is exists
