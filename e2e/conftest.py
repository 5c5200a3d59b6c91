"""End-to-end tier: real images, kubelets, containers, signals and pod network on the kind cluster
built on this machine (hack/kind), with the fake GPU device plugin advertising time-sliced
`nvidia.com/gpu`. The operator runs on the host against the cluster's API server.

Session setup (minutes cold, about four warm): the cluster (`hack/kind/up.sh`), the images
(`hack/images/build-images.sh`; the trainer's CPU variant is loaded into the workers), the device
plugin, the CRD. When any of it fails, tests skip on a developer machine but fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / ".tools" / "bin"
KUBECONFIG = REPO / ".cluster" / "kind-kubeconfig"
CLUSTER = "ebbflow"
WORKERS = [f"{CLUSTER}-worker", f"{CLUSTER}-worker2", f"{CLUSTER}-worker3"]
TRAINER_IMAGE = "ebbflow/trainer:dev-cpu"
GPUS_PER_WORKER_NODE = 4  # the plugin's default: 2 physical devices x 2 time-slicing replicas
SETUP_TIMEOUT_S = 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
            # The first test also pays for the session's setup (images, cluster).
            item.add_marker(pytest.mark.timeout(SETUP_TIMEOUT_S))


def _environment() -> dict[str, str]:
    path = f"{REPO / 'hack' / 'kind' / 'bin'}:{TOOLS}:{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "KUBECONFIG": str(KUBECONFIG)}


def _run(*command: str, input: str | None = None, timeout: float = SETUP_TIMEOUT_S) -> str:
    result = subprocess.run(
        command, env=_environment(), input=input, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


@dataclass
class Kind:
    """kubectl against the kind cluster."""

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        return _run("kubectl", *args, input=input, timeout=timeout)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))


def _gpus_advertised(kind: Kind) -> bool:
    nodes = kind.json("get", "nodes")["items"]
    capacity = {n["metadata"]["name"]: n["status"].get("capacity", {}).get("nvidia.com/gpu") for n in nodes}
    return all(capacity.get(name) == str(GPUS_PER_WORKER_NODE) for name in WORKERS)


def _set_up(kind: Kind) -> None:
    _run("bash", "hack/kind/up.sh")
    _run("bash", "hack/images/build-images.sh")
    _run("kind", "load", "docker-image", TRAINER_IMAGE, "--name", CLUSTER, "--nodes", ",".join(WORKERS))
    plugin = _run("bash", "hack/fake-gpu-plugin/build-image.sh").strip().splitlines()[-1]
    _run("kind", "load", "docker-image", plugin, "--name", CLUSTER)
    manifest = (REPO / "hack" / "fake-gpu-plugin" / "deploy.yaml").read_text()
    kind.kubectl("apply", "-f", "-", input=manifest.replace("ebbflow/fake-gpu-plugin:latest", plugin))
    kind.kubectl("apply", "-f", str(REPO / "crds"))
    wait_for(lambda: _gpus_advertised(kind), 120, "the device plugin's nvidia.com/gpu on every worker")


@pytest.fixture(scope="session")
def kind() -> Kind:
    cluster = Kind()
    try:
        _set_up(cluster)
    except (RuntimeError, subprocess.TimeoutExpired, TimeoutError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"e2e tier cannot run in CI: {error}", pytrace=False)
        pytest.skip(f"kind cluster unavailable: {error}")
    return cluster


@pytest.fixture
def namespace(kind: Kind) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kind.kubectl("create", "namespace", name)
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def operator(kind: Kind, namespace: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The operator on the host, scoped to the test's namespace, with short timers."""
    log = tmp_path / "operator.log"
    command = [sys.executable, "-m", "ebbflow_operator", "--namespace", namespace, "--resync-interval", "2"]
    command += ["--metrics-port", "0", "--health-port", "0"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=_environment(), stdout=output, stderr=subprocess.STDOUT)
    yield process
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
