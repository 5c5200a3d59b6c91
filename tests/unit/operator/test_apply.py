"""The Reconciler's writes, through an in-memory fake of its own `ClusterIO` interface (not of the
Kubernetes API): the order a plan is applied in, and what a failed write stops."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.builders import NOW, JobBuilder, make_job, with_writes
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.decide import OperatorConfig
from ebbflow_operator.decision.model import Json, format_time
from ebbflow_operator.decision.plan import BatchUpdate, BudgetUpdate, Deletion, Event, Plan
from ebbflow_operator.decision.writes import DeclareGone
from ebbflow_operator.declarer import DeclarationError, job_token
from ebbflow_operator.errors import KubeError
from ebbflow_operator.metrics import Metrics
from ebbflow_operator.reconciler import RELIST_SHARE, Reconciler, relist_wait

Call = tuple[str, str]  # (operation, object name; the reason for events)


class FakeCluster:
    """Records every call in order. `fail` maps "operation" or "operation name" to the error that
    call raises. Writes answer None (nothing for the cache to learn)."""

    def __init__(self, fail: dict[str, KubeError] | None = None) -> None:
        self.fail = fail or {}
        self.calls: list[Call] = []
        self.jobs: list[Json] = []
        self.created_pods: list[Json] = []
        self.secrets: list[Json] = []
        self.annotations: list[tuple[str, str, Json]] = []  # (pod, uid precondition, annotations)

    def _call(self, operation: str, name: str) -> None:
        self.calls.append((operation, name))
        error = self.fail.get(f"{operation} {name}") or self.fail.get(operation)
        if error is not None:
            raise error

    def list_nodes(self) -> tuple[list[Json], int]:
        return [], 1

    def list_pods(self) -> tuple[list[Json], int]:
        return [], 1

    def list_jobs(self) -> tuple[list[Json], int]:
        return list(self.jobs), 1

    def list_services(self) -> tuple[list[Json], int]:
        return [], 1

    def list_network_policies(self) -> tuple[list[Json], int]:
        return [], 1

    def list_workloads(self) -> tuple[list[Json], int]:
        return [], 1

    def list_resource_flavors(self) -> tuple[list[Json], int]:
        return [], 1

    def create_pod(self, namespace: str, body: Json) -> Json | None:
        self._call("create_pod", body["metadata"]["name"])
        self.created_pods.append(body)
        return None

    def create_service(self, namespace: str, body: Json) -> Json | None:
        self._call("create_service", body["metadata"]["name"])
        return None

    def create_network_policy(self, namespace: str, body: Json) -> Json | None:
        self._call("create_network_policy", body["metadata"]["name"])
        return None

    def create_secret(self, namespace: str, body: Json) -> Json | None:
        self._call("create_secret", body["metadata"]["name"])
        self.secrets.append(body)
        return None

    def create_workload(self, namespace: str, body: Json) -> Json | None:
        self._call("create_workload", body["metadata"]["name"])
        return None

    def patch_workload(self, namespace: str, name: str, patch: Sequence[Json], status: bool) -> Json | None:
        self._call("patch_workload", name)
        return None

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> Json | None:
        self._call("delete_pod", name)
        return None

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Json) -> Json | None:
        self._call("annotate_pod", name)
        self.annotations.append((name, uid, annotations))
        return None

    def patch_job_status(self, namespace: str, name: str, patch: Json) -> Json | None:
        self._call("patch_job_status", name)
        return None

    def record_event(
        self, namespace: str, name: str, uid: str, type_: str, reason: str, message: str, now: float
    ) -> None:
        self._call("record_event", reason)


JOB = make_job(JobBuilder("train").replicas(1, 4))
RDZV = manifests.rendezvous_name("train")
SERVICE = manifests.service_name("train")
FULL = with_writes(
    Plan(
        job=JOB,
        status_patch={"desiredReplicas": 2},
        delete=(Deletion("train-worker-3", "uid-train-3", 30, "scale down"),),
        create_rendezvous_pod=True,
        create_service=True,
        create_network_policy=True,
        create_workers=((4, 2),),
        events=(Event("Normal", "Rescaled", "3 -> 2 workers"),),
    )
)
STATUS: Call = ("patch_job_status", "train")
DELETE: Call = ("delete_pod", "train-worker-3")
CREATES: list[Call] = [
    ("create_network_policy", manifests.network_policy_name("train")),
    ("create_secret", manifests.rendezvous_token_name("train")),
    ("create_pod", RDZV),
    ("create_service", SERVICE),
    ("create_pod", "train-worker-4"),
]
RESCALED: Call = ("record_event", "Rescaled")
ERROR: Call = ("record_event", "ReconcileError")


def reconciler(cluster: FakeCluster, metrics: Metrics | None = None) -> Reconciler:
    return Reconciler(cluster, OperatorConfig(), metrics or Metrics())


@pytest.mark.parametrize(
    ("plan", "fail", "calls", "failures"),
    [
        pytest.param(
            FULL, {}, [STATUS, DELETE, *CREATES, RESCALED], 0, id="status-then-deletions-then-creations"
        ),
        pytest.param(
            FULL, {"patch_job_status": KubeError(500)}, [STATUS, ERROR], 1, id="status-fails-nothing-else"
        ),
        pytest.param(
            FULL, {"patch_job_status": KubeError(422, "Invalid")}, [STATUS, ERROR], 1, id="status-rejected"
        ),
        pytest.param(
            FULL,
            {"delete_pod": KubeError(500)},
            [STATUS, DELETE, ERROR, *CREATES, RESCALED],
            1,
            id="deletion-fails-creations-go-on",
        ),
        pytest.param(
            with_writes(replace(FULL, status_patch={})),
            {"delete_pod": KubeError(500)},
            [DELETE, ERROR, *CREATES, RESCALED],
            1,
            id="no-status-patch-a-first-failure-is-not-fatal",
        ),
        pytest.param(
            FULL,
            {f"create_pod {RDZV}": KubeError(403, "Forbidden")},
            [STATUS, DELETE, *CREATES[:3], ERROR, *CREATES[3:], RESCALED],
            1,
            id="creation-fails-others-go-on",
        ),
        pytest.param(
            FULL,
            {"record_event": KubeError(500)},
            [STATUS, DELETE, *CREATES, RESCALED],
            0,
            id="events-are-best-effort",
        ),
        pytest.param(
            with_writes(
                replace(FULL, update_global_batch=(BatchUpdate("train-worker-0", "uid-train-0", 64),))
            ),
            {"annotate_pod train-worker-0": KubeError(500)},
            [STATUS, DELETE, *CREATES, ("annotate_pod", "train-worker-0"), ERROR, RESCALED],
            1,
            id="global-batch-annotated-after-creations",
        ),
        pytest.param(
            with_writes(
                replace(FULL, update_memory_budget=(BudgetUpdate("train-worker-0", "uid-train-0", 20480),))
            ),
            {"annotate_pod train-worker-0": KubeError(500)},
            [STATUS, DELETE, *CREATES, ("annotate_pod", "train-worker-0"), ERROR, RESCALED],
            1,
            id="memory-budget-annotated-after-creations",
        ),
        pytest.param(
            Plan(job=JOB, events=(Event("Warning", "Preempted", "lost 1"),)),
            {},
            [("record_event", "Preempted")],
            0,
            id="events-only",
        ),
    ],
)
def test_apply_order(plan: Plan, fail: dict[str, KubeError], calls: list[Call], failures: int) -> None:
    cluster = FakeCluster(fail)
    assert reconciler(cluster)._apply(plan) == failures
    assert cluster.calls == calls


def raw_job(name: str, **spec: Any) -> Json:
    raw = JobBuilder(name).replicas(1, 2).obj()
    metadata = {"namespace": "ns", "uid": f"uid-{name}", "generation": 1, "resourceVersion": "5"}
    raw["metadata"].update(metadata, creationTimestamp=format_time(NOW))
    raw["spec"].update(spec)
    return raw


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_failed_status_write_is_counted_and_stops_the_pass_for_that_job() -> None:
    metrics = Metrics()
    cluster = FakeCluster({"patch_job_status": KubeError(500, "Internal Server Error")})
    cluster.jobs = [raw_job("train")]
    loop = reconciler(cluster, metrics)
    loop.relist()
    loop.run_pass(now=NOW)
    assert cluster.calls == [STATUS, ERROR]
    assert sample(metrics, "ebbflow_reconcile_errors_total") == 1


def test_a_pass_applies_at_most_its_write_budget_and_wakes_the_next() -> None:
    """Three new jobs, each a status write, a NetworkPolicy, the rendezvous token's Secret, a
    rendezvous pod and a Service (5 writes): a budget of 11 applies two whole plans, counts the third
    as deferred and wakes the loop so the next pass applies it."""
    metrics = Metrics()
    cluster = FakeCluster()
    cluster.jobs = [raw_job(name) for name in ("a", "b", "c")]
    loop = Reconciler(cluster, OperatorConfig(max_writes_per_pass=11), metrics)
    loop.relist()
    loop.run_pass(now=NOW)
    statuses = [name for operation, name in cluster.calls if operation == "patch_job_status"]
    assert sorted(statuses) == ["a", "b"]
    assert len(cluster.calls) == 10
    assert sample(metrics, "ebbflow_deferred_plans_total") == 1
    assert loop._wake.is_set()


class BlockedStatusWrites(FakeCluster):
    """Status writes wait until `release` is set; lists are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.node_lists = 0

    def list_nodes(self) -> tuple[list[Json], int]:
        self.node_lists += 1
        return [], 1

    def patch_job_status(self, namespace: str, name: str, patch: Json) -> Json | None:
        self.release.wait(30)
        return super().patch_job_status(namespace, name, patch)


def test_full_lists_go_on_while_a_pass_is_writing() -> None:
    """A pass stuck in its writes does not hold the periodic relists back (at 20,000 pods a list
    took 30 s: in the loop, every pass waited for it)."""
    cluster = BlockedStatusWrites()
    cluster.jobs = [raw_job("train")]
    loop = Reconciler(cluster, OperatorConfig(relist_interval=0.05, debounce=0.0), Metrics())
    stop = threading.Event()
    runner = threading.Thread(target=loop.run_forever, args=(stop,))
    runner.start()
    try:
        loop.trigger()
        wait_for(lambda: cluster.node_lists >= 1, 10, "the first list")
        wait_for(lambda: cluster.node_lists >= 4, 10, "relists while the status write waits")
        assert cluster.calls == []  # the pass is still in its first write
    finally:
        cluster.release.set()
        stop.set()
        loop.trigger()
        runner.join(30)
    assert not runner.is_alive()
    assert ("patch_job_status", "train") in cluster.calls


def test_a_leader_that_loses_the_lease_stops_reporting_the_cluster() -> None:
    """Its last pass's gauges would stand beside the new leader's (the e2e dashboard saw the cluster's
    GPUs counted twice after a take-over)."""
    metrics = Metrics()
    cluster = FakeCluster()
    cluster.jobs = [raw_job("train")]
    leading = threading.Event()
    leading.set()
    loop = Reconciler(cluster, OperatorConfig(debounce=0.0), metrics, leading=leading.is_set)
    stop = threading.Event()
    runner = threading.Thread(target=loop.run_forever, args=(stop,))
    runner.start()
    try:
        loop.trigger()
        wait_for(lambda: sample(metrics, "ebbflow_jobs", phase="Pending") == 1, 10, "the leader's gauges")
        leading.clear()
        loop.trigger()
        wait_for(
            lambda: metrics.registry.get_sample_value("ebbflow_jobs", {"phase": "Pending"}) is None,
            10,
            "none",
        )
    finally:
        stop.set()
        loop.trigger()
        runner.join(30)
    assert not runner.is_alive()


@pytest.mark.parametrize(
    ("interval", "took", "wait"),
    [
        pytest.param(60, 0.2, 60, id="quick-list-keeps-the-interval"),
        pytest.param(60, 3.0, 60, id="exactly-the-share"),
        pytest.param(60, 30.0, 600, id="slow-list-stretches-the-wait"),
        pytest.param(600, 2.0, 600, id="long-interval-untouched"),
    ],
)
def test_relist_wait(interval: float, took: float, wait: float) -> None:
    assert relist_wait(interval, took) == pytest.approx(wait)
    assert took / (relist_wait(interval, took)) <= RELIST_SHARE + 1e-9


def test_the_cache_counts_unparsable_objects_in_metrics() -> None:
    metrics = Metrics()
    loop = reconciler(FakeCluster(), metrics)
    broken = raw_job("broken", replicas="many")
    for _ in range(3):
        loop.observe_event("jobs", broken, deleted=False)
    loop.observe_event("jobs", raw_job("fine"), deleted=False)
    assert [job.name for job in loop.stores["jobs"].values()] == ["fine"]
    assert sample(metrics, "ebbflow_cache_unparsable_objects_total", kind="jobs") == 1


@pytest.mark.parametrize(
    ("resync", "idle", "stalled"),
    [
        pytest.param(1.0, 60.0, False, id="a-minute-is-fine"),
        pytest.param(1.0, 121.0, True, id="over-two-minutes-fails"),
        pytest.param(30.0, 250.0, False, id="long-resync-allows-ten-intervals"),
        pytest.param(30.0, 301.0, True, id="over-ten-long-intervals-fails"),
    ],
)
def test_liveness_fails_once_no_pass_completed_for_long(resync: float, idle: float, stalled: bool) -> None:
    loop = Reconciler(FakeCluster(), OperatorConfig(resync_interval=resync), Metrics())
    started = loop.last_pass_at
    result = loop.stalled_for(started + idle)
    assert (result is not None) == stalled
    loop.run_pass()  # a completed pass resets the clock
    assert loop.last_pass_at > started and loop.stalled_for(loop.last_pass_at + 1.0) is None


def test_workers_get_the_trainer_service_account_the_planner_was_given() -> None:
    cluster = FakeCluster()
    reconciler(cluster)._apply(with_writes(FULL, {"": "ebbflow-trainer"}))
    accounts = {p["metadata"]["name"]: p["spec"].get("serviceAccountName") for p in cluster.created_pods}
    assert accounts == {RDZV: None, "train-worker-4": "ebbflow-trainer"}


def test_band_limited_workers_are_created_with_the_budget_and_told_its_changes() -> None:
    """New workers carry the plan's budget; each stale worker gets its own merge patch with the uid
    precondition, as the global batch does."""
    band_limited = make_job(JobBuilder("train").replicas(1, 4).band_limit())
    plan = with_writes(
        replace(
            FULL,
            job=band_limited,
            memory_budget=20480,
            update_memory_budget=(BudgetUpdate("train-worker-0", "uid-train-0", 20480),),
            update_global_batch=(BatchUpdate("train-worker-1", "uid-train-1", 128),),
        )
    )
    cluster = FakeCluster()
    assert reconciler(cluster)._apply(plan) == 0
    [worker] = [p for p in cluster.created_pods if p["metadata"]["name"] == "train-worker-4"]
    assert worker["metadata"]["annotations"][contract.ANNOTATION_MEMORY_BUDGET] == "20480"
    assert cluster.annotations == [
        ("train-worker-1", "uid-train-1", {contract.ANNOTATION_GLOBAL_BATCH_SIZE: "128"}),
        ("train-worker-0", "uid-train-0", {contract.ANNOTATION_MEMORY_BUDGET: "20480"}),
    ]


REFUSED_BODY = '{"kind":"Status","message":"pods \\"train-worker-4\\" is forbidden: violates PodSecurity"}'


@pytest.mark.parametrize(
    ("fail", "refused"),
    [
        pytest.param(
            {"create_pod train-worker-4": KubeError(403, "Forbidden", REFUSED_BODY)},
            ("train-worker-4", 'pods "train-worker-4" is forbidden: violates PodSecurity'),
            id="worker-refused-by-admission",
        ),
        pytest.param(
            {"create_pod train-worker-4": KubeError(422, "Unprocessable Entity", "not json")},
            ("train-worker-4", "not json"),
            id="worker-invalid",
        ),
        pytest.param(
            {"create_pod train-worker-4": KubeError(500, "Internal Server Error", REFUSED_BODY)},
            None,
            id="server-error-is-not-a-refusal",
        ),
        pytest.param(
            {f"create_pod {RDZV}": KubeError(403, "Forbidden", REFUSED_BODY)}, None, id="not-a-worker"
        ),
        pytest.param({}, None, id="created"),
    ],
)
def test_a_worker_refused_for_what_it_is_is_recorded_for_the_next_pass(
    fail: dict[str, KubeError], refused: tuple[str, str] | None
) -> None:
    loop = reconciler(FakeCluster(fail))
    loop._apply(FULL)
    recorded = loop._refusals.get(JOB.key)
    assert (None if recorded is None else (recorded.pod, recorded.message)) == refused


def test_a_worker_created_clears_the_jobs_refusal() -> None:
    loop = reconciler(FakeCluster({"create_pod train-worker-4": KubeError(403, "Forbidden", REFUSED_BODY)}))
    loop._apply(FULL)
    assert JOB.key in loop._refusals
    loop.io = FakeCluster()
    loop._apply(FULL)
    assert JOB.key not in loop._refusals


class FakeDeclarer:
    """Records each declaration (address, token, pods); raises `fail` while it is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[tuple[str, str]]]] = []
        self.fail: DeclarationError | None = None

    def declare(self, address: str, token: str, pods: Sequence[tuple[str, str]]) -> dict[str, str]:
        self.calls.append((address, token, list(pods)))
        if self.fail is not None:
            raise self.fail
        return {name: "removed" for name, _ in pods}


GONE = DeclareGone("10.1.2.3:29401", (("train-worker-1", "its node n1 is gone"),))


def test_dead_workers_are_declared_last_once_each_with_the_jobs_token() -> None:
    """A failed declaration is counted and made again by the next pass that still sees the workers;
    a declaration answered is never made again."""
    cluster, declarer, metrics = FakeCluster(), FakeDeclarer(), Metrics()
    applier = Reconciler(cluster, OperatorConfig(), metrics, declarer=declarer, token_key=b"key")
    plan = with_writes(replace(FULL, declare_gone=GONE))
    assert plan.writes[-1] == GONE
    declarer.fail = DeclarationError("connection refused")
    assert applier._apply(plan) == 0, "a declaration that fails is no API failure"
    wait_for(
        lambda: sample(metrics, "ebbflow_declared_workers_total", outcome="failed") == 1, 10, "a failure"
    )
    declarer.fail = None
    applier._apply(plan)
    wait_for(
        lambda: sample(metrics, "ebbflow_declared_workers_total", outcome="removed") == 1, 10, "an answer"
    )
    applier._apply(plan)
    applier._declaring.shutdown(wait=True)  # whatever the last apply sent has been sent
    token = job_token(b"key", JOB.uid)
    assert declarer.calls == [(GONE.address, token, list(GONE.pods))] * 2, "made again once, then never"
    assert cluster.secrets[0]["stringData"] == {contract.RDZV_TOKEN_KEY: token}


def test_every_operator_with_the_key_gives_a_job_the_same_token_and_another_job_another() -> None:
    assert job_token(b"key", "uid-1") == job_token(b"key", "uid-1")
    assert job_token(b"key", "uid-1") != job_token(b"key", "uid-2")
    assert job_token(b"key", "uid-1") != job_token(b"other", "uid-1")
