"""Operator benchmark on the local control plane (real API machinery, KWOK nodes).

1. 100 jobs (min 2, max 24, 1 GPU per worker) on 500 nodes x 4 time-sliced GPUs (2000 GPUs):
   time to converge, then decision latency from a node's deletion to the resize applied, p50/p95:
   the clock stops when no pod is left on the deleted node and every job's status agrees with its
   pods (desiredReplicas == live workers == readyReplicas), i.e. pods deleted/created, status written.
   Measured on the way: the jobs that had a worker on the node Running at their new size (the rest
   is fair share moving workers between other jobs, which can take a second pass).
2. 500 jobs (min 1, max 4) submitted at once on the same nodes: time until all are Running at 4,
   the operator's writes per job in that burst (its own request counter), and the convergence as a
   ratio to (those writes / the API server's write rate measured in the same run).
3. The operator's peak RSS (VmHWM), CPU seconds, decision time per pass (`ebbflow_pass_seconds`,
   part decide) and API requests by verb over the whole run.

    .venv/bin/python bench/operator_bench.py [--nodes 500] [--jobs 100] [--burst 500] [--deletions 20]
                                             [--node-lease-seconds 40 per 500 nodes]
                                             [--output bench/results/operator.json]
                                             [--operator-log-level INFO|DEBUG]

The bench reads the jobs' status from a watch, not by listing them, and scales the KWOK nodes'
Lease duration with their number, so that neither its own polling nor the fake kubelets' renewals
grow with the scale; it reports every write the API server served during the burst, by resource.

Results are printed and written to --output. bench/operator_scale.py runs it at several scales.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from ebbflow_api import contract, crd
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import (
    NODE_LEASE_SECONDS,
    node_monitor_grace,
    running_control_plane,
)
from ebbflow_devtools.gpunodes import GpuNodeTemplate, delete_node
from ebbflow_devtools.ports import free_port
from ebbflow_devtools.waiting import wait_for
from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
GROUP_LABEL = "ebbflow.dev/bench"
NAMESPACE = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def raw_list(call: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(call(*args, _preload_content=False, **kwargs).data)["items"]
    return items


class JobStatuses:
    """Every bench job's status as a watch keeps it, so that polling for "settled" ten times a
    second costs the API server nothing: listing 1,000 jobs that often would load the very
    machine the figures are measured on. Relists whenever the watch ends (at most every minute)."""

    def __init__(self, custom: client.CustomObjectsApi) -> None:
        self._custom = custom
        self.by_name: dict[str, dict[str, Any]] = {}
        self.stopped = threading.Event()  # set before the control plane stops
        threading.Thread(target=self._follow, name="job-statuses", daemon=True).start()

    def _follow(self) -> None:
        resource = (contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL)
        while not self.stopped.is_set():
            listed = json.loads(
                self._custom.list_namespaced_custom_object(*resource, _preload_content=False).data
            )
            self.by_name = {job["metadata"]["name"]: job.get("status") or {} for job in listed["items"]}
            events = watch.Watch().stream(
                self._custom.list_namespaced_custom_object,
                *resource,
                resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=60,
            )
            try:
                for event in events:
                    job = event["object"]
                    if event["type"] == "DELETED":
                        self.by_name.pop(job["metadata"]["name"], None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self.by_name[job["metadata"]["name"]] = job.get("status") or {}
            except Exception as error:  # e.g. 410 Gone (the version is too old) or a cut stream
                if not self.stopped.is_set():
                    print(f"job watch ended ({error!r}); relisting", flush=True)


class Bench:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.apiext = client.ApiextensionsV1Api(api)

    def install(self) -> None:
        manifest = yaml.safe_load((REPO / crd.CRD_FILE).read_text())
        self.apiext.create_custom_resource_definition(manifest)
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        wait_for(
            lambda: self.core.list_namespaced_service_account(NAMESPACE).items, 60, "default ServiceAccount"
        )

        def established() -> bool:
            served = self.apiext.read_custom_resource_definition(manifest["metadata"]["name"])
            return any(c.type == "Established" and c.status == "True" for c in served.status.conditions or [])

        wait_for(established, 60, "CRD established")
        self.statuses = JobStatuses(self.custom)

    def add_nodes(self, count: int) -> list[str]:
        template = GpuNodeTemplate(labels={GROUP_LABEL: "yes"})
        names = [f"bench-gpu-{i}" for i in range(count)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.core.create_node(template.manifest(n)), names))

        def all_ready() -> bool:
            nodes = raw_list(self.core.list_node, label_selector=GROUP_LABEL)
            ready = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
                and not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints") or [])
            ]
            return len(ready) == count

        wait_for(all_ready, 120 + 0.5 * count, f"{count} nodes Ready", interval=1)  # ~0.2 s each here
        return names

    def job(self, name: str, lo: int, hi: int) -> dict[str, Any]:
        return (
            JobBuilder(name)
            .replicas(lo, hi)
            .node_selector({GROUP_LABEL: "yes"})
            .image("ebbflow/trainer:bench")
            .set(leaveGraceSeconds=5)
            .obj()
        )

    def submit(self, prefix: str, count: int, lo: int, hi: int) -> None:
        def create(i: int) -> None:
            self.custom.create_namespaced_custom_object(
                contract.API_GROUP,
                contract.API_VERSION,
                NAMESPACE,
                contract.PLURAL,
                self.job(f"{prefix}-{i}", lo, hi),
            )

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(count)))

    def jobs(self) -> list[dict[str, Any]]:
        """Every job in the bench's namespace, listed."""
        return raw_list(
            self.custom.list_namespaced_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            NAMESPACE,
            contract.PLURAL,
        )

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Jobs and worker pods, listed."""
        jobs = self.jobs()
        pods = raw_list(
            self.core.list_namespaced_pod,
            NAMESPACE,
            label_selector=f"{contract.LABEL_ROLE}={contract.ROLE_WORKER}",
        )
        return jobs, pods

    def settled(self, expect_total: int, gone_node: str | None = None) -> bool:
        """Cheap check while timing: every job Running with desired == replicas == ready in its
        status (from the watch), `expect_total` workers in all, and no pod left on the deleted
        node (one indexed list, only once the statuses agree)."""
        statuses = list(self.statuses.by_name.values())
        total = 0
        for status in statuses:
            desired = status.get("desiredReplicas")
            if status.get("phase") != "Running" or not desired == status.get("readyReplicas") == status.get(
                "replicas"
            ):
                return False
            total += desired
        if not statuses or total != expect_total:
            return False
        return not gone_node or not raw_list(
            self.core.list_namespaced_pod, NAMESPACE, field_selector=f"spec.nodeName={gone_node}"
        )

    def jobs_on(self, node: str) -> set[str]:
        """The jobs with a worker on `node` (one indexed list)."""
        pods = raw_list(self.core.list_namespaced_pod, NAMESPACE, field_selector=f"spec.nodeName={node}")
        return {
            pod["metadata"]["labels"][contract.LABEL_JOB_NAME]
            for pod in pods
            if pod["metadata"].get("labels", {}).get(contract.LABEL_ROLE) == contract.ROLE_WORKER
        }

    def resized(self, names: set[str], gone_node: str) -> bool:
        """The jobs that lost workers with `gone_node` are Running at their new size: desired ==
        replicas == ready, none of their workers recorded on the node (from the watch)."""
        for name in names:
            status = self.statuses.by_name.get(name, {})
            desired = status.get("desiredReplicas")
            if status.get("phase") != "Running" or not desired == status.get("readyReplicas") == status.get(
                "replicas"
            ):
                return False
            if gone_node in (status.get("workerNodes") or {}).values():
                return False
        return True

    def consistent(self, expect_total: int) -> bool:
        """The full check: the jobs' status agrees with the worker pods that actually run."""
        if not self.settled(expect_total):
            return False
        jobs, pods = self.snapshot()
        live: dict[str, int] = {}
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") == "Running":
                name = pod["metadata"]["labels"][contract.LABEL_JOB_NAME]
                live[name] = live.get(name, 0) + 1
        return all(job["status"]["desiredReplicas"] == live.get(job["metadata"]["name"], 0) for job in jobs)

    def write_rate(self, count: int = 400, concurrency: int = 8) -> float:
        """Writes per second the API server takes now: `count` small ConfigMaps created from
        `concurrency` threads (the operator's own write concurrency), then deleted."""

        def create(i: int) -> None:
            body = {"metadata": {"name": f"rate-{i}", "labels": {GROUP_LABEL: "rate"}}, "data": {"i": str(i)}}
            self.core.create_namespaced_config_map(NAMESPACE, body)

        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(create, range(count)))
        rate = count / (time.monotonic() - started)
        self.core.delete_collection_namespaced_config_map(NAMESPACE, label_selector=f"{GROUP_LABEL}=rate")
        return rate

    def apiserver_writes(self) -> dict[str, float]:
        """Writes the API server has served so far, by resource, whoever made them (its own
        apiserver_request_total): what the operator competes with for the machine."""
        method, url, headers, body, _ = self.api.param_serialize(
            "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, headers, body)
        found: dict[str, float] = {}
        for labels, value in samples(response.read().decode(), "apiserver_request_total"):
            verb = labels.split('verb="')[1].split('"')[0]
            if verb in APISERVER_WRITE_VERBS and 'resource="' in labels:
                resource = labels.split('resource="')[1].split('"')[0]
                found[resource] = found.get(resource, 0.0) + value
        return found

    def delete_jobs(self) -> None:
        """Deletes every job, then their pods at once (grace 0): the garbage collector and KWOK's
        graceful deletion took over 300 s for 6,000 workers here, and that phase is not measured.
        The API server may answer the collection's deletion with a timeout (504) while it goes on
        deleting (1,000 jobs on a loaded machine): then the jobs' watch tells when they are gone."""
        try:
            self.custom.delete_collection_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL
            )
        except client.ApiException as error:
            if error.status != 504:
                raise
        wait_for(lambda: not self.jobs(), 600, "the jobs deleted", interval=1)
        pods = [pod["metadata"]["name"] for pod in raw_list(self.core.list_namespaced_pod, NAMESPACE)]

        def delete(name: str) -> None:
            try:
                self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            except client.ApiException as error:
                if error.status != 404:  # the garbage collector came first
                    raise

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(delete, pods))
        wait_for(lambda: not self.snapshot()[1], 300 + 0.1 * len(pods), "workers deleted", interval=1)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def samples(metrics: str, name: str, match: str = "") -> list[tuple[str, float]]:
    """(labels, value) of every sample of `name` whose labels contain `match`."""
    found = []
    for line in metrics.splitlines():
        if line.startswith(name) and match in line:
            head, value = line.rsplit(" ", 1)
            if head == name or head.startswith(name + "{"):
                found.append((head[len(name) :], float(value)))
    return found


def histogram_quantiles(
    metrics: str, name: str = "ebbflow_decision_latency_seconds", match: str = ""
) -> dict[str, float]:
    """p50/p95 upper bounds and the mean of one of the operator's histograms (`match`: a label)."""
    buckets = [
        (float(labels.split('le="')[1].split('"')[0]), seen)
        for labels, seen in samples(metrics, f"{name}_bucket", match)
    ]
    total = sum(value for _, value in samples(metrics, f"{name}_sum", match))
    count = sum(value for _, value in samples(metrics, f"{name}_count", match))
    result = {"passes": count, "mean_s": round(total / count, 4) if count else float("nan")}
    for name, q in (("p50_le_s", 0.5), ("p95_le_s", 0.95)):
        result[name] = next((bound for bound, seen in buckets if seen >= q * count), float("inf"))
    return result


WRITE_VERBS = ("create", "patch", "update", "delete")
APISERVER_WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")


def requests_by_kind(metrics: str) -> dict[str, float]:
    """The operator's API requests so far (ebbflow_api_requests_total) by "verb resource"."""
    found: dict[str, float] = {}
    for labels, value in samples(metrics, "ebbflow_api_requests_total"):
        verb = labels.split('verb="')[1].split('"')[0]
        resource = labels.split('resource="')[1].split('"')[0]
        found[f"{verb} {resource}"] = value
    return found


def requests_by_verb(metrics: str) -> dict[str, float]:
    verbs: dict[str, float] = {}
    for kind, count in requests_by_kind(metrics).items():
        verb = kind.split()[0]
        verbs[verb] = verbs.get(verb, 0.0) + count
    return verbs


def writes_by_kind(metrics: str) -> dict[str, float]:
    return {kind: n for kind, n in requests_by_kind(metrics).items() if kind.split()[0] in WRITE_VERBS}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def operator_ready(operator: subprocess.Popen[bytes], port: int, gpus: int) -> bool:
    """The operator serves /metrics and has counted every node's GPUs in a pass."""
    assert operator.poll() is None, f"the operator exited with {operator.returncode}"
    return f'ebbflow_cluster_gpus{{state="total"}} {float(gpus)}' in scrape(port)


def interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (e.g. a timeout) still stops the operator and the control plane, and cleans up."""
    raise KeyboardInterrupt(f"signal {signum}")


def start_operator(kubeconfig: Path, port: int, log_level: str) -> subprocess.Popen[bytes]:
    """The operator as a subprocess scoped to the bench's namespace and nodes; log in bench/results
    (DEBUG adds a line per job and pass: what its plan wrote)."""
    log = REPO / "bench" / "results" / "operator.log"
    log.parent.mkdir(exist_ok=True)
    command = [
        *(sys.executable, "-m", "ebbflow_operator", "--namespace", NAMESPACE, "--policy", "fair"),
        *("--node-selector", f"{GROUP_LABEL}=yes", "--log-level", log_level),
        *("--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--health-port", "0"),
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def steady_state(bench: Bench, args: argparse.Namespace, names: list[str], port: int) -> dict[str, Any]:
    """Phase 1: `--jobs` jobs converge, then `--deletions` nodes are deleted one at a time."""
    results: dict[str, Any] = {}
    total = min(24 * args.jobs, args.nodes * 4)
    started = time.monotonic()
    bench.submit("steady", args.jobs, 2, 24)
    deadline = 300 + 0.15 * total  # at least 7 workers a second (1,000 x 5,000 on 2 cores: 10)
    wait_for(lambda: bench.consistent(total), deadline, f"{args.jobs} jobs, {total} workers", interval=0.5)
    results["converge_jobs_s"] = round(time.monotonic() - started, 2)
    print(f"{args.jobs} jobs converged in {results['converge_jobs_s']} s", flush=True)
    latencies, lost_latencies = [], []
    timeline: list[dict[str, Any]] = []  # wall-clock times, to line up with the operator's log
    for number, node in enumerate(names[: args.deletions], start=1):
        time.sleep(1)  # pacing, not waiting: each deletion starts a second after the last settled
        expected = min(24 * args.jobs, (args.nodes - number) * 4)
        lost = bench.jobs_on(node)
        started, deleted_at = time.monotonic(), time.time()
        delete_node(bench.core, node)
        wait_for(lambda lost=lost, node=node: bench.resized(lost, node), 120, f"{node}'s jobs", interval=0.02)
        lost_latencies.append(time.monotonic() - started)
        wait_for(
            lambda node=node, expected=expected: bench.settled(expected, gone_node=node),
            120,
            f"resize after {node}",
            interval=0.02,
        )
        latencies.append(time.monotonic() - started)
        timeline.append(
            {
                "node": node,
                "deleted_at": round(deleted_at, 3),
                "lost_jobs": sorted(lost),
                "lost_jobs_resized_s": round(lost_latencies[-1], 3),
                "s": round(latencies[-1], 3),
            }
        )
        wait_for(lambda expected=expected: bench.consistent(expected), 60, "pods agree with status")
        print(
            f"deleted {node}: its {len(lost)} jobs resized in {lost_latencies[-1]:.2f} s, "
            f"every job settled in {latencies[-1]:.2f} s",
            flush=True,
        )
    results["deletion_latency_p50_s"] = round(statistics.median(latencies), 3)
    results["deletion_latency_p95_s"] = round(percentile(latencies, 0.95), 3)
    results["deletion_latency_max_s"] = round(max(latencies), 3)
    # The jobs that lost workers alone: what fair share's rebalancing of other jobs adds is the rest.
    results["lost_jobs_resized_p50_s"] = round(statistics.median(lost_latencies), 3)
    results["lost_jobs_resized_p95_s"] = round(percentile(lost_latencies, 0.95), 3)
    results["lost_jobs_resized_max_s"] = round(max(lost_latencies), 3)
    results["operator_decision_latency"] = histogram_quantiles(scrape(port))
    results["deletions_timeline"] = timeline
    return results


def burst(bench: Bench, args: argparse.Namespace, port: int) -> dict[str, Any]:
    """Phase 2: the steady jobs go, the API server's write rate is measured, then `--burst` jobs are
    submitted at once and converge; the operator's writes for them are counted."""
    bench.delete_jobs()
    rate = bench.write_rate()
    total = min(4 * args.burst, (args.nodes - args.deletions) * 4)
    before = writes_by_kind(scrape(port))
    apiserver_before = bench.apiserver_writes()
    started = time.monotonic()
    bench.submit("burst", args.burst, 1, 4)
    results: dict[str, Any] = {"burst_submit_s": round(time.monotonic() - started, 2)}
    wait_for(lambda: bench.consistent(total), 3600, f"{args.burst} jobs, {total} workers", interval=1)
    converged = time.monotonic() - started
    after = writes_by_kind(scrape(port))
    apiserver_after = bench.apiserver_writes()
    per_job = {kind: round((n - before.get(kind, 0.0)) / args.burst, 2) for kind, n in sorted(after.items())}
    made = sum(after.values()) - sum(before.values())
    results |= {
        "converge_burst_s": round(converged, 2),
        "api_write_rate_per_s": round(rate, 1),
        "burst_operator_writes": made,
        "burst_writes_per_job": round(made / args.burst, 2),
        "burst_writes_per_job_by_kind": {kind: n for kind, n in per_job.items() if n},
        "burst_vs_write_bound": round(converged / (made / rate), 2),
        "burst_apiserver_writes_per_s": {
            resource: round((n - apiserver_before.get(resource, 0.0)) / converged, 1)
            for resource, n in sorted(apiserver_after.items())
            if n > apiserver_before.get(resource, 0.0)
        },
    }
    print(f"{args.burst} jobs converged in {results['converge_burst_s']} s", flush=True)
    return results


def operator_totals(pid: int, metrics: str) -> dict[str, Any]:
    """What the operator spent over the whole run: memory, CPU, decision time, requests."""
    return {
        "operator_peak_rss_mb": round(peak_rss_mb(pid), 1),
        "operator_cpu_s": round(cpu_seconds(pid), 1),
        "decide_per_pass": histogram_quantiles(metrics, "ebbflow_pass_seconds", 'part="decide"'),
        "api_requests_by_verb": requests_by_verb(metrics),
    }


def source_commit() -> str:
    """The commit the operator under test runs, `-dirty` when the tree has uncommitted changes: the
    figures name the code they measured."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--deletions", type=int, default=20)
    parser.add_argument(
        "--node-lease-seconds",
        type=int,
        help="the KWOK nodes' Lease duration; by default 40 s per 500 nodes, so that their renewals "
        "(every quarter of it) cost the API server what 500 kubelets' do at every scale",
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "operator.json")
    parser.add_argument("--operator-log-level", default="INFO", choices=("DEBUG", "INFO"))
    args = parser.parse_args()
    lease_seconds = args.node_lease_seconds or max(
        NODE_LEASE_SECONDS, round(NODE_LEASE_SECONDS * args.nodes / 500)
    )
    signal.signal(signal.SIGTERM, interrupt)
    results: dict[str, Any] = {
        "commit": source_commit(),
        "nodes": args.nodes,
        "gpus": args.nodes * 4,
        "jobs": args.jobs,
        "burst": args.burst,
        "deletions": args.deletions,
        "node_lease_seconds": lease_seconds,
        "node_monitor_grace_seconds": node_monitor_grace(lease_seconds),
    }
    with running_control_plane(node_lease_seconds=lease_seconds) as plane:
        bench = Bench(config.new_client_from_config(config_file=str(plane.kubeconfig)))
        bench.install()
        started = time.monotonic()
        names = bench.add_nodes(args.nodes)
        results["node_setup_s"] = round(time.monotonic() - started, 1)
        port = free_port()
        operator = start_operator(plane.kubeconfig, port, args.operator_log_level)
        try:
            wait_for(lambda: operator_ready(operator, port, args.nodes * 4), 120, "the operator's first pass")
            results.update(steady_state(bench, args, names, port))
            results.update(burst(bench, args, port))
        except Exception as error:  # the phases measured so far are kept, with what stopped the run
            results["stopped_by"] = f"{type(error).__name__}: {error}"[:2000]
            raise
        finally:
            if operator.poll() is None:
                results |= operator_totals(operator.pid, scrape(port))
            bench.statuses.stopped.set()
            operator.terminate()
            operator.wait(30)
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(results, indent=2))
            print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
