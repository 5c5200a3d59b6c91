"""Chaos soak (issue 12): jobs on the local control plane (real API server, KWOK GPU nodes) under a
stream of random disruptions, with the invariants checked all along.

Disruptions, one every `--interval` seconds for `--minutes` minutes (seeded): spot preemption (a
NoExecute taint, the node deleted seconds later), node deletion, a NoExecute taint lifted later,
eviction of a worker through the Eviction API, cordon and drain (uncordoned later), a new node,
operator SIGKILL (restarted seconds later), API server restart. The node count is kept between
`--nodes` / 2 and `--nodes` + 4 by choosing additions or removals when it drifts.

Control-plane components other than the API server that exit are started again, as the kubelet
restarts a cluster's static pods, and counted: the kube-scheduler exits by design ("scheduler cache
is corrupted") when an API server killed mid-request leaves a binding it thought failed in place.

Invariants, checked about once a second from a thread of its own (samples that fall into an API
server restart are skipped and counted):
- no job is ever Failed;
- never two live workers of a job with the same worker index;
- GPUs of the live pods bound to a node never exceed its allocatable;
- a job below its minimum while the allocator (the operator's own `decide`, on the nodes as they
  are, every GPU free) gives it at least that minimum comes back to its minimum within `--grace`;
- after the last disruption (taints lifted, nodes uncordoned and topped up, the operator running)
  every job converges to what the allocator gives it: the operator's `decide` on the observed state
  plans no pod to create or delete, and each job's desired, ready and running workers agree.

    .venv/bin/python bench/chaos_soak.py [--jobs 20] [--nodes 12] [--minutes 10] [--interval 2.0]

Prints a report and writes it to bench/results/chaos_soak.json; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from ebbflow_api import contract, crd
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import ControlPlane, running_control_plane
from ebbflow_devtools.gpunodes import (
    TAINT_SPOT_TERMINATION,
    GpuNodeTemplate,
    create_gpu_nodes,
    delete_node,
    evict_pod,
)
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision.allocator import PriorityFairShare
from ebbflow_operator.decision.decide import OperatorConfig, decide
from ebbflow_operator.decision.model import parse_job, parse_node, parse_pod
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "soak"
SOAK_LABEL = "ebbflow.dev/soak"
CHAOS_TAINT = "ebbflow.dev/chaos"
RESULTS = REPO / "bench" / "results"
Json = dict[str, Any]

# How often each disruption is drawn (relative weights).
WEIGHTS = {
    "preempt": 14,
    "delete-node": 8,
    "taint": 12,
    "evict": 24,
    "drain": 8,
    "add-node": 14,
    "operator-kill": 10,
    "apiserver-restart": 2,
}
REMOVALS = {"preempt", "delete-node"}


# --- invariants: pure, on the listed objects ------------------------------------------------------


def live(pod: Json) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") in (
        "Pending",
        "Running",
    )


def duplicate_indices(pods: list[Json]) -> list[str]:
    """Jobs with two live workers of the same index, as 'job: index'."""
    seen: Counter[tuple[str, str]] = Counter()
    for pod in pods:
        labels = pod["metadata"].get("labels", {})
        if live(pod) and labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER:
            seen[(labels[contract.LABEL_JOB_NAME], labels[contract.LABEL_WORKER_INDEX])] += 1
    return [f"{job}: index {index} x{count}" for (job, index), count in seen.items() if count > 1]


def overcommitted(nodes: list[Json], pods: list[Json]) -> list[str]:
    """Nodes whose live bound pods ask for more GPUs than the node has."""
    allocatable = {n["metadata"]["name"]: parse_node(n).gpus for n in nodes}
    used: Counter[str] = Counter()
    for raw in pods:
        pod = parse_pod(raw)
        if live(raw) and pod.node is not None and pod.node in allocatable:
            used[pod.node] += pod.gpus
    return [
        f"{node}: {gpus} > {allocatable[node]}" for node, gpus in used.items() if gpus > allocatable[node]
    ]


def failed_jobs(jobs: list[Json]) -> list[str]:
    return [j["metadata"]["name"] for j in jobs if (j.get("status") or {}).get("phase") == "Failed"]


def running_workers(pods: list[Json]) -> Counter[str]:
    """Ready, running, not deleting workers per job."""
    count: Counter[str] = Counter()
    for raw in pods:
        pod = parse_pod(raw)
        if pod.role == contract.ROLE_WORKER and pod.phase == "Running" and pod.ready and not pod.deleting:
            count[str(pod.job)] += 1
    return count


def entitled_to_min(nodes: list[Json], jobs: list[Json], now: float, operator: OperatorConfig) -> set[str]:
    """Jobs the allocator gives at least their minimum on these nodes with every GPU free."""
    parsed = [parse_job(j) for j in jobs]
    result = decide([parse_node(n) for n in nodes], [], parsed, {}, {}, now, operator, PriorityFairShare())
    return {
        plan.job.name
        for plan in result.plans
        if int(plan.status["desiredReplicas"]) >= plan.job.spec.replicas.min
    }


def unconverged(
    nodes: list[Json], pods: list[Json], jobs: list[Json], now: float, operator: OperatorConfig
) -> list[str]:
    """Why the observed state is not yet what the allocator gives every job (empty: converged)."""
    result = decide(
        [parse_node(n) for n in nodes],
        [parse_pod(p) for p in pods],
        [parse_job(j) for j in jobs],
        {},
        {},
        now,
        operator,
        PriorityFairShare(),
    )
    running = running_workers(pods)
    reasons = []
    for plan in result.plans:
        name, desired = plan.job.name, int(plan.status["desiredReplicas"])
        recorded = (plan.job.status.desired_replicas, plan.job.status.ready_replicas)
        if plan.create_workers or plan.delete:
            reasons.append(f"{name}: {len(plan.create_workers)} to create, {len(plan.delete)} to delete")
        elif recorded != (desired, desired) or running[name] != desired:
            reasons.append(f"{name}: allocator {desired}, status {recorded}, running {running[name]}")
    return reasons


# --- the cluster under chaos ----------------------------------------------------------------------


class Operator:
    """The operator as a subprocess (one replica), restartable after a SIGKILL."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.kubeconfig, self.log = kubeconfig, log
        self.process: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        command = [
            *(sys.executable, "-m", "ebbflow_operator", "--namespace", NAMESPACE, "--policy", "fair"),
            *("--node-selector", f"{SOAK_LABEL}=yes", "--resync-interval", "2"),
            *("--metrics-port", "0", "--health-port", "0", "--log-level", "INFO"),
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.kills += 1

    def stop(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.terminate()
            self.process.wait(30)


@dataclass
class Chaos:
    """Applies disruptions and the repairs they schedule (a lifted taint, a restarted operator)."""

    core: client.CoreV1Api
    plane: ControlPlane
    operator: Operator
    rng: random.Random
    nodes_wanted: int
    next_node: int = 0
    applied: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    revived: Counter[str] = field(default_factory=Counter)  # control-plane components restarted
    repairs: list[tuple[float, int, str, Callable[[], None]]] = field(default_factory=list)

    def add_nodes(self, count: int, wait_ready: bool = False) -> None:
        template = GpuNodeTemplate(gpus=2, time_slicing_replicas=2, labels={SOAK_LABEL: "yes"})
        for _ in range(count):
            spot = self.rng.random() < 0.5
            shaped = GpuNodeTemplate(**{**template.__dict__, "spot": spot})
            create_gpu_nodes(
                self.core, 1, shaped, prefix="soak", start_index=self.next_node, wait_ready=wait_ready
            )
            self.next_node += 1

    def nodes(self) -> list[client.V1Node]:
        return list(self.core.list_node(label_selector=f"{SOAK_LABEL}=yes").items)

    def choose(self, node_count: int) -> str:
        if node_count < self.nodes_wanted // 2:
            return "add-node"
        kinds = [k for k in WEIGHTS if not (k == "add-node" and node_count >= self.nodes_wanted + 4)]
        kinds = [k for k in kinds if not (k in REMOVALS | {"drain"} and node_count <= self.nodes_wanted // 2)]
        return self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]

    def later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        heapq.heappush(
            self.repairs, (time.monotonic() + delay, len(self.applied) + len(self.repairs), what, action)
        )

    def repair_due(self, everything: bool = False) -> None:
        while self.repairs and (everything or self.repairs[0][0] <= time.monotonic()):
            _, _, _, action = heapq.heappop(self.repairs)
            action()

    def disrupt(self) -> str:
        nodes = self.nodes()
        kind = self.choose(len(nodes))
        node = self.rng.choice(nodes).metadata.name if nodes else ""
        getattr(self, "_" + kind.replace("-", "_"))(node)
        self.applied[kind] += 1
        return (
            f"{kind} {node}"
            if kind not in ("add-node", "evict", "operator-kill", "apiserver-restart")
            else kind
        )

    def _preempt(self, node: str) -> None:
        self._taint_node(node, TAINT_SPOT_TERMINATION)
        self.later(self.rng.uniform(3, 10), f"delete {node}", lambda: delete_node(self.core, node))

    def _delete_node(self, node: str) -> None:
        delete_node(self.core, node)

    def _taint(self, node: str) -> None:
        self._taint_node(node, CHAOS_TAINT)
        self.later(self.rng.uniform(10, 40), f"untaint {node}", lambda: self._untaint(node))

    def _evict(self, _: str) -> None:
        pods = [p for p in self.core.list_namespaced_pod(NAMESPACE).items if p.status.phase == "Running"]
        if pods:
            evict_pod(self.core, NAMESPACE, self.rng.choice(pods).metadata.name)

    def _drain(self, node: str) -> None:
        self.core.patch_node(node, {"spec": {"unschedulable": True}})
        for pod in self.core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items:
            evict_pod(self.core, NAMESPACE, pod.metadata.name)
        self.later(self.rng.uniform(15, 45), f"uncordon {node}", lambda: self._uncordon(node))

    def _add_node(self, _: str) -> None:
        self.add_nodes(1)

    def _operator_kill(self, _: str) -> None:
        self.operator.kill()
        self.later(self.rng.uniform(1, 5), "operator start", self.operator.start)

    def _apiserver_restart(self, _: str) -> None:
        self.plane.stop_apiserver()
        time.sleep(self.rng.uniform(3, 10))
        self.revive()
        self.plane.start_apiserver()

    def revive(self) -> None:
        """Control-plane components that exited are started again, as a kubelet would (counted)."""
        for name in self.plane.revive():
            self.revived[name] += 1
            print(f"{time.strftime('%H:%M:%S')} {name} had exited: restarted", flush=True)

    def _taint_node(self, node: str, key: str) -> None:
        found = self.core.read_node(node)
        taints = [t.to_dict() for t in found.spec.taints or [] if t.key != key]
        taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
        self.core.patch_node(
            node, {"spec": {"taints": [*taints, {"key": key, "value": "true", "effect": "NoExecute"}]}}
        )

    def _untaint(self, node: str) -> None:
        try:
            found = self.core.read_node(node)
        except client.ApiException as error:
            if error.status == 404:
                return
            raise
        taints = [t.to_dict() for t in found.spec.taints or [] if t.key != CHAOS_TAINT]
        self.core.patch_node(
            node, {"spec": {"taints": [{k: v for k, v in t.items() if v is not None} for t in taints]}}
        )

    def _uncordon(self, node: str) -> None:
        try:
            self.core.patch_node(node, {"spec": {"unschedulable": False}})
        except client.ApiException as error:
            if error.status != 404:
                raise


@dataclass
class Checker:
    """Samples the cluster about once a second and records every invariant violation."""

    api: client.ApiClient
    grace: float
    operator_config: OperatorConfig
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    skipped: int = 0
    below_since: dict[str, float] = field(default_factory=dict)
    longest_below_min_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def lists(self) -> tuple[list[Json], list[Json], list[Json]]:
        def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Json]:
            items: list[Json] = json.loads(
                call(*args, _preload_content=False, _request_timeout=10, **kwargs).data
            )["items"]
            return items

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        nodes = raw(core.list_node, label_selector=f"{SOAK_LABEL}=yes")
        pods = raw(core.list_namespaced_pod, NAMESPACE)
        jobs = raw(
            custom.list_namespaced_custom_object,
            contract.API_GROUP,
            contract.API_VERSION,
            NAMESPACE,
            contract.PLURAL,
        )
        return nodes, pods, jobs

    def sample(self) -> None:
        try:
            nodes, pods, jobs = self.lists()
        except Exception:  # an API server restart: no sample, counted
            self.skipped += 1
            return
        now = time.time()
        self.samples += 1
        found = [f"job Failed: {j}" for j in failed_jobs(jobs)]
        found += [f"duplicate worker index: {d}" for d in duplicate_indices(pods)]
        found += [f"GPUs overcommitted: {o}" for o in overcommitted(nodes, pods)]
        entitled = entitled_to_min(nodes, jobs, now, self.operator_config)
        running = running_workers(pods)
        for job in jobs:
            name = job["metadata"]["name"]
            if running[name] >= job["spec"]["replicas"]["min"] or name not in entitled:
                self.below_since.pop(name, None)
                continue
            since = self.below_since.setdefault(name, now)
            self.longest_below_min_s = max(self.longest_below_min_s, now - since)
            if now - since > self.grace:
                found.append(f"{name} below its minimum for {now - since:.0f} s with capacity for it")
                self.below_since[name] = now  # one violation per grace period, not per sample
        for violation in found:
            print(f"VIOLATION {violation}", flush=True)
        self.violations += found

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.sample()


# --- the soak -------------------------------------------------------------------------------------


def install(api: client.ApiClient) -> None:
    manifest = yaml.safe_load((REPO / crd.CRD_FILE).read_text())
    client.ApiextensionsV1Api(api).create_custom_resource_definition(manifest)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    wait_for(lambda: core.list_namespaced_service_account(NAMESPACE).items, 60, "default ServiceAccount")
    custom = client.CustomObjectsApi(api)
    wait_for(
        lambda: _created(custom, JobBuilder("probe").node_selector({SOAK_LABEL: "yes"}).obj()),
        60,
        "the CRD served",
    )
    custom.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL, "probe"
    )


def _created(custom: client.CustomObjectsApi, job: Json) -> bool:
    try:
        custom.create_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL, job
        )
    except client.ApiException as error:
        return bool(error.status == 409)
    return True


def submit(api: client.ApiClient, rng: random.Random, count: int) -> None:
    custom = client.CustomObjectsApi(api)
    for i in range(count):
        low = rng.choice((1, 1, 2))
        job = (
            JobBuilder(f"soak-{i}")
            .replicas(low, rng.choice((3, 4, 6)))
            .node_selector({SOAK_LABEL: "yes"})
            .set(leaveGraceSeconds=5, priority=rng.choice((0, 0, 100)))
            .obj()
        )
        custom.create_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL, job
        )


def soak(plane: ControlPlane, args: argparse.Namespace) -> Json:
    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    rng = random.Random(args.seed)
    install(api)
    RESULTS.mkdir(exist_ok=True)
    log = RESULTS / "chaos_soak_operator.log"
    log.write_bytes(b"")
    operator = Operator(plane.kubeconfig, log)
    chaos = Chaos(client.CoreV1Api(api), plane, operator, rng, args.nodes)
    chaos.add_nodes(args.nodes)
    operator.start()
    submit(api, rng, args.jobs)
    operator_config = OperatorConfig(namespaces=(NAMESPACE,), node_selector={SOAK_LABEL: "yes"})
    checker = Checker(
        config.new_client_from_config(config_file=str(plane.kubeconfig)), args.grace, operator_config
    )
    settle = time.monotonic()
    converged = functools.partial(_converged, checker, operator_config, [])
    wait_for(converged, 300, "the jobs converged before any disruption", interval=1)
    print(
        f"{args.jobs} jobs converged in {time.monotonic() - settle:.1f} s; chaos for {args.minutes} min",
        flush=True,
    )
    thread = threading.Thread(target=checker.run, daemon=True)
    thread.start()
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        chaos.revive()
        chaos.repair_due()
        try:
            what = chaos.disrupt()
            print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)
        except Exception as error:  # e.g. the node just went, or the API server is restarting
            chaos.refused[type(error).__name__] += 1
            print(f"{time.strftime('%H:%M:%S')} not applied: {str(error).splitlines()[0][:200]}", flush=True)
        time.sleep(args.interval)
    chaos.revive()
    chaos.repair_due(everything=True)
    if not operator.running():
        operator.start()
    calm = time.monotonic()
    chaos.add_nodes(max(0, args.nodes - len(chaos.nodes())), wait_ready=True)
    reasons: list[str] = []
    try:
        wait_for(
            functools.partial(_converged, checker, operator_config, reasons),
            args.settle,
            "every job at what the allocator gives it",
            interval=1,
        )
        convergence = round(time.monotonic() - calm, 1)
    except TimeoutError:
        checker.violations.append(f"not converged {args.settle} s after the last disruption: {reasons}")
        convergence = None
    checker.stop.set()
    thread.join(10)
    operator.stop()
    return {
        "seed": args.seed,
        "jobs": args.jobs,
        "nodes": args.nodes,
        "minutes": args.minutes,
        "disruptions": sum(chaos.applied.values()),
        "disruptions_by_kind": dict(sorted(chaos.applied.items())),
        "disruptions_refused": dict(chaos.refused),
        "operator_kills": operator.kills,
        "control_plane_components_restarted": dict(chaos.revived),
        "samples": checker.samples,
        "samples_skipped_api_down": checker.skipped,
        "longest_below_min_with_capacity_s": round(checker.longest_below_min_s, 1),
        "violations": checker.violations,
        "convergence_after_last_disruption_s": convergence,
    }


def _converged(checker: Checker, operator_config: OperatorConfig, reasons: list[str]) -> bool:
    """`unconverged` on a fresh listing is empty; `reasons` keeps the last answer (for the report)."""
    try:
        found = unconverged(*checker.lists(), time.time(), operator_config)
    except Exception:  # the API server still restarting
        return False
    reasons[:] = found
    return not found


def interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=12, help="nodes of 2 GPUs x 2 time-slicing replicas")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between disruptions")
    parser.add_argument("--grace", type=float, default=90.0, help="seconds a job may stay below min")
    parser.add_argument("--settle", type=float, default=300.0, help="seconds to converge at the end")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupt)
    plane_dir = RESULTS / "chaos_soak_plane"  # the components' logs stay here after the run
    shutil.rmtree(plane_dir, ignore_errors=True)
    with running_control_plane(plane_dir) as plane:
        report = soak(plane, args)
    (RESULTS / "chaos_soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
