"""The planner's steps, one table each: every decision `plan_job` composes, tested on its own values."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_api.models import Phase
from ebbflow_devtools.builders import NOW, JobBuilder, make_job, make_node, make_rendezvous, make_worker
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.job_status import (
    job_status,
    lasting_fields,
    latest_progress,
    readiness,
    report_losses,
    rescale_reason,
    schedulable,
)
from ebbflow_operator.decision.model import (
    LABEL_GPU_MEMORY,
    LABEL_GPU_REPLICAS,
    Job,
    Node,
    Pod,
    Taint,
    format_time,
)
from ebbflow_operator.decision.plan import (
    BatchUpdate,
    BudgetUpdate,
    Deletion,
    Ending,
    Event,
    EventsAndConditions,
    Hold,
    Observed,
    Plan,
    PlannerConfig,
    RescaleReason,
    Sizing,
    Timeout,
    Workers,
    children,
)
from ebbflow_operator.decision.planner import (
    classify,
    clean_up,
    current_hold,
    end_of_job,
    global_batch,
    growth_pins,
    hold_cap,
    lost_reason,
    memory_budget,
    movers,
    new_workers,
    pending_timeout,
    plan_job,
    rendered,
    rendezvous_and_services,
    resize,
    target_size,
    victims,
    write_steps,
    writes_of,
)
from ebbflow_operator.decision.status import FAILED, PREEMPTED, READY, SCHEDULABLE, SUCCEEDED, ConditionUpdate
from ebbflow_operator.decision.writes import (
    AnnotatePod,
    CreateChild,
    DeclareGone,
    DeletePod,
    PatchStatus,
    Write,
)

CONFIG = PlannerConfig(pending_timeout=60, hold_seconds=300)
EVICTING = Taint("ebbflow.dev/spot-termination", "NoExecute", "true")
TOLERATED = Taint("ebbflow.dev/tolerated", "NoExecute", "true")
NODES: dict[str, Node] = {
    "od-0": make_node("od-0"),
    "od-1": make_node("od-1"),
    "spot-0": make_node("spot-0", spot=True),
    "evicting": make_node("evicting", taints=(EVICTING,)),
    "tolerated": make_node("tolerated", taints=(TOLERATED,)),
}
STAMP = format_time(NOW)


def job(
    lo: int = 2, hi: int = 4, status: dict[str, Any] | None = None, generation: int = 1, **spec: Any
) -> Job:
    builder = JobBuilder("j").replicas(lo, hi).set(leaveGraceSeconds=30, **spec)
    return make_job(builder.toleration(TOLERATED.key, "NoExecute"), status=status, generation=generation)


J = job()


def worker(index: int, node: str | None = "od-0", phase: str = "Running", **fields: Any) -> Pod:
    return make_worker(J, index, node, phase, **fields)


def failed(index: int, exit_code: int, **fields: Any) -> Pod:
    return worker(index, phase="Failed", exit_code=exit_code, **fields)


def done(index: int) -> Pod:
    return worker(index, phase="Succeeded", exit_code=0)


def names(pods: Iterable[Pod]) -> list[str]:
    return [p.name for p in pods]


def deletions(items: tuple[Deletion, ...]) -> list[tuple[str, int, str]]:
    return [(d.name, d.grace_seconds, d.reason) for d in items]


def observed(
    pods: list[Pod],
    services: frozenset[str] = frozenset(),
    free_gpus: int = 0,
    network_policies: frozenset[str] = frozenset(),
) -> Observed:
    return Observed(pods, services, NODES, desired=0, free_gpus=free_gpus, network_policies=network_policies)


# --- classify ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "recorded", "expected"),
    [
        pytest.param([worker(0)], {"j-worker-0": "od-0"}, {"active": ["j-worker-0"]}, id="running"),
        pytest.param([worker(0, None, "Pending")], {}, {"active": ["j-worker-0"]}, id="unscheduled"),
        pytest.param(
            [worker(0, "tolerated")],
            {"j-worker-0": "tolerated"},
            {"active": ["j-worker-0"]},
            id="taint-tolerated",
        ),
        pytest.param(
            [], {"j-worker-0": "gone"}, {"lost": {"j-worker-0": "NodeLost"}}, id="vanished-node-gone"
        ),
        pytest.param(
            [], {"j-worker-0": "od-0"}, {"lost": {"j-worker-0": "Evicted"}}, id="vanished-from-live-node"
        ),
        pytest.param(
            [],
            {"j-worker-0": "evicting"},
            {"lost": {"j-worker-0": "TaintEviction"}},
            id="vanished-from-tainted-node",
        ),
        pytest.param([], {"j-worker-0": ""}, {}, id="vanished-before-scheduling-not-lost"),
        pytest.param(
            [worker(0, deleting=True, disruption="EvictionByEvictionAPI")],
            {"j-worker-0": "od-0"},
            {"lost": {"j-worker-0": "EvictionByEvictionAPI"}},
            id="deleted-by-someone-else",
        ),
        pytest.param(
            [worker(0, "gone", deleting=True)],
            {"j-worker-0": "gone"},
            {"lost": {"j-worker-0": "NodeLost"}},
            id="deleted-no-disruption-node-reason",
        ),
        pytest.param([worker(0, deleting=True)], {}, {}, id="deleting-unrecorded-is-the-operators"),
        pytest.param([worker(0, None, deleting=True)], {"j-worker-0": ""}, {}, id="deleting-unscheduled"),
        pytest.param([done(0)], {"j-worker-0": "od-0"}, {"succeeded": ["j-worker-0"]}, id="succeeded"),
        pytest.param(
            [worker(0, exit_code=0, completed=True)],
            {"j-worker-0": "od-0"},
            {"succeeded": ["j-worker-0"]},
            id="exited-0-phase-still-running",
        ),
        pytest.param(
            [worker(0, exit_code=0, completed=True, disruption="TerminationByKubelet")],
            {"j-worker-0": "od-0"},
            {"active": ["j-worker-0"]},
            id="exited-0-evicted-by-the-kubelet-not-success-until-its-phase",
        ),
        pytest.param(
            [failed(0, 137)],
            {"j-worker-0": "od-0"},
            {"lost": {"j-worker-0": "ExitCode137"}, "taken": [("j-worker-0", 0, "preempted")]},
            id="sigkill-is-preemption",
        ),
        pytest.param(
            [failed(0, 1, disruption="DeletionByTaintManager")],
            {"j-worker-0": "od-0"},
            {"lost": {"j-worker-0": "DeletionByTaintManager"}, "taken": [("j-worker-0", 0, "preempted")]},
            id="disruption-is-preemption",
        ),
        pytest.param(
            [failed(0, 143)],
            {},
            {"taken": [("j-worker-0", 0, "preempted")]},
            id="preempted-unrecorded-not-counted",
        ),
        pytest.param(
            [failed(0, 137, node=None)],
            {"j-worker-0": ""},
            {"taken": [("j-worker-0", 0, "preempted")]},
            id="preempted-never-bound-not-counted",
        ),
        pytest.param(
            [worker(0, "gone")],
            {"j-worker-0": ""},
            {"lost": {"j-worker-0": "NodeLost"}, "taken": [("j-worker-0", 0, "node gone")]},
            id="node-gone-recorded-before-binding",
        ),
        pytest.param(
            [worker(0, "evicting")],
            {"j-worker-0": "evicting"},
            {"lost": {"j-worker-0": "TaintEviction"}, "taken": [("j-worker-0", 30, "being evicted")]},
            id="noexecute-gets-grace",
        ),
        pytest.param(
            [failed(0, 1)],
            {"j-worker-0": "od-0"},
            {"failures": ["j-worker-0"], "counted": ["j-worker-0"]},
            id="real-failure-counted",
        ),
        pytest.param([failed(0, 1)], {}, {"failures": ["j-worker-0"]}, id="real-failure-seen-before"),
        pytest.param(
            [worker(0), done(1), failed(2, 1)],
            {"j-worker-0": "od-0", "j-worker-3": "od-1"},
            {
                "active": ["j-worker-0"],
                "succeeded": ["j-worker-1"],
                "failures": ["j-worker-2"],
                "lost": {"j-worker-3": "Evicted"},
            },
            id="mixed",
        ),
    ],
)
def test_classify(pods: list[Pod], recorded: dict[str, str], expected: dict[str, Any]) -> None:
    seen = classify(pods, recorded, NODES, J)
    assert {
        "active": names(seen.active),
        "lost": dict(seen.lost),
        "failures": names(seen.failures),
        "counted": names(seen.counted_failures),
        "succeeded": names(seen.succeeded),
        "taken": deletions(seen.taken),
    } == {"active": [], "lost": {}, "failures": [], "counted": [], "succeeded": [], "taken": [], **expected}


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        pytest.param("gone", "NodeLost", id="no-node"),
        pytest.param("", "NodeLost", id="never-bound"),
        pytest.param("evicting", "TaintEviction", id="noexecute"),
        pytest.param("tolerated", "TaintEviction", id="any-noexecute"),
        pytest.param("od-0", "Evicted", id="healthy-node"),
    ],
)
def test_lost_reason(node: str, reason: str) -> None:
    assert lost_reason(node, NODES) == reason


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        pytest.param(contract.ROLE_WORKER, ["j-worker-0"], id="workers"),
        pytest.param(contract.ROLE_RENDEZVOUS, ["j-rdzv"], id="rendezvous"),
    ],
)
def test_children_are_owned_pods_of_one_role(role: str, expected: list[str]) -> None:
    stranger = replace(worker(1), owner_uid="uid-other")
    assert names(children(J, [worker(0), stranger, make_rendezvous(J)], role)) == expected


@pytest.mark.parametrize(
    ("lost", "preemptions", "events", "condition"),
    [
        pytest.param({}, 3, [], None, id="none"),
        pytest.param(
            {"j-worker-1": "NodeLost"},
            4,
            ["lost 1 worker(s): j-worker-1 (NodeLost)"],
            ("NodeLost", "lost j-worker-1 (NodeLost); preemptions so far: 4"),
            id="one",
        ),
        pytest.param(
            {"j-worker-2": "TaintEviction", "j-worker-1": "ExitCode137"},
            2,
            ["lost 2 worker(s): j-worker-1 (ExitCode137), j-worker-2 (TaintEviction)"],
            (
                "ExitCode137",
                "lost j-worker-1 (ExitCode137), j-worker-2 (TaintEviction); preemptions so far: 2",
            ),
            id="two-sorted-by-name-first-reason",
        ),
    ],
)
def test_report_losses(
    lost: dict[str, str], preemptions: int, events: list[str], condition: tuple[str, str] | None
) -> None:
    report = report_losses(lost, preemptions)
    assert [(e.type, e.reason, e.message) for e in report.events] == [
        ("Warning", PREEMPTED, m) for m in events
    ]
    expected = [] if condition is None else [ConditionUpdate(PREEMPTED, True, *condition)]
    assert list(report.conditions) == expected


# --- end of job ----------------------------------------------------------------------------------

TAKEN = {"j-worker-5": worker(5, "evicting")}  # the pods behind the `taken` deletions below


@pytest.mark.parametrize(
    ("status", "spec", "seen", "expected"),
    [
        pytest.param({}, {}, Workers(active=(worker(0),)), {}, id="goes-on"),
        pytest.param(
            {"restarts": 1},
            {},
            Workers(failures=(failed(1, 1),), counted_failures=(failed(1, 1),)),
            {"restarts": 2, "delete": [("j-worker-1", 0, "failed")], "events": ["WorkerFailed"]},
            id="failure-replaced-and-counted",
        ),
        pytest.param(
            {"restarts": 1},
            {},
            Workers(failures=(failed(1, 1),)),
            {"restarts": 1, "delete": [("j-worker-1", 0, "failed")]},
            id="failure-counted-before-deleted-again-silently",
        ),
        pytest.param(
            {"restarts": 3},
            {"maxRestarts": 3},
            Workers(active=(worker(0),), failures=(failed(1, 2),), counted_failures=(failed(1, 2),)),
            {
                "phase": Phase.FAILED,
                "restarts": 4,
                "delete": [("j-worker-0", 30, "job finished")],
                "events": ["WorkerFailed", "Failed"],
                "conditions": [(FAILED, "TooManyFailures")],
            },
            id="too-many-failures",
        ),
        pytest.param(
            {"restarts": 3},
            {"maxRestarts": 3},
            Workers(failures=(failed(1, 2),)),
            {"restarts": 3, "delete": [("j-worker-1", 0, "failed")]},
            id="at-max-restarts-still-replaced",
        ),
        pytest.param(
            {},
            {},
            Workers(failures=(failed(0, contract.EXIT_INVALID_CONFIG),)),
            {"phase": Phase.FAILED, "events": ["Failed"], "conditions": [(FAILED, "InvalidConfig")]},
            id="invalid-config-fails-at-once",
        ),
        pytest.param(
            {},
            {},
            Workers(succeeded=(done(0), done(1))),
            {
                "phase": Phase.SUCCEEDED,
                "events": ["Succeeded"],
                "conditions": [(SUCCEEDED, "WorkersSucceeded")],
            },
            id="succeeded-finished-pods-kept",
        ),
        pytest.param(
            {},
            {"cleanPodPolicy": "All"},
            Workers(succeeded=(done(0), done(1))),
            {
                "phase": Phase.SUCCEEDED,
                "delete": [("j-worker-0", 30, "job finished"), ("j-worker-1", 30, "job finished")],
                "events": ["Succeeded"],
                "conditions": [(SUCCEEDED, "WorkersSucceeded")],
            },
            id="succeeded-clean-all",
        ),
        pytest.param(
            {}, {}, Workers(active=(worker(1),), succeeded=(done(0),)), {}, id="finishing-not-yet-done"
        ),
        pytest.param(
            {},
            {"cleanPodPolicy": "All"},
            Workers(succeeded=(done(0),), failures=(failed(1, 1),), counted_failures=(failed(1, 1),)),
            {
                "phase": Phase.SUCCEEDED,
                "restarts": 1,
                "delete": [("j-worker-1", 0, "failed"), ("j-worker-0", 30, "job finished")],
                "events": ["WorkerFailed", "Succeeded"],
                "conditions": [(SUCCEEDED, "WorkersSucceeded")],
            },
            id="failure-then-success-deleted-once",
        ),
        pytest.param(
            {"phase": "Failed", "restarts": 2},
            {},
            Workers(active=(worker(0),), failures=(failed(1, 1),), counted_failures=(failed(1, 1),)),
            {"phase": Phase.FAILED, "restarts": 2, "delete": [("j-worker-0", 30, "job finished")]},
            id="final-phase-stays-nothing-counted",
        ),
        pytest.param(
            {"phase": "Succeeded"},
            {"cleanPodPolicy": "None"},
            Workers(active=(worker(0),)),
            {"phase": Phase.SUCCEEDED},
            id="final-clean-none",
        ),
        pytest.param(
            {"phase": "Succeeded"},
            {},
            Workers(active=(worker(1),), taken=(Deletion("j-worker-5", "uid-j-5", 30, "being evicted"),)),
            {"phase": Phase.SUCCEEDED, "delete": [("j-worker-1", 30, "job finished")]},
            id="clean-up-skips-taken-and-deleting",
        ),
    ],
)
def test_end_of_job(
    status: dict[str, Any], spec: dict[str, Any], seen: Workers, expected: dict[str, Any]
) -> None:
    taken = [TAKEN[d.name] for d in seen.taken]
    workers = [*seen.active, *seen.failures, *seen.succeeded, *taken, worker(7, deleting=True)]
    ending = end_of_job(job(status=status, **spec), workers, seen)
    assert {
        "phase": ending.phase,
        "ended": ending.ended,
        "restarts": ending.restarts,
        "delete": deletions(ending.delete),
        "events": [e.reason for e in ending.report.events],
        "conditions": [(c.type, c.reason) for c in ending.report.conditions],
    } == {
        "phase": None,
        "restarts": 0,
        "delete": [],
        "events": [],
        "conditions": [],
        **expected,
        "ended": "phase" in expected,
    }


@pytest.mark.parametrize(
    ("policy", "already", "expected"),
    [
        pytest.param("Running", set(), ["j-worker-0"], id="running-keeps-finished-and-exited-0"),
        pytest.param("All", set(), ["j-worker-0", "j-worker-1", "j-worker-2", "j-worker-4"], id="all"),
        pytest.param("None", set(), [], id="none"),
        pytest.param(
            "All", {"j-worker-2"}, ["j-worker-0", "j-worker-1", "j-worker-4"], id="already-going-left-out"
        ),
    ],
)
def test_clean_up(policy: str, already: set[str], expected: list[str]) -> None:
    exited_0 = worker(4, exit_code=0, completed=True)  # the kubelet has not reported Succeeded yet
    workers = [worker(0), done(1), failed(2, 1), worker(3, deleting=True), exited_0]
    result = clean_up(job(cleanPodPolicy=policy), workers, already)
    assert deletions(result) == [(name, 30, "job finished") for name in expected]


# --- exit codes: fail, restart or preemption ----------------------------------------------------

DIVERGED = (
    "loss or gradient non-finite for 3 consecutive steps (steps 55-57); the last finite state is step 54"
)
RECORDED = {"j-worker-0": "od-0", "j-worker-1": "od-0"}


@pytest.mark.parametrize(
    ("exit_code", "said", "restarts", "expected"),
    [
        pytest.param(
            contract.EXIT_NONFINITE_LOSS,
            DIVERGED,
            0,
            {
                "phase": Phase.FAILED,
                "condition": ("NonFiniteLoss", f"j-worker-1 exited 65 (NonFiniteLoss): {DIVERGED}"),
                "restarts": 1,
            },
            id="65-non-finite-loss-fails-quoting-the-trainer",
        ),
        pytest.param(
            contract.EXIT_NONFINITE_LOSS,
            DIVERGED,
            1,
            {
                "phase": Phase.FAILED,
                "condition": ("NonFiniteLoss", f"j-worker-1 exited 65 (NonFiniteLoss): {DIVERGED}"),
                "restarts": 2,
            },
            id="65-fails-at-once-with-restarts-left",
        ),
        pytest.param(
            contract.EXIT_NONFINITE_LOSS,
            "",
            0,
            {
                "phase": Phase.FAILED,
                "condition": ("NonFiniteLoss", "j-worker-1 exited 65 (NonFiniteLoss)"),
                "restarts": 1,
            },
            id="65-without-a-termination-message",
        ),
        pytest.param(
            contract.EXIT_INVALID_CONFIG,
            "EBBFLOW_GLOBAL_BATCH_SIZE: must be positive",
            0,
            {
                "phase": Phase.FAILED,
                "condition": (
                    "InvalidConfig",
                    "j-worker-1 exited 64 (InvalidConfig): EBBFLOW_GLOBAL_BATCH_SIZE: must be positive",
                ),
                "restarts": 1,
            },
            id="64-invalid-config-fails",
        ),
        pytest.param(1, "boom", 0, {"restarts": 1, "replaced": ["j-worker-1"]}, id="1-restart-counted"),
        pytest.param(
            1,
            "boom",
            3,
            {
                "phase": Phase.FAILED,
                "condition": (
                    "TooManyFailures",
                    "4 worker failures exceed spec.maxRestarts=3: j-worker-1 exited 1",
                ),
                "restarts": 4,
            },
            id="1-beyond-max-restarts-fails",
        ),
        pytest.param(
            contract.EXIT_SIGKILL,
            "",
            0,
            {"lost": {"j-worker-1": "ExitCode137"}},
            id="137-preemption-not-failure",
        ),
        pytest.param(
            contract.EXIT_SIGTERM,
            "",
            0,
            {"lost": {"j-worker-1": "ExitCode143"}},
            id="143-preemption-not-failure",
        ),
    ],
)
def test_exit_code_fails_restarts_or_preempts(
    exit_code: int, said: str, restarts: int, expected: dict[str, Any]
) -> None:
    """A worker's exit code through the steps that judge it (classify, then end_of_job): a code in
    contract.FATAL_EXIT_REASONS fails the job at once whatever restarts are left, quoting what the
    trainer said; another one is a restart until maxRestarts; 137/143 are preemptions."""
    j = job(status={"restarts": restarts, "workerNodes": RECORDED}, maxRestarts=3)
    pods = [worker(0), failed(1, exit_code, termination_message=said)]
    seen = classify(pods, j.status.worker_nodes, NODES, j)
    ending = end_of_job(j, pods, seen)
    failures = [(c.reason, c.message) for c in ending.report.conditions if c.type == FAILED]
    assert {
        "phase": ending.phase,
        "condition": failures[0] if failures else None,
        "restarts": ending.restarts,
        "replaced": [d.name for d in ending.delete if d.reason == "failed"],
        "lost": dict(seen.lost),
    } == {"phase": None, "condition": None, "restarts": restarts, "replaced": [], "lost": {}, **expected}


# --- pending timeout -----------------------------------------------------------------------------

HELD = {"holdReplicas": 2, "holdUntil": format_time(NOW + 100)}


@pytest.mark.parametrize(
    ("status", "active", "ended", "expected"),
    [
        pytest.param(
            {},
            [worker(0), worker(1, None, "Pending", age=5)],
            False,
            {"active": ["j-worker-0", "j-worker-1"]},
            id="nothing-stuck",
        ),
        pytest.param(
            {},
            [worker(0, None, "Pending", age=60, refused=60)],
            False,
            {"active": ["j-worker-0"]},
            id="at-the-limit-not-yet",
        ),
        pytest.param(
            {},
            [worker(0, None, "Pending", age=500)],
            False,
            {"active": ["j-worker-0"]},
            id="queued-for-the-scheduler-however-long-not-stuck",
        ),
        pytest.param(
            {},
            [worker(0, None, "Pending", age=500, refused=5)],
            False,
            {"active": ["j-worker-0"]},
            id="refused-only-lately-not-yet",
        ),
        pytest.param(
            {},
            [worker(0), worker(1, None, "Pending", age=61, refused=61), worker(2, None, "Pending", age=5)],
            False,
            {
                "active": ["j-worker-0", "j-worker-2"],
                "stuck": ["j-worker-1"],
                "hold": Hold(1, NOW + 300),
                "events": ["WorkersWithdrawn"],
            },
            id="stuck-withdrawn-and-held-at-bound-count",
        ),
        pytest.param(
            {},
            [worker(0, None, "Pending", age=500, refused=500)],
            True,
            {"active": ["j-worker-0"]},
            id="ended-withdraws-nothing",
        ),
        pytest.param(
            HELD, [worker(0)], False, {"active": ["j-worker-0"], "hold": Hold(2, NOW + 100)}, id="hold-kept"
        ),
        pytest.param(
            {"holdReplicas": 2, "holdUntil": format_time(NOW - 1)},
            [worker(0)],
            False,
            {"active": ["j-worker-0"]},
            id="hold-expired",
        ),
        pytest.param(
            HELD,
            [worker(0, None, "Pending", age=100, refused=100)],
            False,
            {"stuck": ["j-worker-0"], "hold": Hold(0, NOW + 300), "events": ["WorkersWithdrawn"]},
            id="new-hold-replaces-old",
        ),
    ],
)
def test_pending_timeout(
    status: dict[str, Any], active: list[Pod], ended: bool, expected: dict[str, Any]
) -> None:
    result = pending_timeout(job(status=status), active, ended, NOW, CONFIG)
    assert {
        "active": names(result.active),
        "stuck": names(result.stuck),
        "hold": result.hold,
        "events": [e.reason for e in result.report.events],
    } == {"active": [], "stuck": [], "hold": None, "events": [], **expected}
    assert deletions(result.delete) == [(name, 0, "pending timeout") for name in names(result.stuck)]


@pytest.mark.parametrize(
    ("status", "hold"),
    [
        pytest.param({}, None, id="none"),
        pytest.param(HELD, Hold(2, NOW + 100), id="in-force"),
        pytest.param({**HELD, "holdUntil": format_time(NOW)}, None, id="ends-now"),
        pytest.param({"holdUntil": format_time(NOW + 100)}, None, id="no-size"),
        pytest.param(
            {"holdReplicas": 0, "holdUntil": format_time(NOW + 1)}, Hold(0, NOW + 1), id="held-at-zero"
        ),
    ],
)
def test_current_hold(status: dict[str, Any], hold: Hold | None) -> None:
    assert current_hold(job(status=status), NOW) == hold
    assert hold_cap(job(status=status), NOW) == (hold.replicas if hold else None)


# --- size ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("desired", "hold", "active", "ended", "finishing", "target"),
    [
        pytest.param(3, None, 2, False, False, 3, id="allocators-size"),
        pytest.param(3, Hold(1, NOW + 1), 2, False, False, 0, id="hold-below-min"),
        pytest.param(4, Hold(2, NOW + 1), 2, False, False, 2, id="hold-caps"),
        pytest.param(1, Hold(3, NOW + 1), 2, False, False, 0, id="hold-does-not-raise"),
        pytest.param(1, None, 2, False, False, 0, id="below-min-none"),
        pytest.param(2, None, 0, False, False, 2, id="at-min"),
        pytest.param(4, None, 1, False, True, 1, id="finishing-keeps-the-active"),
        pytest.param(4, None, 3, True, True, 0, id="ended-none"),
        pytest.param(4, None, 3, True, False, 0, id="ended-before-finishing"),
    ],
)
def test_target_size(
    desired: int, hold: Hold | None, active: int, ended: bool, finishing: bool, target: int
) -> None:
    assert target_size(desired, 2, hold, active, ended, finishing) == target


@pytest.mark.parametrize(
    ("active", "count", "expected"),
    [
        pytest.param(
            [worker(0, "spot-0"), worker(1, "od-0"), worker(2, None, "Pending", age=5)],
            1,
            ["j-worker-2"],
            id="unscheduled-first",
        ),
        pytest.param(
            [worker(0, "od-0", age=10), worker(1, "spot-0", age=500)],
            1,
            ["j-worker-1"],
            id="spot-before-on-demand",
        ),
        pytest.param(
            [worker(0, "od-0", age=500), worker(1, "od-1", age=10), worker(2, "od-0", age=300)],
            2,
            ["j-worker-1", "j-worker-2"],
            id="newest-first",
        ),
        pytest.param(
            [worker(2, "od-0"), worker(10, "od-1"), worker(3, "od-0")],
            2,
            ["j-worker-10", "j-worker-3"],
            id="highest-index-on-a-tie",
        ),
        pytest.param(
            [worker(0, "spot-0", age=500), worker(1, "spot-0", age=10), worker(2, "od-0", age=5)],
            1,
            ["j-worker-2"],
            id="fewest-on-their-node-before-spot",
        ),
        pytest.param(
            [worker(0, "od-0"), worker(1, "od-1"), worker(2, "od-1"), worker(3, "od-0"), worker(4, "spot-0")],
            3,
            ["j-worker-4", "j-worker-3", "j-worker-0"],
            id="the-rest-stay-on-one-node",
        ),
        pytest.param(
            [worker(0, "gone"), worker(1, "spot-0")], 1, ["j-worker-1"], id="unknown-node-is-on-demand"
        ),
        pytest.param(
            # Started together on three nodes: 1 and 2 formed the world (2 was its first rank 0, 1
            # the second) while 0 and 3 still imported; the usual order takes 1 and 2 (each alone on
            # its node), which would leave nobody holding the state.
            [
                worker(0, "od-0"),
                worker(1, "od-1", progress="{}"),
                worker(2, "spot-0", progress="{}"),
                worker(3, "od-0"),
            ],
            2,
            ["j-worker-2", "j-worker-3"],
            id="a-state-holder-stays",
        ),
        pytest.param(
            [worker(0, "od-0", progress="{}"), worker(1, "od-1"), worker(2, "od-1", progress="{}")],
            1,
            ["j-worker-0"],
            id="another-holder-stays-so-the-usual-order",
        ),
        pytest.param([worker(0), worker(1)], 0, [], id="none"),
        pytest.param([worker(0), worker(1)], -1, [], id="negative-none"),
        pytest.param(
            [worker(0, age=5), worker(1)], 5, ["j-worker-0", "j-worker-1"], id="more-than-there-are"
        ),
    ],
)
def test_victims(active: list[Pod], count: int, expected: list[str]) -> None:
    assert names(victims(active, count, NODES)) == expected


@pytest.mark.parametrize(
    ("active", "target", "disrupted", "others", "expected"),
    [
        pytest.param([worker(0), worker(1)], 2, False, [], {"generation": 3}, id="steady-same-world"),
        pytest.param([worker(0), worker(1)], 2, True, [], {"generation": 4}, id="disrupted-new-world"),
        pytest.param(
            [worker(0)],
            3,
            False,
            [],
            {"generation": 4, "create": [(1, 4), (2, 4)]},
            id="grow-at-free-indices",
        ),
        pytest.param(
            [worker(1)],
            2,
            False,
            [failed(0, 1)],
            {"generation": 4, "create": [(2, 4)]},
            id="failed-pod-keeps-its-name",
        ),
        pytest.param(
            [worker(0, "od-0", age=500), worker(1, "spot-0"), worker(2, None, "Pending", age=5)],
            1,
            False,
            [],
            {"generation": 4, "delete": [("j-worker-2", 0, "scale down"), ("j-worker-1", 30, "scale down")]},
            id="shrink-bound-get-grace",
        ),
        pytest.param([], 0, False, [], {"generation": 3, "active": []}, id="empty"),
    ],
)
def test_resize(
    active: list[Pod], target: int, disrupted: bool, others: list[Pod], expected: dict[str, Any]
) -> None:
    j = job(status={"worldGeneration": 3})
    sizing = resize(j, active, target, disrupted, observed([*active, *others]))
    deleted = {d.name for d in sizing.delete}
    assert {
        "target": sizing.target,
        "active": names(sizing.active),
        "delete": deletions(sizing.delete),
        "create": list(sizing.create),
        "generation": sizing.generation,
    } == {
        "target": target,
        "active": [p.name for p in active if p.name not in deleted],
        "delete": [],
        "create": [],
        **expected,
    }


SPREAD = [worker(0, "od-0"), worker(1, "od-0"), worker(2, "od-1"), worker(3, "spot-0")]


@pytest.mark.parametrize(
    ("active", "target", "disrupted", "moves", "expected"),
    [
        pytest.param(
            SPREAD, 4, False, ("od-0",) * 2, ["j-worker-2", "j-worker-3"], id="every-worker-elsewhere"
        ),
        pytest.param(
            SPREAD, 4, False, ("od-1",) * 3, ["j-worker-0", "j-worker-1", "j-worker-3"], id="onto-another"
        ),
        pytest.param(SPREAD, 4, False, (), [], id="no-move"),
        pytest.param(SPREAD, 3, False, ("od-0",) * 2, [], id="counts-disagree"),
        pytest.param(SPREAD, 3, False, ("od-0",), ["j-worker-2", "j-worker-3"], id="shrinks-onto-one-node"),
        pytest.param(SPREAD, 4, True, ("od-0",) * 2, [], id="disrupted-this-pass"),
        pytest.param(SPREAD, 4, False, ("od-0",) * 3, [], id="policy-saw-other-workers"),
        pytest.param(
            [*SPREAD[:3], worker(3, None, "Pending")], 4, False, ("od-0",) * 2, [], id="one-not-scheduled"
        ),
    ],
)
def test_movers(
    active: list[Pod], target: int, disrupted: bool, moves: tuple[str, ...], expected: list[str]
) -> None:
    assert names(movers(active, target, disrupted, moves)) == expected


def test_resize_replaces_moved_workers_with_pinned_ones() -> None:
    j = job(status={"worldGeneration": 3})
    seen = replace(observed(SPREAD), moves=("od-0", "od-0"))
    sizing = resize(j, SPREAD, 4, False, seen)
    assert deletions(sizing.delete) == [
        ("j-worker-2", 30, "move onto one node"),
        ("j-worker-3", 30, "move onto one node"),
    ]
    assert (names(sizing.active), list(sizing.create)) == (["j-worker-0", "j-worker-1"], [(4, 4), (5, 4)])
    assert (sizing.pins, sizing.moved_onto, sizing.generation) == (("od-0", "od-0"), "od-0", 4)


@pytest.mark.parametrize(
    ("growth", "create", "chosen", "disrupted", "expected"),
    [
        pytest.param(("od-0", "od-1"), 2, [], False, ("od-0", "od-1"), id="the-policys-nodes"),
        pytest.param((), 2, [], False, (), id="the-policy-placed-none"),
        pytest.param(("od-0",), 2, [], False, (), id="counts-disagree"),
        pytest.param(("od-0", "od-1"), 2, [], True, (), id="disrupted-this-pass"),
        pytest.param(("od-0",), 1, SPREAD[3:], False, (), id="workers-leave-this-pass"),
    ],
)
def test_growth_pins(
    growth: tuple[str, ...], create: int, chosen: list[Pod], disrupted: bool, expected: tuple[str, ...]
) -> None:
    """New workers run where the policy placed them only when the policy placed exactly these beside
    every worker the job has, and nothing else changed its workers this pass."""
    assert growth_pins(growth, [(i, 1) for i in range(create)], chosen, disrupted) == expected


def test_resize_pins_a_growth_where_the_policy_placed_it() -> None:
    j = job(status={"worldGeneration": 3})
    seen = replace(observed(SPREAD[:2]), growth=("od-1", "spot-0"))
    sizing = resize(j, SPREAD[:2], 4, False, seen)
    assert list(sizing.create) == [(2, 4), (3, 4)]
    assert (sizing.pins, sizing.moved_onto) == (("od-1", "spot-0"), None)


@pytest.mark.parametrize(
    ("count", "taken", "expected"),
    [
        pytest.param(0, set(), [], id="none"),
        pytest.param(-2, set(), [], id="negative"),
        pytest.param(2, set(), [(0, 5), (1, 5)], id="from-zero"),
        pytest.param(2, {"j-worker-0", "j-worker-2"}, [(1, 5), (3, 5)], id="skips-taken"),
        pytest.param(1, {"other-worker-0"}, [(0, 5)], id="other-jobs-names-do-not-matter"),
    ],
)
def test_new_workers(count: int, taken: set[str], expected: list[tuple[int, int]]) -> None:
    assert list(new_workers("j", count, 5, taken)) == expected


# --- rendezvous pod and Service ----------------------------------------------------------------

RDZV = make_rendezvous(J)
BOTH = frozenset({"j-pods"})  # the job's Service is there


@pytest.mark.parametrize(
    ("pods", "services", "ended", "policy", "expected"),
    [
        pytest.param([RDZV], BOTH, False, "Running", {}, id="steady"),
        pytest.param([], frozenset(), False, "Running", {"create": True, "service": True}, id="new"),
        pytest.param(
            [RDZV], frozenset({"j-rdzv"}), False, "Running", {"service": True}, id="another-service-only"
        ),
        pytest.param(
            [replace(RDZV, phase="Failed")],
            BOTH,
            False,
            "Running",
            {"delete": ["rendezvous ended"]},
            id="ended",
        ),
        pytest.param(
            [replace(RDZV, phase="Succeeded")],
            BOTH,
            False,
            "Running",
            {"delete": ["rendezvous ended"]},
            id="exited",
        ),
        pytest.param(
            [replace(RDZV, node="gone")],
            BOTH,
            False,
            "Running",
            {"delete": ["rendezvous ended"]},
            id="node-gone",
        ),
        pytest.param([replace(RDZV, deleting=True)], BOTH, False, "Running", {}, id="old-one-still-going"),
        pytest.param(
            [replace(RDZV, owner_uid="uid-old")], BOTH, False, "Running", {}, id="name-taken-by-a-stranger"
        ),
        pytest.param(
            [RDZV], frozenset(), True, "Running", {"delete": ["job finished"]}, id="job-ended-clean"
        ),
        pytest.param(
            [RDZV], frozenset(), True, "All", {"delete": ["job finished"]}, id="job-ended-clean-all"
        ),
        pytest.param([RDZV], frozenset(), True, "None", {}, id="job-ended-keep"),
        pytest.param(
            [replace(RDZV, deleting=True)], frozenset(), True, "All", {}, id="job-ended-already-going"
        ),
    ],
)
def test_rendezvous_and_services(
    pods: list[Pod], services: frozenset[str], ended: bool, policy: str, expected: dict[str, Any]
) -> None:
    present = observed(pods, services, network_policies=frozenset({"j-pods"}))
    support = rendezvous_and_services(job(cleanPodPolicy=policy), present, ended, workers=False)
    assert not support.create_network_policy
    assert {
        "delete": [d.reason for d in support.delete],
        "create": support.create_rendezvous_pod,
        "service": support.create_service,
    } == {"delete": [], "create": False, "service": False, **expected}
    assert all((d.name, d.grace_seconds) == ("j-rdzv", 0) for d in support.delete)


@pytest.mark.parametrize(
    ("policies", "ended", "create"),
    [
        pytest.param(frozenset(), False, True, id="missing"),
        pytest.param(frozenset({"j-pods"}), False, False, id="present"),
        pytest.param(frozenset({"other-pods"}), False, True, id="another-jobs-only"),
        pytest.param(frozenset(), True, False, id="job-ended"),
    ],
)
def test_network_policy_is_created_while_the_job_runs(
    policies: frozenset[str], ended: bool, create: bool
) -> None:
    support = rendezvous_and_services(
        job(), observed([RDZV], BOTH, network_policies=policies), ended, workers=False
    )
    assert support.create_network_policy is create


# --- status --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "ready", "replicas", "settled", "final", "phase", "condition", "finished"),
    [
        pytest.param(3, 1, 3, True, None, Phase.PENDING, (False, "WaitingForWorkers"), 0, id="below-min"),
        pytest.param(0, 0, 0, True, None, Phase.PENDING, (False, "WaitingForWorkers"), 0, id="no-workers"),
        pytest.param(3, 3, 3, True, None, Phase.RUNNING, (True, "MinimumAvailable"), 0, id="all-ready"),
        pytest.param(3, 2, 3, True, None, Phase.SCALING, (True, "MinimumAvailable"), 0, id="some-not-ready"),
        pytest.param(3, 3, 4, True, None, Phase.SCALING, (True, "MinimumAvailable"), 0, id="extra-replicas"),
        pytest.param(
            3, 3, 3, False, None, Phase.SCALING, (True, "MinimumAvailable"), 0, id="pods-still-changing"
        ),
        pytest.param(3, 3, 3, True, Phase.FAILED, Phase.FAILED, (False, "Failed"), 0, id="failed-final"),
        pytest.param(
            0, 0, 0, True, Phase.SUCCEEDED, Phase.SUCCEEDED, (False, "Succeeded"), 0, id="succeeded-final"
        ),
        pytest.param(
            2, 1, 2, True, None, Phase.RUNNING, (True, "WorkersFinishing"), 1, id="finishing-below-min"
        ),
        pytest.param(
            3, 1, 2, False, None, Phase.RUNNING, (True, "WorkersFinishing"), 1, id="finishing-not-settled"
        ),
        pytest.param(
            0, 0, 0, True, Phase.SUCCEEDED, Phase.SUCCEEDED, (False, "Succeeded"), 3, id="finished-final"
        ),
    ],
)
def test_readiness(
    target: int,
    ready: int,
    replicas: int,
    settled: bool,
    final: Phase | None,
    phase: Phase,
    condition: tuple[bool, str],
    finished: int,
) -> None:
    result, ready_condition = readiness(2, target, ready, replicas, settled, final, finished)
    assert result is phase
    assert (ready_condition.type, ready_condition.status, ready_condition.reason) == (READY, *condition)


@pytest.mark.parametrize(
    ("target", "hold", "expected"),
    [
        pytest.param(3, None, (True, "Allocated", "3 worker(s) allocated in [2, 4]"), id="allocated"),
        pytest.param(
            0,
            None,
            (
                False,
                "InsufficientGPUs",
                "needs min 2 workers x 1 GPU(s) on nodes it may use; 1 GPU(s) free there for it",
            ),
            id="insufficient-gpus",
        ),
        pytest.param(
            0,
            Hold(1, NOW + 300),
            (
                False,
                "PendingTimeout",
                f"only 1 of min 2 workers were scheduled within 60s; retrying after {format_time(NOW + 300)}",
            ),
            id="held-below-min",
        ),
        pytest.param(0, Hold(3, NOW + 300), (False, "InsufficientGPUs"), id="held-above-min-is-gpus"),
        pytest.param(2, Hold(2, NOW + 300), (True, "Allocated"), id="held-but-allocated"),
    ],
)
def test_schedulable(target: int, hold: Hold | None, expected: tuple[Any, ...]) -> None:
    condition = schedulable(J, target, hold, observed([], frozenset(), free_gpus=1), CONFIG)
    assert condition.type == SCHEDULABLE
    assert (condition.status, condition.reason, condition.message)[: len(expected)] == expected


@pytest.mark.parametrize(
    ("before", "target", "causes", "reason"),
    [
        pytest.param(2, 2, {"lost", "stuck", "failed", "spec_changed"}, None, id="same-size"),
        pytest.param(2, 0, {"ended", "lost"}, None, id="ended"),
        pytest.param(
            3, 2, {"lost", "stuck", "failed", "spec_changed"}, RescaleReason.PREEMPTION, id="lost-first"
        ),
        pytest.param(
            3, 2, {"stuck", "failed", "spec_changed"}, RescaleReason.PENDING_TIMEOUT, id="then-stuck"
        ),
        pytest.param(3, 4, {"failed", "spec_changed"}, RescaleReason.FAILURE, id="then-failed"),
        pytest.param(0, 3, {"spec_changed"}, RescaleReason.SPEC_CHANGED, id="then-spec-or-new"),
        pytest.param(2, 3, set(), RescaleReason.CAPACITY_FREED, id="grown"),
        pytest.param(3, 2, set(), RescaleReason.CAPACITY_RECLAIMED, id="shrunk"),
    ],
)
def test_rescale_reason(before: int, target: int, causes: set[str], reason: RescaleReason | None) -> None:
    flags = {name: name in causes for name in ("ended", "lost", "stuck", "failed", "spec_changed")}
    assert rescale_reason(before, target, **flags) == reason


def progress(step: int, minute: int, **extra: Any) -> str:
    return json.dumps({"step": step, "time": f"2026-01-01T00:0{minute}:00Z", **extra})


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        pytest.param([], None, id="none"),
        pytest.param(["not json", "[1]"], None, id="unreadable"),
        pytest.param(
            [progress(1, 0), progress(9, 1)], {"step": 9, "time": "2026-01-01T00:01:00Z"}, id="newest"
        ),
        pytest.param(
            [progress(9, 1), progress(1, 0)], {"step": 9, "time": "2026-01-01T00:01:00Z"}, id="any-order"
        ),
        pytest.param(
            [progress(2, 3, x=1, loss=0.5)],
            {"step": 2, "loss": 0.5, "time": "2026-01-01T00:03:00Z"},
            id="contract-fields-only",
        ),
    ],
)
def test_latest_progress(reports: list[str], expected: dict[str, Any] | None) -> None:
    pods = [worker(i, progress=report) for i, report in enumerate(reports)]
    assert latest_progress([*pods, worker(9)]) == expected


OLD = format_time(NOW - 600)
RESCALE = {"time": STAMP, "from": 1, "to": 2, "reason": RescaleReason.CAPACITY_FREED}


@pytest.mark.parametrize(
    ("recorded", "phase", "rescale", "hold", "report", "expected"),
    [
        pytest.param({}, Phase.PENDING, None, None, None, {}, id="nothing-yet"),
        pytest.param(
            {"phase": "Running", "startTime": OLD, "x": 1},
            Phase.RUNNING,
            None,
            None,
            None,
            {"startTime": OLD},
            id="kept",
        ),
        pytest.param({}, Phase.RUNNING, None, None, None, {"startTime": STAMP}, id="first-running"),
        pytest.param({}, Phase.SCALING, None, None, None, {}, id="scaling-not-started"),
        pytest.param(
            {"startTime": OLD},
            Phase.FAILED,
            None,
            None,
            None,
            {"startTime": OLD, "completionTime": STAMP},
            id="ended",
        ),
        pytest.param(
            {"completionTime": OLD},
            Phase.SUCCEEDED,
            None,
            None,
            None,
            {"completionTime": OLD},
            id="ended-before",
        ),
        pytest.param(
            {"lastRescale": {"reason": "x"}},
            Phase.SCALING,
            RESCALE,
            None,
            None,
            {"lastRescale": RESCALE},
            id="rescaled",
        ),
        pytest.param(
            {"lastRescale": {"reason": "x"}},
            Phase.SCALING,
            None,
            None,
            None,
            {"lastRescale": {"reason": "x"}},
            id="last-rescale-kept",
        ),
        pytest.param(
            {"holdReplicas": 1, "holdUntil": OLD},
            Phase.PENDING,
            None,
            Hold(1, NOW + 60),
            None,
            {"holdReplicas": 1, "holdUntil": format_time(NOW + 60)},
            id="hold-written",
        ),
        pytest.param(
            {"holdReplicas": 1, "holdUntil": OLD}, Phase.PENDING, None, None, None, {}, id="hold-over-dropped"
        ),
        pytest.param(
            {"progress": {"step": 1}},
            Phase.SCALING,
            None,
            None,
            None,
            {"progress": {"step": 1}},
            id="progress-kept",
        ),
        pytest.param(
            {"progress": {"step": 1}},
            Phase.SCALING,
            None,
            None,
            {"step": 2},
            {"progress": {"step": 2}},
            id="progress-newer",
        ),
    ],
)
def test_lasting_fields(
    recorded: dict[str, Any],
    phase: Phase,
    rescale: dict[str, Any] | None,
    hold: Hold | None,
    report: dict[str, Any] | None,
    expected: dict[str, Any],
) -> None:
    assert lasting_fields(recorded, phase, STAMP, rescale, hold, report) == expected


LOST = Workers(lost={"j-worker-2": "NodeLost"})
GROWN = Sizing(3, (worker(0), worker(1)), create=((2, 2),), generation=2)


@pytest.mark.parametrize(
    ("seen", "ending", "timeout", "sizing", "settled", "expected"),
    [
        pytest.param(
            Workers(),
            Ending(),
            Timeout(),
            Sizing(2, (worker(0), worker(1)), generation=1),
            True,
            {
                "phase": Phase.RUNNING,
                "reason": None,
                "events": [],
                "conditions": {READY: "MinimumAvailable", SCHEDULABLE: "Allocated"},
                "status": {"startTime": STAMP, "replicas": 2, "readyReplicas": 2, "worldGeneration": 1},
            },
            id="steady",
        ),
        pytest.param(
            LOST,
            Ending(report=EventsAndConditions((Event("Warning", "WorkerFailed", "x"),))),
            Timeout(report=EventsAndConditions((Event("Warning", "WorkersWithdrawn", "y"),))),
            GROWN,
            False,
            {
                "phase": Phase.SCALING,
                "reason": RescaleReason.PREEMPTION,
                "events": [PREEMPTED, "WorkerFailed", "WorkersWithdrawn", "Rescaled"],
                "conditions": {READY: "MinimumAvailable", SCHEDULABLE: "Allocated", PREEMPTED: "NodeLost"},
                "status": {
                    "preemptions": 2,
                    "replicas": 3,
                    "workerNodes": {"j-worker-0": "od-0", "j-worker-1": "od-0", "j-worker-2": ""},
                    "lastRescale": {"time": STAMP, "from": 2, "to": 3, "reason": "Preemption"},
                },
            },
            id="events-in-step-order",
        ),
        pytest.param(
            Workers(),
            Ending(
                Phase.FAILED,
                4,
                report=EventsAndConditions(
                    conditions=(ConditionUpdate(FAILED, True, "TooManyFailures", "m"),)
                ),
            ),
            Timeout(),
            Sizing(0, generation=1),
            False,
            {
                "phase": Phase.FAILED,
                "reason": None,
                "events": [],
                "conditions": {READY: "Failed", FAILED: "TooManyFailures"},
                "status": {"completionTime": STAMP, "restarts": 4, "desiredReplicas": 0, "replicas": 0},
            },
            id="ended-not-schedulable-no-rescale",
        ),
        pytest.param(
            Workers(),
            Ending(),
            Timeout(hold=Hold(1, NOW + 300)),
            Sizing(0, generation=2),
            False,
            {
                "phase": Phase.PENDING,
                "reason": RescaleReason.CAPACITY_RECLAIMED,
                "events": ["Rescaled"],
                "conditions": {READY: "WaitingForWorkers", SCHEDULABLE: "PendingTimeout"},
                "status": {"holdReplicas": 1, "holdUntil": format_time(NOW + 300)},
            },
            id="held",
        ),
    ],
)
def test_job_status(
    seen: Workers, ending: Ending, timeout: Timeout, sizing: Sizing, settled: bool, expected: dict[str, Any]
) -> None:
    j = job(status={"phase": "Running", "desiredReplicas": 2, "observedGeneration": 1, "preemptions": 1})
    update = job_status(j, observed([*sizing.active]), seen, ending, timeout, sizing, settled, NOW, CONFIG)
    conditions = {c["type"]: c["reason"] for c in update.status["conditions"]}
    assert update.status["phase"] is expected["phase"]
    assert update.rescale_reason == expected["reason"]
    assert [e.reason for e in update.report.events] == expected["events"]
    assert conditions == expected["conditions"]
    assert {key: update.status[key] for key in expected["status"]} == expected["status"]
    assert update.status["desiredReplicas"] == sizing.target
    assert update.status["observedGeneration"] == 1


# --- global_batch: the policy's B reaches the workers (spec.maxGlobalBatchSize) --------------------

# V = 4 (replicas.max), B = 256: allowed values are the multiples of 4 in [256, 1024].
ADAPTIVE = job(virtualNodes=4, globalBatchSize=256, maxGlobalBatchSize=1024, lrScaling="adascale")
CHOSEN_512 = job(
    virtualNodes=4,
    globalBatchSize=256,
    maxGlobalBatchSize=1024,
    lrScaling="adascale",
    status={"globalBatchSize": 512},
)


def adaptive_worker(owner: Job, index: int, annotated: str | None) -> Pod:
    return make_worker(owner, index, global_batch=annotated)


@pytest.mark.parametrize(
    ("owner", "chosen", "annotated", "ended", "value", "updated", "events"),
    [
        pytest.param(J, 512, ["256"], False, None, [], [], id="fixed-batch-job-ignores-the-policy"),
        pytest.param(ADAPTIVE, None, ["256", "256"], False, 256, [], [], id="no-choice-keeps-spec-batch"),
        pytest.param(CHOSEN_512, None, ["512"], False, 512, [], [], id="no-choice-keeps-status-batch"),
        pytest.param(
            ADAPTIVE, 512, ["256", "512"], False, 512, [(0, 512)], ["global batch 256 -> 512"], id="grow"
        ),
        pytest.param(
            CHOSEN_512,
            256,
            ["512", None],
            False,
            256,
            [(0, 256), (1, 256)],
            ["global batch 512 -> 256"],
            id="shrink-and-annotate-unannotated",
        ),
        pytest.param(ADAPTIVE, 2048, ["256"], False, 256, [], [], id="above-max-refused"),
        pytest.param(ADAPTIVE, 128, ["256"], False, 256, [], [], id="below-spec-batch-refused"),
        pytest.param(ADAPTIVE, 510, ["256"], False, 256, [], [], id="not-whole-virtual-nodes-refused"),
        pytest.param(ADAPTIVE, 1024, ["256"], True, 1024, [], [], id="ended-job-annotates-nothing"),
    ],
)
def test_global_batch(
    owner: Job,
    chosen: int | None,
    annotated: list[str | None],
    ended: bool,
    value: int | None,
    updated: list[tuple[int, int]],
    events: list[str],
) -> None:
    active = [adaptive_worker(owner, i, a) for i, a in enumerate(annotated)]
    batch = global_batch(owner, chosen, active, ended)
    assert batch.value == value
    assert [(u.name, u.uid, u.value) for u in batch.update] == [
        (f"{owner.name}-worker-{i}", f"uid-{owner.name}-{i}", v) for i, v in updated
    ]
    assert [e.message for e in batch.report.events] == events


# --- memory_budget: the job's GPU memory budget reaches the workers (spec.bandLimit) ---------------

SLICED = {  # 40960 MiB GPUs: exclusive, and shared 2 ways
    "whole": make_node("whole", labels={LABEL_GPU_MEMORY: "40960", LABEL_GPU_REPLICAS: "1"}),
    "halved": make_node("halved", labels={LABEL_GPU_MEMORY: "40960", LABEL_GPU_REPLICAS: "2"}),
    "unlabelled": make_node("unlabelled"),
}
BAND_LIMITED = job(bandLimit={})
FIXED_BUDGET = job(bandLimit={"memoryBudgetMiB": 8000})
CHANGED = "memory budget 40960 MiB -> 20480 MiB per worker"


@pytest.mark.parametrize(
    ("owner", "placed", "ended", "value", "updated", "events"),
    [
        pytest.param(J, [("whole", "1")], False, None, [], [], id="no-band-limit-annotates-nothing"),
        pytest.param(
            BAND_LIMITED,
            [("unlabelled", "40960")],
            False,
            None,
            [],
            [],
            id="unknown-budget-keeps-annotations",
        ),
        pytest.param(
            BAND_LIMITED,
            [("whole", None), (None, None)],
            False,
            40960,
            [0, 1],
            [],
            id="first-budget-annotates-everyone-without-event",
        ),
        pytest.param(
            BAND_LIMITED,
            [("whole", "40960"), ("halved", "40960")],
            False,
            20480,
            [0, 1],
            [CHANGED],
            id="worker-on-shared-gpu-lowers-everyones-budget",
        ),
        pytest.param(
            BAND_LIMITED,
            [("whole", "20480"), ("halved", "40960")],
            False,
            20480,
            [1],
            [],
            id="half-applied-change-finished-without-second-event",
        ),
        pytest.param(
            BAND_LIMITED, [("whole", "20480"), ("halved", "20480")], False, 20480, [], [], id="current"
        ),
        pytest.param(
            FIXED_BUDGET,
            [("halved", "5000"), (None, "5000")],
            False,
            8000,
            [0, 1],
            ["memory budget 5000 MiB -> 8000 MiB per worker"],
            id="spec-value-changed",
        ),
        pytest.param(
            BAND_LIMITED,
            [("whole", "40960"), ("halved", "40960")],
            True,
            20480,
            [],
            [],
            id="ended-job-annotates-nothing",
        ),
    ],
)
def test_memory_budget(
    owner: Job,
    placed: list[tuple[str | None, str | None]],
    ended: bool,
    value: int | None,
    updated: list[int],
    events: list[str],
) -> None:
    """`placed`: each worker's node and the budget annotation it carries."""
    active = [make_worker(owner, i, node, memory_budget=carried) for i, (node, carried) in enumerate(placed)]
    budget = memory_budget(owner, active, SLICED, ended)
    assert budget.value == value
    assert [(u.name, u.uid, u.value) for u in budget.update] == [
        (f"{owner.name}-worker-{i}", f"uid-{owner.name}-{i}", value) for i in updated
    ]
    assert [e.message for e in budget.report.events] == events
    assert {(e.type, e.reason) for e in budget.report.events} <= {("Normal", "MemoryBudgetChanged")}


# --- writes_of: the plan's writes, complete and in order ------------------------------------------

WRITER = make_job(JobBuilder("w").replicas(1, 4))
FULL_PLAN = Plan(
    job=WRITER,
    status_patch={"desiredReplicas": 2},
    delete=(Deletion("w-worker-3", "uid-3", 30, "scale down"),),
    create_network_policy=True,
    create_rendezvous_pod=True,
    create_service=True,
    create_workers=((4, 2),),
    update_global_batch=(BatchUpdate("w-worker-0", "uid-0", 64),),
    update_memory_budget=(BudgetUpdate("w-worker-1", "uid-1", 2048),),
    events=(Event("Normal", "Rescaled", "3 -> 2 workers"),),
    declare_gone=DeclareGone("10.0.0.9:29401", (("w-worker-2", "its node n2 is gone"),)),
)


def described(write: Write) -> tuple[str, str]:
    match write:
        case DeclareGone(address, pods):
            return ("declare", f"{address} {','.join(name for name, _ in pods)}")
        case PatchStatus(patch):
            return ("status", ",".join(sorted(patch)))
        case DeletePod(name, _, grace_seconds):
            return ("delete", f"{name} grace {grace_seconds}")
        case CreateChild(kind, body):
            return (f"create {kind}", body["metadata"]["name"])
        case AnnotatePod(name, _, annotations):
            return ("annotate", f"{name} {annotations}")
    raise AssertionError(write)


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        pytest.param(Plan(job=WRITER, events=FULL_PLAN.events), [], id="events-are-not-writes"),
        pytest.param(Plan(job=WRITER, status_patch={"phase": "Running"}), [("status", "phase")], id="status"),
        pytest.param(
            FULL_PLAN,
            [
                ("status", "desiredReplicas"),
                ("delete", "w-worker-3 grace 30"),
                ("create NetworkPolicy", manifests.network_policy_name("w")),
                ("create Secret", manifests.rendezvous_token_name("w")),
                ("create Pod", manifests.rendezvous_name("w")),
                ("create Service", manifests.service_name("w")),
                ("create Pod", "w-worker-4"),
                ("annotate", f"w-worker-0 {{'{contract.ANNOTATION_GLOBAL_BATCH_SIZE}': '64'}}"),
                ("annotate", f"w-worker-1 {{'{contract.ANNOTATION_MEMORY_BUDGET}': '2048'}}"),
                ("declare", "10.0.0.9:29401 w-worker-2"),
            ],
            id="status-deletions-policy-secret-store-service-workers-annotations-declaration",
        ),
    ],
)
def test_writes_of_orders_the_plan(plan: Plan, expected: list[tuple[str, str]]) -> None:
    assert [described(w) for w in writes_of(plan, {})] == expected


def test_writes_of_builds_complete_worker_bodies() -> None:
    """The worker's body is the manifest with everything the plan decided for new workers."""
    plan = replace(FULL_PLAN, pins=("n7",), global_batch=128)
    [worker] = [w for w in writes_of(plan, {"": "trainers"}) if described(w) == ("create Pod", "w-worker-4")]
    assert isinstance(worker, CreateChild)
    expected = manifests.worker_pod(WRITER, 4, 2, {"": "trainers"}, global_batch=128, node="n7")
    assert worker.body == expected
    assert worker.body["spec"]["serviceAccountName"] == "trainers"


def test_plan_job_counts_its_writes_without_building_them() -> None:
    """The planner counts the writes its plan's fields call for; only a pass that applies the plan
    builds them (`decide.this_pass`), so a plan left for later costs no pod bodies."""
    job = make_job(JobBuilder("fresh").replicas(1, 2))
    plan = plan_job(job, observed([], frozenset()), NOW, PlannerConfig(trainer_service_accounts={"": "sa"}))
    built = writes_of(plan, {"": "sa"})
    assert plan.writes == () and plan.api_writes == len(built) > 0
    assert rendered(plan, {"": "sa"}).writes == built


@pytest.mark.parametrize(
    "plan", [FULL_PLAN, Plan(job=WRITER, events=FULL_PLAN.events)], ids=["full", "events"]
)
def test_write_steps_count_what_writes_of_builds(plan: Plan) -> None:
    assert len(write_steps(plan, {})) == len(writes_of(plan, {}))
    assert rendered(plan, {}).write_count == len(writes_of(plan, {})) + len(plan.events)
