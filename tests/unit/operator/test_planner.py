"""Per-job planner: (observed pods and nodes, job and its recorded status, allocator size, now) -> plan."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.builders import NOW, JobBuilder, make_job, make_node, make_rendezvous, make_worker
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.model import (
    LABEL_GPU_MEMORY,
    LABEL_GPU_REPLICAS,
    Job,
    Node,
    Pod,
    Taint,
    format_time,
)
from ebbflow_operator.decision.plan import Observed, Plan, PlannerConfig, Refusal
from ebbflow_operator.decision.planner import plan_job, writes_of
from ebbflow_operator.decision.writes import ChildKind, CreateChild

CONFIG = PlannerConfig(pending_timeout=60, hold_seconds=300)
NODES = {"od-0": make_node("od-0"), "od-1": make_node("od-1"), "spot-0": make_node("spot-0", spot=True)}
SERVICES = frozenset({"j-pods"})


def job(lo: int = 2, hi: int = 4, status: dict[str, Any] | None = None, **spec: object) -> Job:
    return make_job(JobBuilder("j").replicas(lo, hi).set(leaveGraceSeconds=30, **spec), status=status)


J = job()  # the owner of the pods below (name, namespace and uid are all that matter)
RDZV = make_rendezvous(J)


def worker(index: int, node: str | None = "od-0", phase: str = "Running", **fields: Any) -> Pod:
    return make_worker(J, index, node, phase, **fields)


def running_status(pods: list[Pod], desired: int, **extra: object) -> dict[str, Any]:
    """The status a previous pass wrote for these pods."""
    raw = {
        "phase": "Running",
        "desiredReplicas": desired,
        "worldGeneration": 1,
        "observedGeneration": 1,
        "workerNodes": {p.name: p.node for p in pods if p.node},
        **extra,
    }
    return raw


def plan(j: Job, pods: list[Pod], desired: int, nodes: dict[str, Node] = NODES) -> Plan:
    return plan_job(j, Observed([*pods, RDZV], SERVICES, nodes, desired, free_gpus=3), NOW, CONFIG)


def test_new_job_gets_rendezvous_service_and_workers() -> None:
    result = plan_job(job(), Observed([], frozenset(), NODES, 3, 12), NOW, CONFIG)
    assert result.create_rendezvous_pod
    assert result.create_service
    assert result.create_workers == ((0, 1), (1, 1), (2, 1))
    assert result.status["phase"] == "Pending"
    assert result.status["desiredReplicas"] == 3
    assert result.status["lastRescale"]["reason"] == "SpecChanged"
    assert result.status["workerNodes"] == {"j-worker-0": "", "j-worker-1": "", "j-worker-2": ""}


def test_created_worker_that_never_appeared_is_not_a_preemption() -> None:
    """The operator died after writing status and before creating the pod: create it again."""
    recorded = {"phase": "Pending", "desiredReplicas": 1, "workerNodes": {"j-worker-0": ""}}
    result = plan(job(lo=1, status=recorded), [], 1)
    assert result.preemptions == 0
    assert result.create_workers == ((0, 1),)


@pytest.mark.parametrize(
    "pod",
    [
        worker(1, phase="Failed", exit_code=137),
        worker(1, node="gone-node"),
        worker(1, phase="Failed", exit_code=1),
    ],
    ids=["preempted", "node-gone", "failed"],
)
def test_pods_seen_by_a_previous_pass_are_deleted_again_but_not_counted_again(pod: Pod) -> None:
    """The operator died after writing status (which dropped the pod) and before deleting it."""
    pods = [worker(0), pod]
    status = running_status([worker(0)], 2, preemptions=1, restarts=1)
    result = plan(job(lo=1, status=status), pods, 2)
    assert [d.name for d in result.delete] == ["j-worker-1"]
    assert result.status["preemptions"] == 1 and result.status["restarts"] == 1


@pytest.mark.parametrize(
    ("rendezvous", "deleted"),
    [
        (RDZV, False),
        (replace(RDZV, phase="Failed"), True),
        (replace(RDZV, node="gone-node"), True),
    ],
    ids=["running", "ended", "node-gone"],
)
def test_rendezvous_pod_is_replaced_when_it_ends_or_loses_its_node(rendezvous: Pod, deleted: bool) -> None:
    result = plan_job(job(), Observed([rendezvous], SERVICES, NODES, 2, 12), NOW, CONFIG)
    assert [d.name for d in result.delete] == (["j-rdzv"] if deleted else [])
    assert not result.create_rendezvous_pod, "created again once the old one is gone"
    gone = plan_job(job(), Observed([], SERVICES, NODES, 2, 12), NOW, CONFIG)
    assert gone.create_rendezvous_pod


def test_steady_state_plans_nothing() -> None:
    pods = [worker(i, node) for i, node in enumerate(["od-0", "od-1", "spot-0"])]
    first = plan(job(status=running_status(pods, 3)), pods, 3)
    again = plan(job(status=first.status), pods, 3)
    assert not again.create_workers and not again.delete and not again.events
    assert again.status_patch == {}
    assert again.status["phase"] == "Running"


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        ({k: v for k, v in NODES.items() if k != "spot-0"}, "NodeLost"),
        ({**NODES, "spot-0": replace(NODES["spot-0"], taints=())}, "Evicted"),
    ],
)
def test_vanished_worker_is_a_preemption(nodes: dict[str, Node], reason: str) -> None:
    pods = [worker(0, "od-0"), worker(1, "od-1"), worker(2, "spot-0")]
    j = job(status=running_status(pods, 3))
    result = plan(j, pods[:2], 2, nodes)
    assert result.preemptions == 1
    assert result.status["preemptions"] == 1
    assert result.status["lastRescale"] == {
        "time": format_time(NOW),
        "from": 3,
        "to": 2,
        "reason": "Preemption",
    }
    [condition] = [c for c in result.status["conditions"] if c["type"] == "Preempted"]
    assert condition["status"] == "True" and condition["reason"] == reason
    assert any(e.reason == "Preempted" and "j-worker-2" in e.message for e in result.events)
    assert not result.delete and not result.create_workers
    assert result.status["phase"] == "Running"


def test_worker_deleted_by_someone_else_is_a_preemption() -> None:
    pods = [worker(0), worker(1)]
    evicting = replace(pods[1], deleting=True, disruption="EvictionByEvictionAPI")
    result = plan(job(lo=1, status=running_status(pods, 2)), [pods[0], evicting], 2)
    assert result.preemptions == 1 and not result.delete
    again = plan(job(lo=1, status=result.status), [pods[0], evicting], 2)
    assert again.preemptions == 0, "counted once"


def test_lost_worker_is_replaced_when_capacity_allows() -> None:
    pods = [worker(0, "od-0"), worker(1, "od-1")]
    result = plan(job(status=running_status(pods, 2)), pods[:1], 2)
    assert result.preemptions == 1
    assert result.create_workers == ((1, 2),)


@pytest.mark.parametrize(
    ("pod", "lost"),
    [
        (worker(1, phase="Failed", exit_code=137), True),
        (worker(1, phase="Failed", exit_code=143), True),
        (worker(1, phase="Failed", exit_code=contract.EXIT_LEAVE_TIMED_OUT), True),
        (worker(1, phase="Failed", exit_code=1, disruption="DeletionByTaintManager"), True),
        (worker(1, phase="Failed", exit_code=1), False),
        (worker(1, node="gone-node"), True),
        (worker(1, node="terminating"), True),
    ],
    ids=["sigkill", "sigterm", "leave-timed-out", "disruption", "real-failure", "node-gone", "noexecute"],
)
def test_preemption_is_not_failure(pod: Pod, lost: bool) -> None:
    pods = [worker(0), pod]
    termination = Taint("ebbflow.dev/spot-termination", "NoExecute", "true")
    nodes = {**NODES, "terminating": Node("terminating", 4, taints=(termination,))}
    result = plan(job(lo=1, status=running_status(pods, 2)), pods, 2, nodes)
    assert result.preemptions == int(lost)
    assert result.status["restarts"] == int(not lost)
    assert [d.name for d in result.delete] == ["j-worker-1"]
    assert result.create_workers == ((2, 2),), "a replacement under a new name"


def test_a_worker_killed_past_its_leave_grace_is_reported_once_with_its_words() -> None:
    """The launcher's termination message reaches the LeaveTimedOut condition and a warning while the
    deleted pod is still seen; the next pass, which sees it again, reports nothing new."""
    pods = [worker(0), worker(1)]
    words = "the training processes did not stop within 55 s of SIGTERM"
    leaving = replace(
        pods[1],
        deleting=True,
        exit_code=contract.EXIT_LEAVE_TIMED_OUT,
        termination_message=words,
    )
    result = plan(job(lo=1, status=running_status(pods[:1], 1)), [pods[0], leaving], 1)
    [late] = [c for c in result.status["conditions"] if c["type"] == "LeaveTimedOut"]
    message = f"j-worker-1 exited {contract.EXIT_LEAVE_TIMED_OUT}: {words}"
    assert (late["status"], late["reason"], late["message"]) == ("True", "GraceExceeded", message)
    assert [e.message for e in result.events if e.reason == "LeaveTimedOut"] == [message]
    assert result.status["restarts"] == 0, "a leave, not a failure"
    again = plan(job(lo=1, status=result.status), [pods[0], leaving], 1)
    assert not [e for e in again.events if e.reason == "LeaveTimedOut"], "reported once"


@pytest.mark.parametrize(
    ("leaving", "phase"),
    [
        pytest.param(worker(2, node="gone-node"), "Running", id="node-gone"),
        pytest.param(worker(2, phase="Failed", exit_code=137), "Running", id="preempted-exit"),
        pytest.param(worker(2, node="terminating"), "Scaling", id="noexecute-still-handing-over"),
    ],
)
def test_a_lost_worker_that_runs_nowhere_does_not_hold_the_job_in_scaling(leaving: Pod, phase: str) -> None:
    """Node loss lands in one pass: the status written before the deletion already says Running at
    the smaller size, since the deleted pod runs nowhere (a NoExecute eviction still hands over)."""
    pods = [worker(0, "od-0"), worker(1, "od-1"), leaving]
    termination = Taint("ebbflow.dev/spot-termination", "NoExecute", "true")
    nodes = {**NODES, "terminating": Node("terminating", 4, taints=(termination,))}
    result = plan(job(lo=1, status=running_status(pods, 3)), pods, 2, nodes)
    assert [d.name for d in result.delete] == ["j-worker-2"] and not result.create_workers
    assert (result.status["phase"], result.status["desiredReplicas"], result.status["replicas"]) == (
        phase,
        2,
        2,
    )


def test_a_rendezvous_pod_on_a_lost_node_does_not_hold_the_job_in_scaling() -> None:
    """The store runs nowhere once its node is gone: the job stays Running while the pod is deleted
    (this pass) and created again (the next); the workers find the new one by the same name."""
    pods = [worker(0, "od-0"), worker(1, "od-1")]
    lost_store = replace(RDZV, node="gone-node")
    result = plan_job(
        job(lo=1, status=running_status(pods, 2)),
        Observed([*pods, lost_store], SERVICES, NODES, 2, 12),
        NOW,
        CONFIG,
    )
    assert [d.name for d in result.delete] == ["j-rdzv"]
    assert result.status["phase"] == "Running"


def test_scale_down_keeps_workers_together_takes_spot_first_and_gives_grace() -> None:
    pods = [
        worker(0, "od-0", age=500),
        worker(1, "spot-0", age=400),
        worker(2, "od-1", age=10),
        worker(3, "od-1", age=300),
    ]
    result = plan(job(lo=1, status=running_status(pods, 4)), pods, 2)
    assert [(d.name, d.grace_seconds) for d in result.delete] == [("j-worker-1", 30), ("j-worker-0", 30)]
    assert result.status["workerNodes"] == {"j-worker-2": "od-1", "j-worker-3": "od-1"}
    assert result.status["lastRescale"]["reason"] == "CapacityReclaimed"
    assert result.status["phase"] == "Scaling"


def test_a_growth_runs_where_the_policy_placed_it() -> None:
    """The policy priced the growth on od-1 (`Allocation.growth`): the new workers must run there,
    where the scheduler would have spread them as it liked."""
    pods = [worker(0, "od-0"), worker(1, "od-0")]
    j = job(lo=1, status=running_status(pods, 2))
    seen = Observed([*pods, RDZV], SERVICES, NODES, 4, free_gpus=6, growth=("od-1", "od-1"))
    result = plan_job(j, seen, NOW, CONFIG)
    assert (result.create_workers, result.pins) == (((2, 2), (3, 2)), ("od-1", "od-1"))
    bodies = [w.body for w in writes_of(result, {}) if isinstance(w, CreateChild) and w.kind is ChildKind.POD]
    assert bodies == [manifests.worker_pod(j, i, 2, {}, node="od-1") for i in (2, 3)]


def test_a_replacement_is_not_pinned() -> None:
    """A worker lost this pass: the job's world changes anyway, the policy's growth is not what this
    pass replaces, and the scheduler places the new worker."""
    pods = [worker(0, "od-0"), worker(1, "od-0", phase="Failed")]
    j = job(lo=1, status=running_status(pods, 2))
    seen = Observed([*pods, RDZV], SERVICES, NODES, 2, free_gpus=6, growth=("od-1",))
    result = plan_job(j, seen, NOW, CONFIG)
    assert len(result.create_workers) == 1 and result.pins == ()


def test_a_move_onto_one_node_replaces_the_workers_elsewhere_with_pinned_ones() -> None:
    """Same size, new world: the two workers off od-0 leave with their grace, two new ones must run
    on od-0; the job is Scaling until they are ready, and no rescale is recorded (the size stays)."""
    pods = [worker(0, "od-0"), worker(1, "od-0"), worker(2, "od-1"), worker(3, "spot-0")]
    j = job(lo=1, status=running_status(pods, 4))
    seen = Observed([*pods, RDZV], SERVICES, NODES, 4, free_gpus=3, moves=("od-0", "od-0"))
    result = plan_job(j, seen, NOW, CONFIG)
    assert [(d.name, d.grace_seconds, d.reason) for d in result.delete] == [
        ("j-worker-2", 30, "move onto one node"),
        ("j-worker-3", 30, "move onto one node"),
    ]
    assert (result.create_workers, result.pins) == (((4, 2), (5, 2)), ("od-0", "od-0"))
    assert [e.reason for e in result.events] == ["MovedOntoOneNode"]
    assert (result.status["phase"], result.status["desiredReplicas"]) == ("Scaling", 4)
    assert "lastRescale" not in result.status


def test_unscheduled_workers_go_first() -> None:
    pods = [worker(0, "spot-0"), worker(1, "od-0"), worker(2, None, phase="Pending", age=5)]
    result = plan(job(lo=1, status=running_status(pods, 3)), pods, 2)
    assert [(d.name, d.grace_seconds) for d in result.delete] == [("j-worker-2", 0)]


def test_below_min_the_job_waits_with_a_reason() -> None:
    pods = [worker(0), worker(1)]
    result = plan(job(lo=3, hi=4, status=running_status(pods, 2)), pods, 2)
    assert result.status["desiredReplicas"] == 0
    assert {d.name for d in result.delete} == {"j-worker-0", "j-worker-1"}
    assert result.status["phase"] == "Pending"
    [schedulable] = [c for c in result.status["conditions"] if c["type"] == "Schedulable"]
    assert schedulable["status"] == "False" and schedulable["reason"] == "InsufficientGPUs"
    assert "min 3" in schedulable["message"]


POD_SECURITY = 'pods "j-worker-1" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot'


def test_a_refused_worker_holds_back_new_workers_and_the_generation_and_says_why() -> None:
    """While a refused worker's back-off lasts (decide's filter), a pass creates no worker, so the
    status it writes is the one the last pass wrote: no write, no watch event, no next pass."""
    pods = [worker(0)]
    refusal = Refusal("j-worker-1", POD_SECURITY, NOW)
    policies = frozenset({"j-pods"})
    refused = Observed([*pods, RDZV], SERVICES, NODES, 3, 3, network_policies=policies, refused=refusal)
    first = plan_job(job(status=running_status(pods, 3)), refused, NOW, CONFIG)
    assert first.create_workers == ()
    assert first.status["worldGeneration"] == 1
    [schedulable] = [c for c in first.status["conditions"] if c["type"] == "Schedulable"]
    assert (schedulable["status"], schedulable["reason"]) == ("False", "WorkerRefused")
    assert "j-worker-1" in schedulable["message"] and "runAsNonRoot" in schedulable["message"]
    assert "spec.template" in schedulable["message"]
    again = plan_job(job(status=first.status), refused, NOW + 1, CONFIG)
    assert again.status_patch == {} and not again.has_work
    lapsed = plan_job(job(status=first.status), replace(refused, refused=None), NOW + 31, CONFIG)
    assert [index for index, _ in lapsed.create_workers] == [1, 2]
    assert lapsed.status["worldGeneration"] == 2


def test_pending_timeout_withdraws_and_holds_the_size() -> None:
    pods = [
        worker(0),
        worker(1, None, phase="Pending", age=61, refused=61),
        worker(2, None, phase="Pending", age=5),
    ]
    result = plan(job(lo=1, status=running_status(pods, 3)), pods, 3)
    assert [d.name for d in result.delete][:1] == ["j-worker-1"]
    assert result.status["holdReplicas"] == 1
    assert result.status["desiredReplicas"] == 1
    assert result.status["lastRescale"]["reason"] == "PendingTimeout"
    assert any(e.reason == "WorkersWithdrawn" for e in result.events)
    held = plan(job(lo=1, status=result.status), [worker(0)], 3)
    assert held.status["desiredReplicas"] == 1 and not held.create_workers


def test_too_many_failures_fail_the_job_and_clean_up() -> None:
    pods = [worker(0), worker(1, phase="Failed", exit_code=2)]
    result = plan(job(lo=1, maxRestarts=1, status=running_status(pods, 2, restarts=1)), pods, 2)
    assert result.status["phase"] == "Failed"
    [failed] = [c for c in result.status["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "TooManyFailures" and "maxRestarts=1" in failed["message"]
    assert {d.name for d in result.delete} == {"j-worker-0", "j-rdzv"}, "failed pod kept for its logs"
    assert not result.create_workers


@pytest.mark.parametrize(
    ("code", "reason"),
    [pytest.param(code, reason, id=reason) for code, reason in contract.FATAL_EXIT_REASONS.items()],
)
def test_fatal_exit_fails_at_once(code: int, reason: str) -> None:
    """No restart can cure it: the job fails with restarts left, replaces nobody and keeps the pod."""
    pods = [worker(0, phase="Failed", exit_code=code, termination_message="why"), worker(1)]
    result = plan(job(lo=1, maxRestarts=5, status=running_status(pods, 2)), pods, 2)
    assert result.status["phase"] == "Failed"
    [failed] = [c for c in result.status["conditions"] if c["type"] == "Failed"]
    assert (failed["reason"], failed["message"]) == (reason, f"j-worker-0 exited {code} ({reason}): why")
    assert result.status["restarts"] == 1, "counted once, like every real failure"
    assert not result.create_workers
    assert {d.name for d in result.delete} == {"j-worker-1", "j-rdzv"}, "failed pod kept for its logs"


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("Running", {"j-rdzv"}), ("All", {"j-rdzv", "j-worker-0", "j-worker-1"}), ("None", set())],
)
def test_success_and_clean_pod_policy(policy: str, deleted: set[str]) -> None:
    pods = [worker(0, phase="Succeeded", exit_code=0), worker(1, phase="Succeeded", exit_code=0)]
    result = plan(job(lo=1, cleanPodPolicy=policy, status=running_status(pods, 2)), pods, 2)
    assert result.status["phase"] == "Succeeded"
    assert {d.name for d in result.delete} == deleted
    assert not result.create_workers


def test_finishing_job_does_not_grow_or_replace() -> None:
    pods = [worker(0, phase="Succeeded", exit_code=0), worker(1)]
    result = plan(job(lo=1, status=running_status(pods, 2)), pods, 4)
    assert result.status["phase"] == "Running"
    assert not result.create_workers and not result.delete


def test_progress_is_copied_from_the_newest_report() -> None:
    old = json.dumps({"step": 1, "samples": 64, "loss": 2.5, "time": "2026-01-01T00:00:00Z"})
    new = json.dumps({"step": 9, "samples": 576, "loss": 1.5, "time": "2026-01-01T00:01:00Z", "x": 1})
    pods = [worker(0, progress=old), worker(1, progress=new)]
    result = plan(job(lo=1, status=running_status(pods, 2)), pods, 2)
    assert result.status["progress"]["step"] == 9 and "x" not in result.status["progress"]


def test_compression_rate_reaches_the_status_and_stays_there() -> None:
    """The band-limited trainers' rate is a progress field: copied into status.progress, and a pass
    that sees the same report again writes nothing (the status model keeps the field)."""
    report = {"step": 9, "samples": 576, "time": "2026-01-01T00:01:00Z", "compressionRate": 0.5}
    pods = [worker(0, progress=json.dumps(report)), worker(1)]
    first = plan(job(lo=1, status=running_status(pods, 2), bandLimit={}), pods, 2)
    assert first.status["progress"]["compressionRate"] == 0.5
    again = plan(job(lo=1, status=first.status, bandLimit={}), pods, 2)
    assert again.status_patch == {}


GFD_NODES = {  # labelled as NVIDIA's GPU feature discovery labels them: 40960 MiB GPUs, shared 2 ways
    name: make_node(name, labels={LABEL_GPU_MEMORY: "40960", LABEL_GPU_REPLICAS: "2"}) for name in NODES
}


def annotated(pods: list[Pod], result: Plan) -> list[Pod]:
    """The pods after the reconciler applied the plan's budget annotations."""
    values = {u.name: str(u.value) for u in result.update_memory_budget}
    return [replace(p, memory_budget=values.get(p.name, p.memory_budget)) for p in pods]


def test_band_limited_workers_are_annotated_once_and_told_each_change_once() -> None:
    pods = [worker(0), worker(1, "od-1")]
    limited = job(lo=1, status=running_status(pods, 2), bandLimit={})
    first = plan(limited, pods, 2, GFD_NODES)
    assert [(u.name, u.value) for u in first.update_memory_budget] == [
        ("j-worker-0", 20480),
        ("j-worker-1", 20480),
    ]
    assert first.memory_budget == 20480 and not first.events
    pods = annotated(pods, first)
    assert not plan(limited, pods, 2, GFD_NODES).update_memory_budget

    fixed = job(lo=1, status=running_status(pods, 2), bandLimit={"memoryBudgetMiB": 12000})
    changed = plan(fixed, pods, 2, GFD_NODES)
    assert [u.value for u in changed.update_memory_budget] == [12000, 12000]
    assert [(e.reason, e.message) for e in changed.events] == [
        ("MemoryBudgetChanged", "memory budget 20480 MiB -> 12000 MiB per worker")
    ]
    settled = plan(fixed, annotated(pods, changed), 2, GFD_NODES)
    assert not settled.update_memory_budget and not settled.events


def test_a_job_without_band_limit_gets_no_budget_on_labelled_nodes() -> None:
    pods = [worker(0), worker(1, "od-1")]
    result = plan(job(lo=1, status=running_status(pods, 2)), pods, 3, GFD_NODES)
    assert result.create_workers and result.memory_budget is None and not result.update_memory_budget


def test_worker_env_and_names_follow_the_contract() -> None:
    from ebbflow_operator.decision.manifests import worker_pod

    body = worker_pod(job(), 3, 7)
    assert body["metadata"]["name"] == "j-worker-3"
    assert body["metadata"]["labels"][contract.LABEL_WORKER_INDEX] == "3"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-j"
    env = {e["name"]: e.get("value") for e in body["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_RDZV_ENDPOINT] == f"j-rdzv.j-pods.ns.svc:{contract.RENDEZVOUS_PORT}"
    assert env[contract.ENV_WORLD_GENERATION] == "7"
    assert env[contract.ENV_VIRTUAL_NODES] == "4"
    assert body["spec"]["terminationGracePeriodSeconds"] == 30
    assert body["spec"]["restartPolicy"] == "Never"
