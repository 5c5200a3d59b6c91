"""Kubernetes I/O: the only code that talks to the API. Lists come back as raw JSON (fast, and the
decision layer parses what it needs); writes are idempotent: AlreadyExists and NotFound are success.

Every failed call raises the operator's own `KubeError` (errors.py), converted in `_request`: the
client library's exceptions never leave this module, so nothing above it imports the client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ebbflow_api import contract
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .decision.model import Json, format_time
from .errors import KubeError

log = logging.getLogger(__name__)

NETWORKING_PREFIX = "/apis/networking.k8s.io/v1"
COORDINATION_PREFIX = "/apis/coordination.k8s.io/v1"
KUEUE_PREFIX = "/apis/kueue.x-k8s.io/v1beta2"
LIST_PAGE_SIZE = 500  # items per page of a full list (the API server's own default chunk for informers)


class KubeIO:
    """Reads the cluster and applies plans. `namespaces` empty means every namespace.

    Requests go through the client's connection pool and authentication but skip its typed models:
    validating and building a model for every pod costs more than the API server's own work.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: Sequence[str] = (),
        on_request: Callable[[str, str], None] = lambda verb, resource: None,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        """``on_request(verb, resource)`` hears every request before it is sent (the metrics)."""
        self.api = api
        self.namespaces = tuple(namespaces)
        self.on_request = on_request
        self.page_size = page_size

    def _request(
        self,
        method: str,
        path: str,
        body: Json | list[Json] | None = None,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = "application/json",
    ) -> Json:
        """One API call with a JSON body; raises KubeError for any non-2xx answer."""
        self.on_request(*request_kind(method, path))
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, payload, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(method, url, headers, payload)
        except ApiException as error:  # the client's own failures (e.g. TLS): status 0
            raise KubeError(error.status or 0, str(error.reason or ""), str(error.body or "")) from error
        except HTTPError as error:  # no answer at all: connection refused, reset, timed out
            raise KubeError(0, type(error).__name__, str(error)) from error
        data = response.read()
        if not 200 <= response.status < 300:
            text = data.decode(errors="replace") if data else ""
            raise KubeError(int(response.status), str(response.reason or ""), text)
        result: Json = json.loads(data) if data else {}
        return result

    # --- reads --------------------------------------------------------------------------------------

    def _list(self, paths: Sequence[str], selector: str | None = None) -> tuple[Iterator[Json], int]:
        """Items, lazily, and the (oldest) resourceVersion the lists were taken at.

        Each list comes in pages of `page_size` items (one consistent snapshot: the API server's
        `continue` token), fetched as the caller iterates: a list of 24,000 pods in one answer is
        150 MB of JSON and several times that as Python objects, the operator's peak memory at
        scale; a page at a time, the cache keeps only what it parses. The first page of each path is
        fetched now, for its resourceVersion (a failure raises here, not while iterating).
        """
        query = [("labelSelector", selector)] if selector else []
        firsts = [self._page(path, query, None) for path in paths]
        version = min(int(first.get("metadata", {}).get("resourceVersion") or 0) for first in firsts)
        return self._pages(paths, query, firsts), version

    def _page(self, path: str, query: list[tuple[str, str]], token: str | None) -> Json:
        paging = [("limit", str(self.page_size))] + ([("continue", token)] if token else [])
        return self._request("GET", path, query=query + paging)

    def _pages(
        self, paths: Sequence[str], query: list[tuple[str, str]], firsts: list[Json]
    ) -> Iterator[Json]:
        for path, page in zip(paths, firsts, strict=True):
            while True:
                yield from page["items"]
                token = page.get("metadata", {}).get("continue")
                if not token:
                    break
                page = self._page(path, query, token)

    def _scoped(self, suffix: str, prefix: str = "/api/v1") -> list[str]:
        if not self.namespaces:
            return [f"{prefix}/{suffix}"]
        return [f"{prefix}/namespaces/{namespace}/{suffix}" for namespace in self.namespaces]

    def list_nodes(self) -> tuple[Iterator[Json], int]:
        return self._list(["/api/v1/nodes"])

    def list_pods(self) -> tuple[Iterator[Json], int]:
        """Every pod in the cluster: capacity needs the other workloads' GPU requests too."""
        return self._list(["/api/v1/pods"])

    def list_jobs(self) -> tuple[Iterator[Json], int]:
        return self._list(self._scoped(contract.PLURAL, f"/apis/{contract.API_GROUP}/{contract.API_VERSION}"))

    def list_services(self) -> tuple[Iterator[Json], int]:
        """Services the operator created (they carry the job label)."""
        return self._list(self._scoped("services"), selector=contract.LABEL_JOB_NAME)

    def list_network_policies(self) -> tuple[Iterator[Json], int]:
        """NetworkPolicies the operator created (they carry the job label)."""
        paths = self._scoped("networkpolicies", NETWORKING_PREFIX)
        return self._list(paths, selector=contract.LABEL_JOB_NAME)

    def list_workloads(self) -> tuple[Iterator[Json], int]:
        """Kueue's Workloads, the operator's slices and those sharing their ClusterQueues' quota;
        only with Kueue enabled (as are the three lists below)."""
        return self._list(self._scoped("workloads", KUEUE_PREFIX))

    def list_resource_flavors(self) -> tuple[Iterator[Json], int]:
        """Kueue's ResourceFlavors (cluster-scoped): the node labels and tolerations of admitted pods."""
        return self._list([f"{KUEUE_PREFIX}/resourceflavors"])

    def list_cluster_queues(self) -> tuple[Iterator[Json], int]:
        """Kueue's ClusterQueues (cluster-scoped): quotas and preemption policies."""
        return self._list([f"{KUEUE_PREFIX}/clusterqueues"])

    def list_local_queues(self) -> tuple[Iterator[Json], int]:
        """Kueue's LocalQueues: the ClusterQueue each job's queue feeds."""
        return self._list(self._scoped("localqueues", KUEUE_PREFIX))

    # --- writes -------------------------------------------------------------------------------------

    # Each write returns the object as the API server now has it (None when there was nothing to do),
    # so the cache learns about it before the watch event arrives.

    def create_pod(self, namespace: str, body: Json) -> Json | None:
        return _tolerate(409, self._request, "POST", f"/api/v1/namespaces/{namespace}/pods", body)

    def create_service(self, namespace: str, body: Json) -> Json | None:
        return _tolerate(409, self._request, "POST", f"/api/v1/namespaces/{namespace}/services", body)

    def create_secret(self, namespace: str, body: Json) -> Json | None:
        """Create a Secret; the answer (which holds its data) is dropped."""
        _tolerate(409, self._request, "POST", f"/api/v1/namespaces/{namespace}/secrets", body)
        return None

    def create_network_policy(self, namespace: str, body: Json) -> Json | None:
        path = f"{NETWORKING_PREFIX}/namespaces/{namespace}/networkpolicies"
        return _tolerate(409, self._request, "POST", path, body)

    def create_workload(self, namespace: str, body: Json) -> Json | None:
        return _tolerate(409, self._request, "POST", f"{KUEUE_PREFIX}/namespaces/{namespace}/workloads", body)

    def patch_workload(self, namespace: str, name: str, patch: Sequence[Json], status: bool) -> Json | None:
        """A JSON patch of the Workload (or its status); it tests the uid and resourceVersion first,
        so a Workload that changed since the pass saw it is left alone (the next pass decides again),
        as is one that is gone."""
        path = f"{KUEUE_PREFIX}/namespaces/{namespace}/workloads/{name}" + ("/status" if status else "")
        try:
            return _tolerate(
                404, self._request, "PATCH", path, list(patch), (), "application/json-patch+json"
            )
        except KubeError as error:
            if error.status == 422 and "test" in error.body:
                log.debug("workload %s/%s changed since the pass saw it: %s", namespace, name, error.body)
                return None
            raise

    # --- the leader election's Lease (leader.LeaseIO) -----------------------------------------------

    def read_lease(self, namespace: str, name: str) -> Json | None:
        return _tolerate(
            404, self._request, "GET", f"{COORDINATION_PREFIX}/namespaces/{namespace}/leases/{name}"
        )

    def create_lease(self, namespace: str, body: Json) -> Json:
        return self._request("POST", f"{COORDINATION_PREFIX}/namespaces/{namespace}/leases", body)

    def replace_lease(self, namespace: str, name: str, body: Json) -> Json:
        """PUT with the resourceVersion read: a replica that lost a race gets 409."""
        return self._request("PUT", f"{COORDINATION_PREFIX}/namespaces/{namespace}/leases/{name}", body)

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> Json | None:
        """Deletes exactly the pod observed (uid precondition), never a successor with its name."""
        body = {"gracePeriodSeconds": grace_seconds, "preconditions": {"uid": uid}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        return _tolerate((404, 409), self._request, "DELETE", path, body)

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Json) -> Json | None:
        """Merges `annotations` into exactly the pod observed (uid precondition); a pod gone is done."""
        body = {"metadata": {"uid": uid, "annotations": annotations}}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        return _tolerate((404, 409), self._request, "PATCH", path, body, (), "application/merge-patch+json")

    def patch_job_status(self, namespace: str, name: str, patch: Json) -> Json | None:
        path = (
            f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/"
            f"{contract.PLURAL}/{name}/status"
        )
        return _tolerate(
            404, self._request, "PATCH", path, {"status": patch}, (), "application/merge-patch+json"
        )

    def record_event(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, now: float
    ) -> None:
        """A core/v1 Event on the job, as `kubectl describe etj` shows them."""
        stamp = format_time(now)
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
                "kind": contract.KIND,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "ebbflow-operator"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        _tolerate(404, self._request, "POST", f"/api/v1/namespaces/{namespace}/events", body)


_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def request_kind(method: str, path: str) -> tuple[str, str]:
    """(verb, resource) of a request as the API server's audit names them: a GET of a collection is
    a list, of one object a get; a subresource is `resource/subresource` (`pods/status`)."""
    parts = [part for part in path.split("?")[0].split("/") if part]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = "/".join(rest[0:1] + rest[2:3])
    verb = _VERBS.get(method, "get" if len(rest) > 1 else "list")
    return verb, resource


def _tolerate(statuses: int | tuple[int, ...], call: Any, *args: Any) -> Json | None:
    """Calls the API; the given HTTP statuses mean the desired state already holds."""
    accepted = (statuses,) if isinstance(statuses, int) else statuses
    try:
        result: Json = call(*args)
    except KubeError as error:
        if error.status not in accepted:
            raise
        log.debug("%s %s: already done (%s)", args[0], args[1], error.status)
        return None
    return result
