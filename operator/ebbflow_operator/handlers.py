"""kopf handlers: watch events feed the operator's cache and wake the reconcile loop. Thin on
purpose: no decisions here. The Reconciler is handed over in kopf's `memo` (see __main__.py)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import kopf
from ebbflow_api import contract

from .kube import LIST_PAGE_SIZE


class RetryForever:
    """kopf's request backoffs: 1, 1, 2, 3, then every 5 s for as long as the API server fails.

    kopf ends the operator once a finite sequence runs out; a control plane that comes back slowly
    (it answers 503 until all its paths are installed: longer than 12 s on a loaded CI machine, when
    the sequence was 1, 1, 2, 3, 5) must not. Iterated afresh for each request; not Sized, so kopf
    never counts a last attempt. A permanent error (RBAC taken away) is logged every 5 s instead."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1.0, 1.0, 2.0, 3.0), itertools.repeat(5.0))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Event handlers keep no state on the objects; kopf's own Kubernetes events are noise here.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf lists before it watches (and again after a 410): in pages, as the reconciler's relists.
    settings.watching.chunk_size = LIST_PAGE_SIZE
    # Reconnect within seconds after an API server outage (kopf's default climbs to 21 s, then gives up).
    settings.networking.error_backoffs = RetryForever()


def _observe(kind: str, event: kopf.RawEvent, memo: kopf.Memo) -> None:
    memo.reconciler.observe_event(kind, dict(event["object"]), event.get("type") == "DELETED")


@kopf.on.event(contract.API_GROUP, contract.API_VERSION, contract.PLURAL)
def job_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("jobs", event, memo)


@kopf.on.event("", "v1", "pods", labels={contract.LABEL_JOB_NAME: kopf.PRESENT})
def pod_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("pods", event, memo)


@kopf.on.event("", "v1", "services", labels={contract.LABEL_JOB_NAME: kopf.PRESENT})
def service_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("services", event, memo)


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels={contract.LABEL_JOB_NAME: kopf.PRESENT})
def network_policy_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("networkpolicies", event, memo)


def workload_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Kueue's Workloads; registered only with Kueue enabled (`watch_kueue`), as are the next three."""
    _observe("workloads", event, memo)


def flavor_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("resourceflavors", event, memo)


def cluster_queue_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("clusterqueues", event, memo)


def local_queue_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("localqueues", event, memo)


def watch_kueue() -> None:
    """Watch Kueue's Workloads (the jobs' slices and the others using their ClusterQueues' quota),
    ResourceFlavors, ClusterQueues and LocalQueues (the chart grants the RBAC only with Kueue on)."""
    for plural, handler in (
        ("workloads", workload_changed),
        ("resourceflavors", flavor_changed),
        ("clusterqueues", cluster_queue_changed),
        ("localqueues", local_queue_changed),
    ):
        kopf.on.event("kueue.x-k8s.io", "v1beta2", plural)(handler)


@kopf.on.event("", "v1", "nodes")
def node_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _observe("nodes", event, memo)


@kopf.on.probe(id="reconcileLoop")
def reconcile_loop(memo: kopf.Memo, **_: Any) -> str:
    """Backs kopf's liveness endpoint (`--health-port`): fails while no reconcile pass has completed
    for minutes, so the kubelet restarts a stuck operator."""
    stalled = memo.reconciler.stalled_for(time.monotonic())
    if stalled is not None:
        raise kopf.PermanentError(f"no reconcile pass completed for {stalled:.0f} s")
    return "ok"
