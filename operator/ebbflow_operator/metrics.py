"""Prometheus metrics on /metrics (prometheus-client, its own registry so tests can start several).

The gauges of the cluster's state (jobs, their workers, GPUs) come from the leader's passes only; a
standby exports none of them (`forget_cluster_state`), so sums over the operator's replicas count
each job once."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from dataclasses import dataclass

from ebbflow_api.models import Phase
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .decision.model import JobKey


@dataclass(frozen=True)
class JobSample:
    """One job's per-pass gauges, from the status the pass computed."""

    key: JobKey
    phase: str
    desired: int
    current: int
    ready: int
    gpus_per_worker: int


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("ebbflow_jobs", "ElasticTrainingJobs by phase.", ["phase"], registry=r)
        self.desired = Gauge(
            "ebbflow_job_desired_workers",
            "Workers the allocator gives a job.",
            ["namespace", "job"],
            registry=r,
        )
        self.current = Gauge(
            "ebbflow_job_current_workers",
            "Worker pods a job has (not leaving).",
            ["namespace", "job"],
            registry=r,
        )
        self.ready = Gauge(
            "ebbflow_job_ready_workers",
            "Worker pods of a job that are running and ready.",
            ["namespace", "job"],
            registry=r,
        )
        self.allocated_gpus = Gauge(
            "ebbflow_job_allocated_gpus",
            "GPUs the allocator gives a job (desired workers x GPUs per worker).",
            ["namespace", "job"],
            registry=r,
        )
        self.rescales = Counter("ebbflow_rescales", "Job size changes by reason.", ["reason"], registry=r)
        self.preemptions = Counter("ebbflow_preemptions", "Workers lost to preemption.", registry=r)
        self.decision_latency = Histogram(
            "ebbflow_decision_latency_seconds",
            "From the first change noticed to the resulting writes applied.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.pass_seconds = Histogram(
            "ebbflow_pass_seconds",
            "One reconcile pass by part: observe (read the cache), decide (the pure decisions), apply.",
            ["part"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
        self.relist_seconds = Histogram(
            "ebbflow_relist_seconds",
            "One periodic full list of nodes, pods, jobs, Services and NetworkPolicies.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.api_requests = Counter(
            "ebbflow_api_requests",
            "Requests the operator made to the API server (lists, writes, the Lease; not kopf's watches).",
            ["verb", "resource"],
            registry=r,
        )
        self.deferred_plans = Counter(
            "ebbflow_deferred_plans",
            "Jobs' plans a pass left for the next one (over --max-writes-per-pass).",
            registry=r,
        )
        self.reconcile_errors = Counter("ebbflow_reconcile_errors", "Failed passes or writes.", registry=r)
        self.declarations = Counter(
            "ebbflow_declared_workers",
            "Workers declared gone to their job's rendezvous, by its answer (removed, not a member, "
            "unknown pod) or failed (no answer).",
            ["outcome"],
            registry=r,
        )
        self.gpus = Gauge("ebbflow_cluster_gpus", "GPUs on usable selected nodes.", ["state"], registry=r)
        self.leader = Gauge(
            "ebbflow_operator_leader", "1 while this replica acts (holds the Lease).", registry=r
        )
        self.cache_unparsable = Counter(
            "ebbflow_cache_unparsable_objects",
            "Object versions the operator could not parse and ignores (e.g. a job from a newer schema).",
            ["kind"],
            registry=r,
        )
        self._jobs_seen: set[JobKey] = set()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def forget_cluster_state(self) -> None:
        """A standby reports no jobs and no GPUs: only the leader's pass knows them. A replica that led
        and lost the Lease would otherwise export its last pass's values beside the new leader's, and
        every sum over replicas (the dashboard's) would count them twice. Counters and histograms
        (what this replica did) stay."""
        for gauge in (self.desired, self.current, self.ready, self.allocated_gpus, self.jobs, self.gpus):
            gauge.clear()
        self._jobs_seen = set()

    def record_jobs(self, jobs: Iterable[JobSample]) -> None:
        """Per-pass gauges; series of vanished jobs are removed."""
        per_job = (self.desired, self.current, self.ready, self.allocated_gpus)
        phases: Tally[str] = Tally()
        seen: set[JobKey] = set()
        for job in jobs:
            phases[job.phase] += 1
            seen.add(job.key)
            values = (job.desired, job.current, job.ready, job.desired * job.gpus_per_worker)
            for gauge, value in zip(per_job, values, strict=True):
                gauge.labels(*job.key).set(value)
        for phase in Phase:
            self.jobs.labels(phase).set(phases[phase])
        for key in self._jobs_seen - seen:
            for gauge in per_job:
                gauge.remove(*key)
        self._jobs_seen = seen
