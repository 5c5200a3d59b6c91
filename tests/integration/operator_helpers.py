"""Shared helpers for the operator's integration tests: the operator as a subprocess, jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.ports import free_ports

from .conftest import REPO, Kube

KUBECTL = REPO / ".tools" / "bin" / "kubectl"
# The key the operator signs the jobs' rendezvous tokens with (the chart's Secret in a cluster).
TOKEN_KEY = "integration-token-key"
SETTLE = 90  # seconds for the operator to converge; generous for a loaded 2-core machine
GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL


class OperatorProcess:
    """`python -m ebbflow_operator` against the test control plane, scoped to one namespace and
    one test's nodes, with short timers."""

    def __init__(self, plane: ControlPlane, namespace: str, node_selector: dict[str, str], log: Path) -> None:
        self.plane = plane
        self.namespace = namespace
        self.node_selector = node_selector
        self.log_path = log
        self.metrics_port, self.health_port = free_ports(2)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        selector = ",".join(f"{k}={v}" for k, v in self.node_selector.items())
        command = [
            sys.executable,
            "-m",
            "ebbflow_operator",
            "--namespace",
            self.namespace,
            "--node-selector",
            selector,
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            "--health-port",
            str(self.health_port),
            "--resync-interval",
            "2",
            # The sizes these tests expect are fair share's (max-min, every GPU handed out); a test
            # of another policy names it in `extra`, which comes later and wins.
            "--policy",
            "fair",
            *extra,
        ]
        env = {
            **os.environ,
            "KUBECONFIG": str(self.plane.kubeconfig),
            "EBBFLOW_OPERATOR_TOKEN_KEY": TOKEN_KEY,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as when a node dies under the operator."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def health(self) -> tuple[int, str]:
        """kopf's liveness endpoint: HTTP status and body."""
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


@contextmanager
def running_operator(
    plane: ControlPlane, namespace: str, node_selector: dict[str, str], log: Path, *extra: str
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(plane, namespace, node_selector, log)
    operator.start(*extra)
    try:
        yield operator
    finally:
        operator.stop()


def job_manifest(
    name: str,
    lo: int,
    hi: int,
    node_selector: dict[str, str],
    gpus: int = 1,
    cpu: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """The shared `JobBuilder` job on this test's nodes, min `lo` and max `hi` workers of `gpus` GPUs
    each, a short leave grace, and any other spec fields by their API names (`priority=100`)."""
    job = JobBuilder(name).replicas(lo, hi).gpus(gpus).node_selector(node_selector)
    if cpu:
        job.cpu(cpu)
    return job.set(leaveGraceSeconds=5, **spec).obj()


def create_job(kube: Kube, namespace: str, manifest: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return job


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_job(kube, namespace, name).get("status") or {})


def condition(kube: Kube, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(kube, namespace, name).get("conditions", []) if c["type"] == type_), None)


def workers(kube: Kube, namespace: str, job: str, phase: str | None = "Running") -> list[Any]:
    """The job's worker pods that are not being deleted (in `phase`, unless None)."""
    selector = f"{contract.LABEL_JOB_NAME}={job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    pods = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None and (phase is None or p.status.phase == phase)
    ]


def settled(kube: Kube, namespace: str, name: str, count: int, phase: str = "Running") -> bool:
    """The job reports `phase` with `count` ready workers and exactly that many worker pods run."""
    current = status(kube, namespace, name)
    return (
        current.get("phase") == phase
        and current.get("readyReplicas") == count
        and current.get("desiredReplicas") == count
        and len(workers(kube, namespace, name, None)) == count
        and len(workers(kube, namespace, name)) == count
    )


def events(kube: Kube, namespace: str, name: str, reason: str) -> list[Any]:
    found = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [e for e in found if e.reason == reason]


def patch_job(kube: Kube, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """A merge patch of the job (e.g. `{"spec": {"replicas": {"max": 8}}}`)."""
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)


def pod_uids(kube: Kube, namespace: str) -> dict[str, str]:
    """Name -> uid of every pod in the namespace that is not being deleted."""
    pods = kube.core.list_namespaced_pod(namespace).items
    return {p.metadata.name: p.metadata.uid for p in pods if p.metadata.deletion_timestamp is None}


def conditions_current(kube: Kube, namespace: str, name: str) -> bool:
    """Every condition of the job was written for its current spec (observedGeneration)."""
    job = get_job(kube, namespace, name)
    found = (job.get("status") or {}).get("conditions", [])
    return bool(found) and all(c.get("observedGeneration") == job["metadata"]["generation"] for c in found)
