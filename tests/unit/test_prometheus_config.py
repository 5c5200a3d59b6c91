"""hack/prometheus/prometheus.yaml, the in-cluster Prometheus of the e2e tier and the demo: its scrape
configuration follows the contract (role label, job-name label, metrics port) and its ClusterRole only
reads. With promtool built (`hack/build-tools.sh prometheus`), `promtool check config` runs on it too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from ebbflow_api import contract

Json = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "hack" / "prometheus" / "prometheus.yaml"
PROMTOOL = ROOT / ".tools" / "bin" / "promtool"


def meta_label(prefix: str, key: str) -> str:
    """The __meta_kubernetes_* name Prometheus gives a Kubernetes label."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


@cache
def documents() -> tuple[Json, ...]:
    return tuple(doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc)


def find(kind: str) -> Json:
    (doc,) = (doc for doc in documents() if doc["kind"] == kind)
    return doc


@cache
def prometheus_yml() -> str:
    return str(find("ConfigMap")["data"]["prometheus.yml"])


def scrape_job(name: str) -> Json:
    config = yaml.safe_load(prometheus_yml())
    (job,) = (job for job in config["scrape_configs"] if job["job_name"] == name)
    return job


def kept(job: Json, source: str) -> list[str]:
    """The regexes of the job's keep rules on `source`."""
    rules = job["relabel_configs"]
    return [r["regex"] for r in rules if r.get("action") == "keep" and r["source_labels"] == [source]]


def test_config_parses_and_scrapes_every_5s() -> None:
    config = yaml.safe_load(prometheus_yml())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["global"]["evaluation_interval"] == "5s"
    names = {job["job_name"] for job in config["scrape_configs"]}
    assert {"ebbflow-operator", "ebbflow-trainers"} <= names


def test_operator_job_keeps_the_metrics_port_of_the_operator_service() -> None:
    job = scrape_job("ebbflow-operator")
    assert [sd["role"] for sd in job["kubernetes_sd_configs"]] == ["endpointslice"]
    assert kept(job, "__meta_kubernetes_endpointslice_port_name") == ["metrics"]
    service_label = "__meta_kubernetes_service_label_"
    assert kept(job, meta_label(service_label, "app.kubernetes.io/name")) == ["ebbflow"]
    assert kept(job, meta_label(service_label, "app.kubernetes.io/component")) == ["metrics"]
    assert job["honor_labels"] is True  # the per-job series keep their namespace and job labels


def test_trainers_job_selects_workers_on_the_contracts_metrics_port() -> None:
    job = scrape_job("ebbflow-trainers")
    assert [sd["role"] for sd in job["kubernetes_sd_configs"]] == ["pod"]
    pod_label = "__meta_kubernetes_pod_label_"
    assert kept(job, meta_label(pod_label, contract.LABEL_ROLE)) == [contract.ROLE_WORKER]
    (selector,) = job["kubernetes_sd_configs"][0]["selectors"]
    assert selector["label"] == f"{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    rules = job["relabel_configs"]
    addresses = [r["replacement"] for r in rules if r.get("target_label") == "__address__"]
    assert addresses == ["${1}:" + str(contract.METRICS_PORT), "[${1}]:" + str(contract.METRICS_PORT)]
    targets = {r["target_label"]: r["source_labels"] for r in rules if "target_label" in r}
    assert targets["job"] == [meta_label(pod_label, contract.LABEL_JOB_NAME)]
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]


def test_cluster_role_only_reads() -> None:
    rules = find("ClusterRole")["rules"]
    assert {verb for rule in rules for verb in rule["verbs"]} == {"get", "list", "watch"}
    resources = {(group, r) for rule in rules for group in rule["apiGroups"] for r in rule["resources"]}
    assert resources == {("", "pods"), ("", "services"), ("discovery.k8s.io", "endpointslices")}


def test_one_namespace_throughout() -> None:
    """README's `sed 's/: monitoring$/: NAMESPACE/'` moves every object: no other spelling of it."""
    namespace = find("Namespace")["metadata"]["name"]
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    namespaced = [doc for doc in documents() if doc["kind"] not in cluster_scoped]
    assert {doc["metadata"]["namespace"] for doc in namespaced} == {namespace}
    assert {s["namespace"] for s in find("ClusterRoleBinding")["subjects"]} == {namespace}
    text = MANIFEST.read_text().splitlines()
    lines = [line for line in text if namespace in line and not line.startswith("#")]
    assert all(line.endswith(f": {namespace}") for line in lines), lines


def test_promtool_accepts_the_config(tmp_path: Path) -> None:
    promtool = str(PROMTOOL) if PROMTOOL.exists() else shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no promtool (make tools builds it): the config check cannot run in CI")
        pytest.skip("no promtool (make tools builds it)")
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_yml())
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
