"""hack/prometheus-operator/deploy.yaml, the e2e tier's and the demo's monitoring: the Prometheus the
operator runs selects every ServiceMonitor and PodMonitor (so the chart's are what it scrapes), the
Service the tests query reaches its pods, everything lives in the namespace the tests query, its own
ClusterRole only reads, and the images are the placeholders the installer replaces."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from ebbflow_devtools.kind import CHART_VALUES, PROMETHEUS_NAMESPACE

Json = dict[str, Any]

MANIFEST = Path(__file__).resolve().parents[2] / "hack" / "prometheus-operator" / "deploy.yaml"


@cache
def documents() -> tuple[Json, ...]:
    return tuple(doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc)


def find(kind: str, name: str) -> Json:
    (doc,) = (d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)
    return doc


def test_the_prometheus_selects_every_monitor_in_every_namespace() -> None:
    spec = find("Prometheus", "ebbflow")["spec"]
    for selector in ("serviceMonitor", "podMonitor"):
        assert spec[f"{selector}Selector"] == {} and spec[f"{selector}NamespaceSelector"] == {}, selector
    assert spec["serviceDiscoveryRole"] == "EndpointSlice"
    assert {"metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"} <= set(CHART_VALUES)


def test_the_queried_service_reaches_the_prometheus_pods() -> None:
    service = find("Service", "prometheus")["spec"]
    assert service["selector"] == {"prometheus": find("Prometheus", "ebbflow")["metadata"]["name"]}
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(9090, 9090)]


def test_everything_namespaced_is_in_the_monitoring_namespace() -> None:
    namespaced = [
        d for d in documents() if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")
    ]
    assert {d["metadata"]["namespace"] for d in namespaced} == {PROMETHEUS_NAMESPACE}
    bindings = [d for d in documents() if d["kind"] == "ClusterRoleBinding"]
    assert {s["namespace"] for b in bindings for s in b["subjects"]} == {PROMETHEUS_NAMESPACE}


def test_the_prometheus_only_reads() -> None:
    rules = find("ClusterRole", "ebbflow-prometheus-operated")["rules"]
    assert {verb for rule in rules for verb in rule["verbs"]} <= {"get", "list", "watch"}


def test_the_images_are_the_placeholders_the_installer_replaces() -> None:
    text = MANIFEST.read_text()
    operator = find("Deployment", "prometheus-operator")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == "ebbflow/prometheus-operator:dev"
    assert operator["args"] == ["--prometheus-config-reloader=ebbflow/prometheus-config-reloader:dev"]
    assert find("Prometheus", "ebbflow")["spec"]["image"] == "ebbflow/prometheus:dev"
    assert text.count(":dev\n") == 3, "an image left out of the installer's replacements"
