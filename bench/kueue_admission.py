"""What Kueue's accounting costs a job, on the local control plane (real API machinery, Kueue's real
manager with its webhooks, KWOK GPU nodes; no trainer runs, so "training" is every worker Running).

Two measurements, each repeated, with Kueue (`--kueue`, jobs labeled with a LocalQueue on a
ClusterQueue of 8 GPUs) and without it (the same jobs unlabeled, on 8 GPUs of nodes), in one run:

1. submission -> running: a job of 8 one-GPU workers created -> all 8 Running (with Kueue: through
   its Workload's admission);
2. preemption -> running: job B (priority 100, 4 workers) created beside job A (priority 0, up to 8
   workers, running 8) -> B's 4 workers Running (with Kueue: A shrinks gracefully to 4, its slice's
   count lowered, B's slice created and admitted; without: Ebbflow's allocator shrinks A by
   priority in the same pass that grows B).

    .venv/bin/python bench/kueue_admission.py [--repeats 5] [--output bench/results/kueue.json]

Needs `make tools` (Kueue included). Results: medians, ranges, and the Kueue/no-Kueue ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ebbflow_api import contract, crd
from ebbflow_devtools import kueue
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import ControlPlane, running_control_plane
from ebbflow_devtools.gpunodes import GpuNodeTemplate, create_gpu_nodes, delete_node
from ebbflow_devtools.ports import free_ports
from ebbflow_devtools.waiting import wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
GPUS = 8
TIMEOUT = 120.0


class Cluster:
    """The control plane with Kueue, the CRDs, and one ResourceFlavor."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.registration = client.AdmissionregistrationV1Api(api)
        self.install(crd.crd_manifest())
        kueue.start_kueue(plane, self.install)
        self.custom.create_cluster_custom_object(
            kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, "resourceflavors", kueue.resource_flavor()
        )

    def install(self, manifest: dict[str, Any]) -> None:
        """A CRD (awaited until established), a Namespace or a webhook configuration."""
        kind = manifest["kind"]
        try:
            if kind == "CustomResourceDefinition":
                self.extensions.create_custom_resource_definition(manifest)
            elif kind == "Namespace":
                self.core.create_namespace(manifest)
            elif kind == "MutatingWebhookConfiguration":
                self.registration.create_mutating_webhook_configuration(manifest)
            else:
                self.registration.create_validating_webhook_configuration(manifest)
        except ApiException as error:
            if error.status != 409:
                raise
        if kind == "CustomResourceDefinition":
            name = manifest["metadata"]["name"]
            wait_for(lambda: _established(self.extensions, name), 30, f"CRD {name} established")


def _established(extensions: client.ApiextensionsV1Api, name: str) -> bool:
    served = extensions.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in served.status.conditions or [])


@contextmanager
def scenario(cluster: Cluster, queued: bool, log: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A namespace, 8 GPUs of nodes for it alone, its queue (with Kueue) and an operator on it."""
    namespace, group = f"b-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    selector = {"ebbflow.dev/bench-group": group}
    template = GpuNodeTemplate(gpus=4, time_slicing_replicas=1, labels=selector)
    nodes = create_gpu_nodes(cluster.core, GPUS // 4, template, prefix=f"bench-{group}")
    if queued:
        name = f"team-{namespace}"
        group_, version = kueue.KUEUE_GROUP, kueue.KUEUE_VERSION
        cluster.custom.create_cluster_custom_object(
            group_, version, "clusterqueues", kueue.cluster_queue(name, GPUS, namespace)
        )
        cluster.custom.create_namespaced_custom_object(
            group_, version, namespace, "localqueues", kueue.local_queue(namespace, "team", name)
        )
    operator = start_operator(cluster.plane, namespace, selector, log, queued)
    try:
        yield namespace, selector
    finally:
        operator.terminate()
        operator.wait(10)
        for node in nodes:
            delete_node(cluster.core, node)
        cluster.core.delete_namespace(namespace)
        if queued:
            cluster.custom.delete_cluster_custom_object(
                kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, "clusterqueues", f"team-{namespace}"
            )


def start_operator(
    plane: ControlPlane, namespace: str, selector: dict[str, str], log: Path, queued: bool
) -> subprocess.Popen[bytes]:
    metrics, health = free_ports(2)
    command = [
        sys.executable, "-m", "ebbflow_operator", "--namespace", namespace,
        "--node-selector", ",".join(f"{k}={v}" for k, v in selector.items()),
        "--metrics-port", str(metrics), "--metrics-address", "127.0.0.1", "--health-port", str(health),
        "--resync-interval", "2", "--kueue", "true" if queued else "false", "--policy", "fair",
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def job(
    name: str, lo: int, hi: int, selector: dict[str, str], queued: bool, priority: int = 0
) -> dict[str, Any]:
    builder = JobBuilder(name).replicas(lo, hi).gpus(1).node_selector(selector).priority(priority)
    if queued:
        builder.queue("team")
    return builder.set(leaveGraceSeconds=5).obj()


def running_workers(core: client.CoreV1Api, namespace: str, name: str) -> int:
    selector = f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return sum(p.status.phase == "Running" and p.metadata.deletion_timestamp is None for p in pods)


def timed(condition: Callable[[], bool], what: str) -> float:
    started = time.monotonic()
    wait_for(condition, TIMEOUT, what, interval=0.05)
    return time.monotonic() - started


def submit(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.custom.create_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, manifest
    )


def measure(cluster: Cluster, queued: bool, log: Path) -> dict[str, float]:
    with scenario(cluster, queued, log) as (namespace, selector):
        started = time.monotonic()
        submit(cluster, namespace, job("a", 2, 8, selector, queued))
        wait_for(lambda: running_workers(cluster.core, namespace, "a") == 8, TIMEOUT, "a at 8", interval=0.05)
        to_running = time.monotonic() - started
        submit(cluster, namespace, job("b", 4, 4, selector, queued, priority=100))
        preempted = timed(lambda: running_workers(cluster.core, namespace, "b") == 4, "b running 4 workers")
    return {"submission_to_running_s": to_running, "preemption_to_running_s": preempted}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "kueue.json")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {"kueue": {}, "no_kueue": {}}
    with tempfile.TemporaryDirectory() as scratch, running_control_plane() as plane:
        cluster = Cluster(plane)
        for repeat in range(args.repeats):
            for side, queued in (("kueue", True), ("no_kueue", False)):  # interleaved: same load
                found = measure(cluster, queued, Path(scratch) / f"operator-{side}-{repeat}.log")
                for key, value in found.items():
                    results[side].setdefault(key, []).append(value)
                print(side, repeat, {k: round(v, 2) for k, v in found.items()}, flush=True)
    report: dict[str, Any] = {
        side: {k: summary(v) for k, v in found.items()} for side, found in results.items()
    }
    report["ratio_kueue_to_no_kueue"] = {
        key: report["kueue"][key]["median"] / report["no_kueue"][key]["median"] for key in results["kueue"]
    }
    report["raw"] = results
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=2))


if __name__ == "__main__":
    main()
