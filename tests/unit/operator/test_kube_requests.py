"""The operator counts its API requests by verb and resource (ebbflow_api_requests_total), named as the
API server's audit log names them, so the benchmark's writes per job read the same as an audit."""

from __future__ import annotations

import pytest
from ebbflow_operator.kube import request_kind


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        pytest.param("GET", "/api/v1/pods", ("list", "pods"), id="list-cluster-wide"),
        pytest.param(
            "GET", "/api/v1/namespaces/team/pods?labelSelector=a%3Db", ("list", "pods"), id="list-ns"
        ),
        pytest.param("GET", "/api/v1/nodes", ("list", "nodes"), id="list-nodes"),
        pytest.param("POST", "/api/v1/namespaces/team/pods", ("create", "pods"), id="create-pod"),
        pytest.param("PATCH", "/api/v1/namespaces/team/pods/job-worker-0", ("patch", "pods"), id="annotate"),
        pytest.param("DELETE", "/api/v1/namespaces/team/pods/job-worker-0", ("delete", "pods"), id="delete"),
        pytest.param("POST", "/api/v1/namespaces/team/events", ("create", "events"), id="event"),
        pytest.param(
            "PATCH",
            "/apis/ebbflow.dev/v1alpha1/namespaces/team/elastictrainingjobs/job/status",
            ("patch", "elastictrainingjobs/status"),
            id="status-subresource",
        ),
        pytest.param(
            "GET",
            "/apis/ebbflow.dev/v1alpha1/elastictrainingjobs",
            ("list", "elastictrainingjobs"),
            id="list-custom",
        ),
        pytest.param(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ebbflow/leases/ebbflow-operator",
            ("update", "leases"),
            id="renew-lease",
        ),
        pytest.param(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ebbflow/leases/ebbflow-operator",
            ("get", "leases"),
            id="read-lease",
        ),
        pytest.param(
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies",
            ("create", "networkpolicies"),
            id="create-policy",
        ),
    ],
)
def test_a_request_is_named_as_the_audit_names_it(method: str, path: str, kind: tuple[str, str]) -> None:
    assert request_kind(method, path) == kind
