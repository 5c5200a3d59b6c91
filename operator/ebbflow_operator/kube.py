"""Kubernetes I/O: the only code that talks to the API. Lists come back as raw JSON (fast, and the
decision layer parses what it needs); writes are idempotent: AlreadyExists and NotFound are success.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from ebbflow_trainer import contract
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .model import Json, format_time

log = logging.getLogger(__name__)


class KubeIO:
    """Reads the cluster and applies plans. `namespaces` empty means every namespace."""

    def __init__(self, api: client.ApiClient, namespaces: Sequence[str] = ()) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespaces = tuple(namespaces)

    # --- reads --------------------------------------------------------------------------------------

    def _items(self, response: Any) -> list[Json]:
        items: list[Json] = json.loads(response.data)["items"]
        return items

    def list_nodes(self) -> list[Json]:
        return self._items(self.core.list_node(_preload_content=False))

    def list_pods(self) -> list[Json]:
        """Every pod in the cluster: capacity needs the other workloads' GPU requests too."""
        return self._items(self.core.list_pod_for_all_namespaces(_preload_content=False))

    def list_jobs(self) -> list[Json]:
        args = (contract.API_GROUP, contract.API_VERSION)
        if not self.namespaces:
            return self._items(
                self.custom.list_cluster_custom_object(*args, contract.PLURAL, _preload_content=False)
            )
        return [
            job
            for namespace in self.namespaces
            for job in self._items(
                self.custom.list_namespaced_custom_object(
                    *args, namespace, contract.PLURAL, _preload_content=False
                )
            )
        ]

    def list_services(self) -> list[Json]:
        """Services the operator created (they carry the job label)."""
        selector = contract.LABEL_JOB_NAME
        if not self.namespaces:
            return self._items(
                self.core.list_service_for_all_namespaces(label_selector=selector, _preload_content=False)
            )
        return [
            service
            for namespace in self.namespaces
            for service in self._items(
                self.core.list_namespaced_service(namespace, label_selector=selector, _preload_content=False)
            )
        ]

    # --- writes -------------------------------------------------------------------------------------

    def create_pod(self, namespace: str, body: Json) -> None:
        _tolerate(409, self.core.create_namespaced_pod, namespace, body)

    def create_service(self, namespace: str, body: Json) -> None:
        _tolerate(409, self.core.create_namespaced_service, namespace, body)

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> None:
        """Deletes exactly the pod observed (uid precondition), never a successor with its name."""
        body = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds, preconditions=client.V1Preconditions(uid=uid)
        )
        _tolerate((404, 409), self.core.delete_namespaced_pod, name, namespace, body=body)

    def patch_job_status(self, namespace: str, name: str, patch: Json) -> None:
        _tolerate(
            404,
            self.custom.patch_namespaced_custom_object_status,
            contract.API_GROUP,
            contract.API_VERSION,
            namespace,
            contract.PLURAL,
            name,
            {"status": patch},
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
        _tolerate(404, self.core.create_namespaced_event, namespace, body)


def _tolerate(statuses: int | tuple[int, ...], call: Any, *args: Any, **kwargs: Any) -> None:
    """Calls the API; the given HTTP statuses mean the desired state already holds."""
    accepted = (statuses,) if isinstance(statuses, int) else statuses
    try:
        call(*args, **kwargs)
    except ApiException as error:
        if error.status not in accepted:
            raise
        log.debug("%s: already done (%s)", getattr(call, "__name__", call), error.status)
