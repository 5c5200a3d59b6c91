"""Integration fixtures: one real control plane per test session, a fresh namespace per test, the
CRD for the modules that ask for it (`pytestmark = pytest.mark.usefixtures("crd")`).

When the control plane cannot start, tests skip on a developer machine (with the reason) but fail
under CI=true: the integration tier must never silently vanish from CI.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml
from ebbflow_api import crd as crd_module
from ebbflow_devtools.controlplane import (
    ControlPlane,
    ControlPlaneError,
    missing_tools,
    start_control_plane,
)
from ebbflow_devtools.gpunodes import GpuNodeTemplate, create_gpu_nodes, delete_node
from ebbflow_devtools.waiting import wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / crd_module.CRD_FILE
NODE_GROUP_LABEL = "ebbflow.dev/test-node-group"


@dataclass
class Kube:
    """The API clients a test needs, all bound to the session's control plane."""

    api: client.ApiClient
    core: client.CoreV1Api
    policy: client.PolicyV1Api
    custom: client.CustomObjectsApi
    apiextensions: client.ApiextensionsV1Api


def unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"integration tier cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    missing = missing_tools()
    if missing:
        unavailable(f"control-plane tools not built ({', '.join(missing)}): run `make tools`")

    # SIGTERM (e.g. a CI timeout) must still run the teardown that removes the temporary folder.
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        plane = start_control_plane()
    except ControlPlaneError as error:
        unavailable(f"control plane did not start: {error}")
    try:
        yield plane
    finally:
        plane.stop()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    return Kube(
        api=api,
        core=client.CoreV1Api(api),
        policy=client.PolicyV1Api(api),
        custom=client.CustomObjectsApi(api),
        apiextensions=client.ApiextensionsV1Api(api),
    )


def install_crd(kube: Kube) -> None:
    """Creates or updates the committed CRD and waits until the API serves it."""
    install_manifest(kube, yaml.safe_load(CRD_FILE.read_text()))


def _create(api: client.ApiClient, manifest: dict[str, Any]) -> None:
    """Creates a Namespace or a webhook configuration (what Kueue's start installs besides CRDs)."""
    kind = manifest["kind"]
    registration = client.AdmissionregistrationV1Api(api)
    if kind == "Namespace":
        client.CoreV1Api(api).create_namespace(manifest)
    elif kind == "MutatingWebhookConfiguration":
        registration.create_mutating_webhook_configuration(manifest)
    elif kind == "ValidatingWebhookConfiguration":
        registration.create_validating_webhook_configuration(manifest)
    else:
        raise ValueError(f"install_manifest cannot create a {kind}")


def install_manifest(kube: Kube, manifest: dict[str, Any]) -> None:
    """A CustomResourceDefinition (created or updated, then awaited until served), or another object
    `_create` knows (created unless it exists)."""
    if manifest["kind"] != "CustomResourceDefinition":
        try:
            _create(kube.api, manifest)
        except ApiException as error:
            if error.status != 409:
                raise
        return
    name = manifest["metadata"]["name"]
    try:
        kube.apiextensions.create_custom_resource_definition(manifest)
    except ApiException as error:
        if error.status != 409:
            raise
        current = kube.apiextensions.read_custom_resource_definition(name)
        manifest["metadata"]["resourceVersion"] = current.metadata.resource_version
        kube.apiextensions.replace_custom_resource_definition(name, manifest)

    def established() -> bool:
        served = kube.apiextensions.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in served.status.conditions or [])

    wait_for(established, 30, "CRD established")


@pytest.fixture(scope="session")
def crd(kube: Kube) -> None:
    """The committed ElasticTrainingJob CRD, installed and served (once per session)."""
    install_crd(kube)


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists); deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: kube.core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        30,
        f"default ServiceAccount in {name}",
    )
    yield name
    kube.core.delete_namespace(name)


class GpuNodes:
    """Creates fake GPU nodes with names unique to one test, and deletes them when it ends."""

    @property
    def selector(self) -> dict[str, str]:
        """A nodeSelector that matches only this test's nodes."""
        return {NODE_GROUP_LABEL: self.prefix}

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.prefix = f"n{uuid.uuid4().hex[:6]}"
        self.created: list[str] = []

    def add(self, count: int = 1, template: GpuNodeTemplate | None = None, group: str = "gpu") -> list[str]:
        template = template or GpuNodeTemplate()
        template = dataclasses.replace(template, labels={**template.labels, NODE_GROUP_LABEL: self.prefix})
        start = sum(name.startswith(f"{self.prefix}-{group}-") for name in self.created)
        names = create_gpu_nodes(
            self.core, count, template, prefix=f"{self.prefix}-{group}", start_index=start
        )
        self.created += names
        return names

    def delete_all(self) -> None:
        for name in self.created:
            delete_node(self.core, name)


@pytest.fixture
def gpu_nodes(kube: Kube) -> Iterator[GpuNodes]:
    nodes = GpuNodes(kube.core)
    yield nodes
    nodes.delete_all()
