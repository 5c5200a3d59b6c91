"""ebbflow_devtools.api_reads against the local control plane: what it reads is what the API server
holds (the objects kubectl's JSON prints), and a missing object is a KindError naming its path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ebbflow_devtools.api_reads import ApiReader
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.errors import KindError

from .conftest import Kube
from .operator_helpers import GROUP, PLURAL, VERSION, create_job

pytestmark = pytest.mark.integration


@pytest.fixture
def reader(control_plane: ControlPlane) -> Iterator[ApiReader]:
    reads = ApiReader(control_plane.kubeconfig)
    yield reads
    reads.close()


def test_reads_a_job_and_its_pods_as_the_api_server_holds_them(
    kube: Kube, crd: None, namespace: str, reader: ApiReader
) -> None:
    create_job(kube, namespace, JobBuilder("read").replicas(1, 2).obj())
    held = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "read")
    read = reader.custom_object(f"{GROUP}/{VERSION}", namespace, PLURAL, "read")
    assert read["metadata"]["uid"] == held["metadata"]["uid"] and read["spec"] == held["spec"]
    assert reader.pods(namespace, "ebbflow.dev/job-name=nobody") == []


def test_a_missing_object_is_a_kind_error_naming_its_path(
    namespace: str, crd: None, reader: ApiReader
) -> None:
    with pytest.raises(KindError, match=f"GET .*/namespaces/{namespace}/{PLURAL}/absent: HTTP 404"):
        reader.custom_object(f"{GROUP}/{VERSION}", namespace, PLURAL, "absent")
