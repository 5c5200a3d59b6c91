"""The reconcile loop: runs a pass over the whole cluster whenever something changes, and applies
the plans it decides.

Level-triggered: a pass reads the cache (nodes, pods, Services, jobs and, under Kueue, Workloads;
fed by watch events and by periodic full lists in a thread of their own), calls the pure `decide`
(decide.py) for every job's plan, then executes each plan's writes (`decision.writes`: typed,
complete, in order; the loop builds no body and decides nothing). Nothing is carried from one pass
to the next except what the API holds (the jobs' status), so a restarted operator picks up exactly
where the old one stopped. Watch events only wake the loop; a periodic resync covers the rest.

Invariants: every API write goes through `ClusterIO` (KubeIO in production, an in-memory fake in
tests) and fails only with `KubeError`, every declaration of dead workers through a `Declarer`
(declarer.py) and fails only with `DeclarationError`; per job, the writes run in the plan's order
(the status first) and nothing else is written when the status write fails.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

from ebbflow_api import contract
from ebbflow_api.models import GPU_RESOURCE

from .cache import Store
from .decision.allocator import Policy, PriorityFairShare
from .decision.decide import KueueObjects, OperatorConfig, PassResult, PlanMemo, decide, this_pass
from .decision.kueue import parse_flavor, parse_workload
from .decision.kueue_room import parse_cluster_queue, parse_local_queue
from .decision.model import Job, JobKey, Json, Node, Pod, parse_job, parse_node, parse_pod
from .decision.plan import Plan, Refusal
from .decision.writes import (
    AnnotatePod,
    ChildKind,
    CreateChild,
    DeclareGone,
    DeletePod,
    PatchStatus,
    PatchWorkload,
    Write,
)
from .declarer import DeclarationError, Declarer, HttpDeclarer, job_token, random_key, with_token
from .errors import KubeError
from .metrics import JobSample, Metrics
from .policies import policy_named
from .policies.history import History, node_devices

__all__ = ["ClusterIO", "OperatorConfig", "PassResult", "Reconciler"]

log = logging.getLogger(__name__)
# The liveness probe fails when no pass has completed for this long (and STALL_RESYNCS resync
# intervals): long enough for an API server restart, short enough that a stuck loop gets restarted.
STALL_SECONDS = 120.0
STALL_RESYNCS = 10
# Periodic full lists take at most this share of the time: at 1,000 x 5,000 on a loaded control
# plane one list took 30 s, and every 60 s it competed with the passes' writes for the API server.
RELIST_SHARE = 0.05
# A worker refused with these is refused for what it is (Pod Security, a quota, a webhook: 403; a
# field the API server rejects: 400, 422), not for a passing state of the server.
REFUSED_STATUSES = frozenset({400, 403, 422})
DECLARATION_CONCURRENCY = 4  # rendezvous pods told at once


def relist_wait(interval: float, last_list_seconds: float) -> float:
    """Seconds until the next periodic full list: the relist interval, stretched so that lists
    take at most RELIST_SHARE of the time (watches keep the cache current in between)."""
    return max(interval, last_list_seconds / RELIST_SHARE)


class ClusterIO(Protocol):
    """What the reconciler reads and writes the cluster through (KubeIO implements it).

    Lists return raw objects and the resourceVersion they were taken at. Writes return the object
    as the API server now has it, or None when there was nothing to do; they are idempotent and
    raise KubeError on failure.
    """

    def list_nodes(self) -> tuple[Iterable[Json], int]: ...
    def list_pods(self) -> tuple[Iterable[Json], int]: ...
    def list_jobs(self) -> tuple[Iterable[Json], int]: ...
    def list_services(self) -> tuple[Iterable[Json], int]: ...
    def list_network_policies(self) -> tuple[Iterable[Json], int]: ...
    def list_workloads(self) -> tuple[Iterable[Json], int]: ...
    def list_resource_flavors(self) -> tuple[Iterable[Json], int]: ...
    def list_cluster_queues(self) -> tuple[Iterable[Json], int]: ...
    def list_local_queues(self) -> tuple[Iterable[Json], int]: ...
    def create_pod(self, namespace: str, body: Json) -> Json | None: ...
    def create_service(self, namespace: str, body: Json) -> Json | None: ...
    def create_network_policy(self, namespace: str, body: Json) -> Json | None: ...
    def create_secret(self, namespace: str, body: Json) -> Json | None: ...
    def create_workload(self, namespace: str, body: Json) -> Json | None: ...
    def patch_workload(
        self, namespace: str, name: str, patch: Sequence[Json], status: bool
    ) -> Json | None: ...
    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> Json | None: ...
    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Json) -> Json | None: ...
    def patch_job_status(self, namespace: str, name: str, patch: Json) -> Json | None: ...
    def record_event(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, now: float
    ) -> None: ...


class Reconciler:
    """Runs passes: on demand (`trigger`, from watch events) and every `resync_interval` seconds."""

    def __init__(
        self,
        io: ClusterIO,
        config: OperatorConfig,
        metrics: Metrics,
        leading: Callable[[], bool] = lambda: True,
        declarer: Declarer | None = None,
        token_key: bytes | None = None,
    ) -> None:
        """`leading` gates every pass: a standby replica (leader.Elector) keeps its cache warm from
        the watches and writes nothing. `declarer` tells the jobs' rendezvous pods which workers are
        gone, signed with tokens from `token_key` (declarer.py; a random key when None)."""
        self.io = io
        self.declarer: Declarer = declarer or HttpDeclarer()
        self._token_key = token_key or random_key()
        # The workers already declared gone, by job uid (the next passes do not declare them again).
        self._declared: dict[str, set[str]] = defaultdict(set)
        self.leading = leading
        self.config = config
        self.metrics = metrics
        # The trainers' recent reports, for the goodput and quality policies (memory only; see
        # history.py for what an operator restart keeps).
        self.history = History()
        self._wake = threading.Event()
        self._first_trigger: float | None = None
        self._pool = ThreadPoolExecutor(config.write_concurrency, thread_name_prefix="ebbflow-write")
        # Declarations wait on rendezvous pods, not on the API server: a pod that does not answer
        # holds up no write.
        self._declaring = ThreadPoolExecutor(DECLARATION_CONCURRENCY, thread_name_prefix="ebbflow-declare")
        parsers: dict[str, Callable[[Json], Any]] = {
            "nodes": parse_node,
            "pods": parse_pod,
            "jobs": parse_job,
            "services": _child_key,
            "networkpolicies": _child_key,
        }
        if config.kueue:
            parsers["workloads"] = parse_workload
            parsers["resourceflavors"] = parse_flavor
            parsers["clusterqueues"] = partial(parse_cluster_queue, gpu_resource=GPU_RESOURCE)
            parsers["localqueues"] = parse_local_queue
        self.stores: dict[str, Store[Any]] = {
            kind: Store(parse, kind, metrics.cache_unparsable.labels(kind).inc)
            for kind, parse in parsers.items()
        }
        self._listed_at = 0.0
        self._memo: PlanMemo = {}  # the last pass's reusable plans (decide.PlanMemo)
        # The latest worker the API server refused to create, by job (written by the write threads,
        # one job each; read by the next pass, which holds back that job's new workers a while).
        self._refusals: dict[JobKey, Refusal] = {}
        # When the last pass completed (monotonic); the start counts as one, for the liveness probe.
        self.last_pass_at = time.monotonic()

    def _kueue_objects(self) -> KueueObjects | None:
        if not self.config.kueue:
            return None
        return KueueObjects(
            self.stores["workloads"].values(),
            self.stores["resourceflavors"].values(),
            self.stores["clusterqueues"].values(),
            self.stores["localqueues"].values(),
        )

    def stalled_for(self, now: float) -> float | None:
        """Seconds since the last completed pass when that exceeds the liveness limit (the loop is
        stuck, or every pass fails), else None. Passes run at least every resync interval."""
        limit = max(STALL_SECONDS, STALL_RESYNCS * self.config.resync_interval)
        since = now - self.last_pass_at
        return since if since > limit else None

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
            "networkpolicies": self.io.list_network_policies,
        }
        if self.config.kueue:
            lists["workloads"] = self.io.list_workloads
            lists["resourceflavors"] = self.io.list_resource_flavors
            lists["clusterqueues"] = self.io.list_cluster_queues
            lists["localqueues"] = self.io.list_local_queues
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
        """Passes until `stop`; the periodic full lists run beside them (`_relist_forever`)."""
        relister = threading.Thread(
            target=self._relist_forever, args=(stop,), name="ebbflow-relist", daemon=True
        )
        relister.start()
        while not stop.is_set():
            self._wake.wait(self.config.resync_interval)
            if stop.is_set():
                break
            time.sleep(self.config.debounce)
            self._wake.clear()
            started = self._first_trigger or time.monotonic()
            self._first_trigger = None
            if not self.leading():
                self.last_pass_at = time.monotonic()  # a standby is healthy without passes
                self._listed_at = 0.0  # relist first on becoming the leader
                self.metrics.forget_cluster_state()  # the leader reports the cluster, not a standby
                continue
            try:
                if not self._listed_at:
                    self.relist()  # the first observation, and a new leader's
                self.run_pass()
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("reconcile pass failed; retrying")
                stop.wait(1.0)
                self._wake.set()
                continue
            self.metrics.decision_latency.observe(time.monotonic() - started)
        self._pool.shutdown(wait=True)  # not the relister's list in flight: it is read-only

    def _relist_forever(self, stop: threading.Event) -> None:
        """A full list every relist interval, then a pass. Not in the loop: at 20,000 pods on a
        loaded control plane a relist took 30 s and more, and every pass waited for it."""
        interval = wait = self.config.relist_interval
        while not stop.wait(wait):
            if not self._listed_at or not self.leading():
                continue  # the loop lists first (a standby's watches keep its cache warm)
            started = time.monotonic()
            try:
                self.relist()
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("relist failed; the next in %.0f s", wait)
                continue
            took = time.monotonic() - started
            self.metrics.relist_seconds.observe(took)
            wait = relist_wait(interval, took)
            if wait > interval:
                log.info("relist took %.1f s: the next in %.0f s", took, wait)
            self.trigger()

    def observe(
        self,
    ) -> tuple[list[Node], list[Pod], list[Job], dict[JobKey, frozenset[str]], dict[JobKey, frozenset[str]]]:
        """The cache's nodes, pods and jobs, and the names of each job's Services and NetworkPolicies."""
        return (
            self.stores["nodes"].values(),
            self.stores["pods"].values(),
            self.stores["jobs"].values(),
            self._names_by_job("services"),
            self._names_by_job("networkpolicies"),
        )

    def _names_by_job(self, kind: str) -> dict[JobKey, frozenset[str]]:
        names: dict[JobKey, set[str]] = defaultdict(set)
        for key, name in self.stores[kind].values():
            names[key].add(name)
        return {key: frozenset(found) for key, found in names.items()}

    def run_pass(self, now: float | None = None) -> PassResult:
        started = time.monotonic()
        nodes, pods, jobs, services, network_policies = self.observe()
        for gone_job in self._declared.keys() - {job.uid for job in jobs}:
            del self._declared[gone_job]
        observed = time.monotonic()
        when = time.time() if now is None else now
        policy = self._policy(nodes, pods, jobs, when)
        result = decide(
            nodes,
            pods,
            jobs,
            services,
            network_policies,
            when,
            self.config,
            policy,
            self._memo,
            self._kueue_objects(),
            self._refusals,
        )
        self._memo = result.memo
        accounts = self.config.planner.trainer_service_accounts
        work, later = this_pass(result.plans, self.config.max_writes_per_pass, accounts)
        decided = time.monotonic()
        failures = sum(self._pool.map(self._apply, work))
        applied = time.monotonic()
        for part, seconds in (("observe", observed - started), ("decide", decided - observed)):
            self.metrics.pass_seconds.labels(part).observe(seconds)
        self.metrics.pass_seconds.labels("apply").observe(applied - decided)
        if work:
            log.info(
                "pass: %d nodes, %d pods, %d jobs, %d changed, %d left for the next pass; "
                "observe %.3fs, decide %.3fs, apply %.3fs",
                len(nodes),
                len(pods),
                len(jobs),
                len(work),
                len(later),
                observed - started,
                decided - observed,
                applied - decided,
            )
        if later:
            self.metrics.deferred_plans.inc(len(later))
            self._wake.set()
        if failures:
            self.metrics.reconcile_errors.inc(failures)
        self.metrics.gpus.labels("total").set(result.total_gpus)
        self.metrics.gpus.labels("free").set(result.free_gpus)
        self.metrics.record_jobs(_job_sample(p) for p in result.plans)
        for plan in work:
            if plan.rescale_reason:
                self.metrics.rescales.labels(plan.rescale_reason).inc()
            if plan.preemptions:
                self.metrics.preemptions.inc(plan.preemptions)
        self.last_pass_at = time.monotonic()
        return result

    def _policy(self, nodes: list[Node], pods: list[Pod], jobs: list[Job], now: float) -> Policy:
        """The configured policy for this pass, fed with the history the pass just updated."""
        if self.config.policy == "fair":
            return PriorityFairShare()
        self.history.update(jobs, pods, node_devices(nodes))
        speeds = self.history.speeds()
        return policy_named(
            self.config.policy, self.history.metrics(jobs, speeds), node_devices(nodes, speeds), now
        )

    def _apply(self, plan: Plan) -> int:
        """Executes the plan's writes in order, then records its events.

        When the status write fails nothing else is done: the next pass plans again. Any other
        failed write is counted and reported, and the rest go ahead. Returns the failures.
        """
        job, now = plan.job, time.time()
        log.debug("%s/%s: %s", job.namespace, job.name, plan.summary())
        failures = 0
        for write in plan.writes:
            if isinstance(write, DeclareGone):
                self._declare_soon(job, write)
                continue
            try:
                answer, store = self._execute(job, write)
            except KubeError as error:
                failures += 1
                message = f"{error.status} {error.reason}: {error.body[:512]}"
                log.warning("%s/%s: write failed: %s", job.namespace, job.name, message)
                self._event(job, "Warning", "ReconcileError", message, now)
                if isinstance(write, PatchStatus):
                    return failures
                self._note_refusal(job, write, error, now)
                continue
            if _creates_a_worker(write):
                self._refusals.pop(job.key, None)
            if answer and answer.get("kind") != "Status":
                store.apply(answer)
        for event in plan.events:
            self._event(job, event.type, event.reason, event.message, now)
        return failures

    def _declare_soon(self, job: Job, write: DeclareGone) -> None:
        """Tell the job's rendezvous pod, in the background, about the workers not declared yet."""
        declared = self._declared[job.uid]
        pods = tuple((name, why) for name, why in write.pods if name not in declared)
        if pods:
            declared.update(name for name, _ in pods)
            self._declaring.submit(self._declare, job, write.address, pods)

    def _declare(self, job: Job, address: str, pods: tuple[tuple[str, str], ...]) -> None:
        """One declaration; a failure is logged and forgotten, so the next pass that still sees the
        workers declares them again (the survivors' heartbeats remove a dead node anyway)."""
        try:
            outcome = self.declarer.declare(address, job_token(self._token_key, job.uid), pods)
        except DeclarationError as error:
            self._declared[job.uid].difference_update(name for name, _ in pods)
            self.metrics.declarations.labels("failed").inc(len(pods))
            log.warning(
                "%s/%s: declaring gone %s failed: %s", job.namespace, job.name, _described(pods), error
            )
            return
        for answer in outcome.values():
            self.metrics.declarations.labels(answer).inc()
        log.info("%s/%s: declared gone to the rendezvous: %s", job.namespace, job.name, outcome)

    def _note_refusal(self, job: Job, write: Write, error: KubeError, now: float) -> None:
        """A new worker the API server refused for what it is (admission, validation), not for
        its own state: the next passes hold the job's new workers back (`Refusal`)."""
        if _creates_a_worker(write) and error.status in REFUSED_STATUSES:
            assert isinstance(write, CreateChild)
            name = write.body["metadata"]["name"]
            self._refusals[job.key] = Refusal(name, _api_message(error), now)

    def _execute(self, job: Job, write: Write) -> tuple[Json | None, Store[Any]]:
        """One write through `ClusterIO`, and the store its answer feeds."""
        io, ns, stores = self.io, job.namespace, self.stores
        match write:
            case PatchStatus(patch):
                return io.patch_job_status(ns, job.name, patch), stores["jobs"]
            case DeletePod(name, uid, grace_seconds):
                return io.delete_pod(ns, name, uid, grace_seconds), stores["pods"]
            case CreateChild(ChildKind.POD, body):
                return io.create_pod(ns, body), stores["pods"]
            case CreateChild(ChildKind.SERVICE, body):
                return io.create_service(ns, body), stores["services"]
            case CreateChild(ChildKind.NETWORK_POLICY, body):
                return io.create_network_policy(ns, body), stores["networkpolicies"]
            case CreateChild(ChildKind.WORKLOAD, body):
                return io.create_workload(ns, body), stores["workloads"]
            case CreateChild(ChildKind.SECRET, body):
                io.create_secret(ns, with_token(body, job_token(self._token_key, job.uid)))
                return None, stores["jobs"]  # the cache keeps no Secret (the operator reads none)
            case PatchWorkload(name, patch, status):
                return io.patch_workload(ns, name, patch, status), stores["workloads"]
            case AnnotatePod(name, uid, annotations):
                return io.annotate_pod(ns, name, uid, annotations), stores["pods"]
        raise AssertionError(f"unknown write {write!r}")

    def _event(self, job: Job, type_: str, reason: str, message: str, now: float) -> None:
        try:
            self.io.record_event(job.namespace, job.name, job.uid, type_, reason, message, now)
        except KubeError as error:
            log.warning("%s/%s: event not recorded: %s", job.namespace, job.name, error.status)


def _described(pods: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{name} ({evidence})" for name, evidence in pods)


def _creates_a_worker(write: Write) -> bool:
    return (
        isinstance(write, CreateChild)
        and write.kind == ChildKind.POD
        and write.body["metadata"].get("labels", {}).get(contract.LABEL_ROLE) == contract.ROLE_WORKER
    )


def _api_message(error: KubeError) -> str:
    """The `message` of the API server's Status answer, else its body, at most 512 characters."""
    try:
        answer = json.loads(error.body)
    except ValueError:
        answer = None
    message = answer.get("message") if isinstance(answer, dict) else None
    return str(message or error.body)[:512]


def _child_key(raw: Json) -> tuple[JobKey, str]:
    """A Service's or NetworkPolicy's job (from its label) and name."""
    metadata = raw["metadata"]
    return (metadata["namespace"], metadata["labels"][contract.LABEL_JOB_NAME]), metadata["name"]


def _job_sample(plan: Plan) -> JobSample:
    status = plan.status
    return JobSample(
        key=plan.job.key,
        phase=str(status["phase"]),
        desired=int(status["desiredReplicas"]),
        current=int(status["replicas"]),
        ready=int(status["readyReplicas"]),
        gpus_per_worker=plan.job.gpus_per_worker,
    )
