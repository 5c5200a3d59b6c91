"""One reconcile pass over the whole cluster, and the loop that runs passes when something changes.

Level-triggered: a pass lists nodes, pods, Services and jobs, recomputes every job's size with the
allocator and every job's plan with the planner, then applies the plans. Nothing is carried from
one pass to the next except what the API holds (the jobs' status), so a restarted operator picks
up exactly where the old one stopped. Watch events only wake the loop; a periodic resync covers
anything no event announces (e.g. other workloads' pods).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ebbflow_api import contract
from kubernetes.client.exceptions import ApiException

from . import manifests
from .allocator import Demand, Policy, PriorityFairShare
from .cache import Store
from .capacity import cluster_capacity, eligible_nodes, matches_selector
from .kube import KubeIO
from .metrics import Metrics
from .model import Job, JobKey, Json, Node, Pod, parse_job, parse_node, parse_pod
from .planner import TERMINAL_PHASES, Observed, Plan, PlannerConfig, hold_cap, plan_job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    node_selector: Mapping[str, str] = field(default_factory=dict)  # only these nodes are allocated
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    resync_interval: float = 30.0  # a pass at least this often
    relist_interval: float = 60.0  # full lists at least this often (the cache is fed by watches)
    debounce: float = 0.05  # gather a burst of watch events into one pass
    write_concurrency: int = 8


@dataclass(frozen=True)
class PassResult:
    plans: tuple[Plan, ...]
    total_gpus: int
    free_gpus: int


def _frozen(job: Job, workers: list[Pod]) -> bool:
    """Finished jobs and jobs whose workers have started finishing get no allocation."""
    return job.status.phase in TERMINAL_PHASES or any(
        p.phase == "Succeeded" and p.owner_uid == job.uid for p in workers
    )


def decide(
    nodes: list[Node],
    pods: list[Pod],
    jobs: list[Job],
    services: Mapping[JobKey, frozenset[str]],
    now: float,
    config: OperatorConfig,
    policy: Policy,
) -> PassResult:
    """Observed state in, plans out: capacity, then allocation across jobs, then each job's plan."""
    by_name = {node.name: node for node in nodes}
    selected = [node for node in nodes if matches_selector(node, config.node_selector)]
    job_pods: dict[JobKey, list[Pod]] = defaultdict(list)
    for pod in pods:
        if pod.job is not None:
            job_pods[(pod.namespace, pod.job)].append(pod)
    movable: list[Pod] = []
    demands: list[Demand] = []
    eligible: dict[JobKey, frozenset[str]] = {}
    shapes: dict[object, frozenset[str]] = {}  # jobs with the same selector and tolerations share nodes
    for job in jobs:
        workers = [p for p in job_pods[job.key] if p.role == contract.ROLE_WORKER]
        shape = (tuple(sorted(job.node_selector.items())), job.tolerations)
        if shape not in shapes:
            shapes[shape] = eligible_nodes(selected, job)
        eligible[job.key] = shapes[shape]
        if _frozen(job, workers):
            continue
        held = [p for p in workers if p.owner_uid == job.uid and p.holds_gpus and p.node in by_name]
        running = [p for p in held if not p.deleting]
        # Workers this job is already giving up are about to free their GPUs: count them as the
        # job's to hand out, or the next pass sees a transient shortage and takes a lower-priority
        # job below its minimum (to 0) while its shrink is still in flight.
        movable += held
        cap = hold_cap(job, now)
        demands.append(
            Demand(
                key=job.key,
                min=job.spec.replicas.min,
                max=job.spec.replicas.max if cap is None else min(cap, job.spec.replicas.max),
                gpus_per_worker=job.gpus_per_worker,
                eligible=eligible[job.key],
                priority=job.spec.priority,
                created=job.created,
                current_nodes=tuple(sorted(p.node for p in running if p.node)),
            )
        )
    capacity = cluster_capacity(selected, pods, movable)
    allocation = policy.allocate(demands, capacity.free)
    plans = []
    for job in jobs:
        observed = Observed(
            pods=job_pods[job.key],
            services=services.get(job.key, frozenset()),
            nodes=by_name,
            desired=allocation.get(job.key, 0),
            free_gpus=sum(capacity.free.get(name, 0) for name in eligible[job.key]),
        )
        plans.append(plan_job(job, observed, now, config.planner))
    used = sum(p.gpus for p in pods if p.holds_gpus and p.node in capacity.free)
    return PassResult(tuple(plans), capacity.total, max(0, capacity.total - used))


class Reconciler:
    """Runs passes: on demand (`trigger`, from watch events) and every `resync_interval` seconds."""

    def __init__(
        self, io: KubeIO, config: OperatorConfig, metrics: Metrics, policy: Policy | None = None
    ) -> None:
        self.io = io
        self.config = config
        self.metrics = metrics
        self.policy: Policy = policy or PriorityFairShare()
        self._wake = threading.Event()
        self._first_trigger: float | None = None
        self._pool = ThreadPoolExecutor(config.write_concurrency, thread_name_prefix="ebbflow-write")
        self.stores: dict[str, Store[Any]] = {
            "nodes": Store(parse_node),
            "pods": Store(parse_pod),
            "jobs": Store(parse_job),
            "services": Store(_service_key),
        }
        self._listed_at = 0.0

    def observe_event(self, kind: str, raw: Json, deleted: bool) -> None:
        """A watch event (from kopf): remember the object, then wake the loop."""
        self.stores[kind].apply(raw, deleted)
        self.trigger()

    def relist(self) -> None:
        """Full lists of everything into the cache: the first observation, and a periodic check
        that catches what no event announced (other workloads' pods, events missed while a watch
        was down)."""
        lists = {
            "nodes": self.io.list_nodes,
            "pods": self.io.list_pods,
            "jobs": self.io.list_jobs,
            "services": self.io.list_services,
        }
        for kind, call in lists.items():
            items, version = call()
            drift = self.stores[kind].replace(items, version)
            if drift and self._listed_at:
                log.info("relist: %d %s changed unannounced, e.g. %s", len(drift), kind, drift[:5])
        self._listed_at = time.monotonic()

    def trigger(self) -> None:
        """Something changed; thread-safe, cheap, called for every watch event."""
        if self._first_trigger is None:
            self._first_trigger = time.monotonic()
        self._wake.set()

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self.config.resync_interval)
            if stop.is_set():
                break
            time.sleep(self.config.debounce)
            self._wake.clear()
            started = self._first_trigger or time.monotonic()
            self._first_trigger = None
            try:
                if time.monotonic() - self._listed_at > self.config.relist_interval:
                    self.relist()
                self.run_pass()
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("reconcile pass failed; retrying")
                stop.wait(1.0)
                self._wake.set()
                continue
            self.metrics.decision_latency.observe(time.monotonic() - started)
        self._pool.shutdown(wait=True)

    def observe(self) -> tuple[list[Node], list[Pod], list[Job], dict[JobKey, frozenset[str]]]:
        services: dict[JobKey, set[str]] = defaultdict(set)
        for key, name in self.stores["services"].values():
            services[key].add(name)
        return (
            self.stores["nodes"].values(),
            self.stores["pods"].values(),
            self.stores["jobs"].values(),
            {key: frozenset(names) for key, names in services.items()},
        )

    def run_pass(self, now: float | None = None) -> PassResult:
        started = time.monotonic()
        nodes, pods, jobs, services = self.observe()
        observed = time.monotonic()
        result = decide(
            nodes, pods, jobs, services, time.time() if now is None else now, self.config, self.policy
        )
        decided = time.monotonic()
        work = [p for p in result.plans if _has_work(p)]
        failures = sum(self._pool.map(self._apply, work))
        if work:
            log.info(
                "pass: %d nodes, %d pods, %d jobs, %d changed; observe %.3fs, decide %.3fs, apply %.3fs",
                len(nodes),
                len(pods),
                len(jobs),
                len(work),
                observed - started,
                decided - observed,
                time.monotonic() - decided,
            )
        if failures:
            self.metrics.reconcile_errors.inc(failures)
        self.metrics.gpus.labels("total").set(result.total_gpus)
        self.metrics.gpus.labels("free").set(result.free_gpus)
        self.metrics.record_jobs(
            (p.job.key, str(p.status["phase"]), int(p.status["desiredReplicas"]), int(p.status["replicas"]))
            for p in result.plans
        )
        for plan in result.plans:
            if plan.rescale_reason:
                self.metrics.rescales.labels(plan.rescale_reason).inc()
            if plan.preemptions:
                self.metrics.preemptions.inc(plan.preemptions)
        return result

    def _apply(self, plan: Plan) -> int:
        """Status first (it records what the deletions mean), then deletions, creations, events.

        When the status write fails nothing else is done: the next pass plans again.
        """
        job, io, now = plan.job, self.io, time.time()
        ns = job.namespace
        pods, jobs, services = self.stores["pods"], self.stores["jobs"], self.stores["services"]
        steps: list[tuple[Callable[[], Json | None], Store[Any]]] = []
        if plan.status_patch:
            steps.append((partial(io.patch_job_status, ns, job.name, plan.status_patch), jobs))
        steps += [(partial(io.delete_pod, ns, d.name, d.uid, d.grace_seconds), pods) for d in plan.delete]
        if plan.create_rendezvous_pod:
            steps.append((partial(io.create_pod, ns, manifests.rendezvous_pod(job)), pods))
        for name in plan.create_services:
            rendezvous = name == manifests.rendezvous_name(job.name)
            body = manifests.rendezvous_service(job) if rendezvous else manifests.headless_service(job)
            steps.append((partial(io.create_service, ns, body), services))
        steps += [
            (partial(io.create_pod, ns, manifests.worker_pod(job, i, g)), pods)
            for i, g in plan.create_workers
        ]
        failures = 0
        for number, (step, store) in enumerate(steps):
            try:
                answer = step()
            except ApiException as error:
                failures += 1
                message = f"{error.status} {error.reason}: {str(error.body)[:512]}"
                log.warning("%s/%s: write failed: %s", job.namespace, job.name, message)
                self._event(job, "Warning", "ReconcileError", message, now)
                if number == 0 and plan.status_patch:
                    return failures
                continue
            if answer and answer.get("kind") != "Status":
                store.apply(answer)
        for event in plan.events:
            self._event(job, event.type, event.reason, event.message, now)
        return failures

    def _event(self, job: Job, type_: str, reason: str, message: str, now: float) -> None:
        try:
            self.io.record_event(job.namespace, job.name, job.uid, type_, reason, message, now)
        except ApiException as error:
            log.warning("%s/%s: event not recorded: %s", job.namespace, job.name, error.status)


def _service_key(raw: Json) -> tuple[JobKey, str]:
    metadata = raw["metadata"]
    return (metadata["namespace"], metadata["labels"][contract.LABEL_JOB_NAME]), metadata["name"]


def _has_work(plan: Plan) -> bool:
    return bool(
        plan.status_patch
        or plan.delete
        or plan.create_workers
        or plan.create_rendezvous_pod
        or plan.create_services
        or plan.events
    )
