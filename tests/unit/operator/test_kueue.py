"""Kueue admission, pure: a queued job's slices -> what it may run, its next Workload write, and the
plan and pass that follow (decision/kueue.py, planner.py, decide.py)."""

from __future__ import annotations

from typing import Any

import pytest
from ebbflow_api.models import GPU_RESOURCE
from ebbflow_devtools.builders import (
    NOW,
    JobBuilder,
    WorkloadBuilder,
    make_job,
    make_node,
    make_rendezvous,
    make_worker,
)
from ebbflow_operator.decision import kueue
from ebbflow_operator.decision.allocator import PriorityFairShare
from ebbflow_operator.decision.decide import KueueObjects, OperatorConfig, decide
from ebbflow_operator.decision.model import Job, Json, Placement
from ebbflow_operator.decision.plan import Observed, PlannerConfig
from ebbflow_operator.decision.planner import plan_job, writes_of
from ebbflow_operator.decision.status import ADMITTED, SCHEDULABLE
from ebbflow_operator.decision.writes import ChildKind, CreateChild, PatchWorkload

JOB = make_job(JobBuilder("a").replicas(2, 8).queue("team").priority(5).set(leaveGraceSeconds=30))
OTHER = make_job(JobBuilder("b").replicas(1, 2).queue("team"))
NODES = {f"n{i}": make_node(f"n{i}", gpus=4) for i in range(3)}
CONFIG = PlannerConfig(pending_timeout=60, hold_seconds=300)


def slice_(index: int = 1, workers: int | None = None, job: Job = JOB) -> WorkloadBuilder:
    return WorkloadBuilder(job, index, workers)


@pytest.mark.parametrize(
    ("workloads", "expected"),
    [
        pytest.param([], (0, False, "Creating"), id="none-yet"),
        pytest.param(
            [slice_().pending()], (0, False, "Pending", "a-1: couldn't assign flavors"), id="pending"
        ),
        pytest.param(
            [slice_().admitted(4)],
            (4, True, "Admitted", "a-1 admitted by ClusterQueue team: 4"),
            id="partial",
        ),
        pytest.param(
            [slice_().admitted().evicted()], (0, False, "EvictedPreempted", "a-1: Preempted to"), id="evicted"
        ),
        pytest.param(
            [slice_().admitted(2).finished(), slice_(2).admitted(6)], (6, True, "Admitted"), id="replaced"
        ),
        pytest.param([slice_(job=OTHER).admitted()], (0, False, "Creating"), id="another-jobs"),
        # Kueue finishes the replaced slice, then writes the replacement's admission: in between,
        # the job keeps what it had.
        pytest.param(
            [slice_().admitted(2).finished(kueue.SLICE_REPLACED), slice_(2, 6).replacing("a-1").pending()],
            (2, True, "Admitted", "a-1 replaced by a-2"),
            id="replacement-being-admitted",
        ),
    ],
)
def test_admission_of(workloads: list[WorkloadBuilder], expected: tuple[Any, ...]) -> None:
    seen = kueue.admission_of(JOB, [w.parsed() for w in workloads], NOW + 5)
    values = (seen.workers, seen.admitted, seen.reason, seen.message)
    assert values[:3] == expected[:3]
    if len(expected) > 3:
        assert values[3].startswith(expected[3])


def write(
    workloads: list[WorkloadBuilder],
    target: int = 0,
    *,
    pods_left: bool = True,
    leaving: bool = False,
    room: int = 0,
    ended: str | None = None,
) -> Json | PatchWorkload | None:
    admission = kueue.admission_of(JOB, [w.parsed() for w in workloads], NOW)
    return kueue.next_write(
        JOB,
        admission,
        target=target,
        pods_left=pods_left,
        workers_leaving=leaving,
        room_workers=room,
        ended=ended,
        now=NOW,
    )


def guarded(name: str, *ops: Json, status: bool = False) -> PatchWorkload:
    guard = (
        {"op": "test", "path": "/metadata/uid", "value": f"uid-{name}"},
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
    )
    return PatchWorkload(name, (*guard, *ops), status)


def count(value: int) -> Json:
    return {"op": "replace", "path": "/spec/podSets/0/count", "value": value}


def test_the_first_slice_asks_for_max_down_to_min_with_the_pods_requests() -> None:
    body = write([])
    assert isinstance(body, dict)
    assert body["metadata"]["name"] == "a-1"
    assert body["metadata"]["ownerReferences"][0]["uid"] == JOB.uid
    assert body["metadata"]["annotations"] == {kueue.ELASTIC_ANNOTATION: "true"}
    assert body["spec"]["queueName"] == "team" and body["spec"]["priority"] == 5
    workers, rendezvous = body["spec"]["podSets"]
    assert (workers["name"], workers["count"], workers["minCount"]) == ("workers", 8, 2)
    assert (rendezvous["name"], rendezvous["count"]) == ("rendezvous", 1)
    # The template sets the GPU as a limit only; Kueue counts requests, as the API server defaults them.
    trainer = workers["template"]["spec"]["containers"][0]
    assert trainer["resources"]["requests"][GPU_RESOURCE] == 1


@pytest.mark.parametrize(
    ("workloads", "target", "others", "expected"),
    [
        pytest.param([slice_().pending()], 0, {}, None, id="pending-waits"),
        pytest.param([slice_().admitted(4)], 4, {}, None, id="admitted-no-room"),
        pytest.param([slice_().admitted(8)], 8, {"room": 4}, None, id="at-max"),
        pytest.param([slice_().admitted(4)], 3, {"room": 4}, guarded("a-1", count(3)), id="allocated-less"),
        pytest.param([slice_().admitted(8)], 5, {}, guarded("a-1", count(5)), id="shrink-gives-quota-back"),
        pytest.param([slice_().admitted(8)], 1, {}, guarded("a-1", count(2)), id="shrink-not-below-min"),
        pytest.param([slice_().admitted(8)], 5, {"leaving": True}, None, id="shrink-after-the-leavers-left"),
        pytest.param([slice_().admitted().evicted()], 0, {}, None, id="evicted-still-emptying"),
        pytest.param(
            [slice_().pending(), slice_(2, 6).replacing("a-1")],
            0,
            {},
            guarded("a-1", status=True),
            id="old-lost-its-quota",
        ),
        pytest.param(
            [slice_().admitted(4), slice_(2, 6).replacing("a-1").pending()],
            4,
            {"room": 2},
            None,
            id="replacement-waits",
        ),
        pytest.param(
            [slice_().admitted(4), slice_(2, 6).replacing("a-1").pending()],
            4,
            {"room": 3},
            guarded("a-2", count(7)),
            id="replacement-follows-the-room",
        ),
    ],
)
def test_next_write(
    workloads: list[WorkloadBuilder], target: int, others: dict[str, Any], expected: PatchWorkload | None
) -> None:
    result = write(workloads, target, **others)
    if isinstance(result, PatchWorkload) and isinstance(expected, PatchWorkload) and expected.status:
        assert (result.name, result.patch[:2], result.status) == (expected.name, expected.patch, True)
        return
    assert result == expected


def test_a_job_using_all_of_its_admission_asks_for_a_bigger_slice_replacing_it() -> None:
    body = write([slice_().admitted(4)], 4, room=3)
    assert isinstance(body, dict)
    assert body["metadata"]["name"] == "a-2"
    assert body["metadata"]["annotations"][kueue.REPLACEMENT_ANNOTATION] == "ns/a-1"
    workers = body["spec"]["podSets"][0]
    # All or nothing: a partial admission could replace the slice with one of its own size.
    assert workers["count"] == 7 and "minCount" not in workers
    assert write([slice_().admitted(4)], 4, room=30)["spec"]["podSets"][0]["count"] == 8  # type: ignore[index]


def conditions_of(patch: PatchWorkload) -> dict[str, tuple[str, str, str]]:
    [replaced] = [op for op in patch.patch if op["path"] == "/status/conditions"]
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in replaced["value"]}


def test_an_evicted_slice_is_released_once_the_job_has_emptied() -> None:
    patch = write([slice_().admitted().evicted()], 0, pods_left=False)
    assert isinstance(patch, PatchWorkload) and patch.status
    assert {"op": "remove", "path": "/status/admission"} in patch.patch
    conditions = conditions_of(patch)
    message = "Preempted to accommodate a workload"
    assert conditions["Requeued"] == ("True", "Preempted", message)
    assert conditions["QuotaReserved"] == ("False", "Pending", message)
    assert conditions["Admitted"] == ("False", "NoReservation", "The workload has no reservation")
    assert conditions["Evicted"][0] == "True"  # Kueue's own condition stays


@pytest.mark.parametrize(
    "workloads",
    [
        pytest.param(
            [slice_().admitted(4), slice_(2, 6).replacing("a-1").admitted(6)], id="replacement-admitted"
        ),
        pytest.param(
            [slice_().admitted(4).evicted(), slice_(2, 6).replacing("a-1").pending()], id="old-evicted"
        ),
    ],
)
def test_the_replaced_slice_is_finished(workloads: list[WorkloadBuilder]) -> None:
    patch = write(workloads, 4)
    assert isinstance(patch, PatchWorkload) and patch.name == "a-1" and patch.status
    assert conditions_of(patch)["Finished"] == (
        "True",
        "OutOfSync",
        "The workload slice is out of sync with its parent job",
    )


def test_a_replacement_on_its_way_keeps_the_workers_and_writes_nothing_until_its_window_ends() -> None:
    slices = [slice_().admitted(2).finished(kueue.SLICE_REPLACED), slice_(2, 6).replacing("a-1").pending()]
    parsed = [w.parsed() for w in slices]
    within = kueue.admission_of(JOB, parsed, NOW + kueue.REPLACEMENT_WINDOW_S - 1)
    assert (within.workers, within.admitted, within.running) == (2, True, None)
    assert write(slices, 2, room=4) is None
    late = kueue.admission_of(JOB, parsed, NOW + kueue.REPLACEMENT_WINDOW_S + 1)
    assert (late.workers, late.admitted, late.reason) == (0, False, "Pending")
    # Finished by the operator (the job's own replacement settled) or for another job's slice: no window.
    ours = [slice_().admitted(2).finished(), slice_(2, 6).replacing("a-1").pending()]
    assert kueue.admission_of(JOB, [w.parsed() for w in ours], NOW).workers == 0


def test_a_slice_lowered_in_place_is_admitted_for_its_new_count() -> None:
    lowered = slice_().admitted(8).obj()
    lowered["spec"]["podSets"][0]["count"] = 5  # the admission itself never changes
    assert kueue.admission_of(JOB, [kueue.parse_workload(lowered)], NOW).workers == 5


def test_an_ended_jobs_slice_is_finished_so_its_quota_goes_back_at_once() -> None:
    patch = write([slice_().admitted(4)], 0, ended="Succeeded")
    assert isinstance(patch, PatchWorkload) and patch.name == "a-1"
    assert conditions_of(patch)["Finished"] == ("True", "Succeeded", "the job succeeded")
    assert write([], 0, ended="Failed") is None  # nothing to finish, nothing created


# --- the plan of a queued job ---------------------------------------------------------------------


def observed(workloads: list[WorkloadBuilder], pods: list[Any], desired: int) -> Observed:
    admission = kueue.admission_of(JOB, [w.parsed() for w in workloads], NOW)
    return Observed(pods, frozenset(), NODES, desired, free_gpus=0, admission=admission)


def conditions(plan_status: Json) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in plan_status["conditions"]}


def test_a_job_waiting_for_admission_creates_its_workload_and_no_pod() -> None:
    plan = plan_job(JOB, observed([], [], desired=8), NOW, CONFIG)
    assert plan.create_workers == () and not plan.create_rendezvous_pod
    assert plan.create_service and plan.create_network_policy
    kinds = [w.kind for w in writes_of(plan, {}) if isinstance(w, CreateChild)]
    assert kinds == [ChildKind.NETWORK_POLICY, ChildKind.WORKLOAD, ChildKind.SERVICE]
    assert conditions(plan.status)[ADMITTED] == ("False", "Creating")
    waiting = plan_job(JOB, observed([slice_().pending()], [], desired=8), NOW, CONFIG)
    assert waiting.create_workload is None and waiting.create_workers == ()
    assert conditions(waiting.status)[SCHEDULABLE] == ("False", "WaitingForAdmission")
    assert conditions(waiting.status)[ADMITTED] == ("False", "Pending")


def test_an_admitted_job_runs_no_more_workers_than_its_admission() -> None:
    plan = plan_job(JOB, observed([slice_().admitted(3)], [], desired=8), NOW, CONFIG)
    assert len(plan.create_workers) == 3 and plan.create_rendezvous_pod
    assert conditions(plan.status)[ADMITTED] == ("True", "Admitted")


def test_an_evicted_job_leaves_gracefully_then_gives_up_its_rendezvous_and_its_quota() -> None:
    workers = [make_worker(JOB, i, "n0") for i in range(3)]
    rendezvous = make_rendezvous(JOB, "n1")
    evicted = [slice_().admitted(3).evicted()]
    leaving = plan_job(JOB, observed(evicted, [*workers, rendezvous], desired=8), NOW, CONFIG)
    assert sorted((d.name, d.grace_seconds) for d in leaving.delete) == [(w.name, 30) for w in workers]
    assert leaving.patch_workload is None  # the workers still hold the quota's GPUs
    emptied = plan_job(JOB, observed(evicted, [rendezvous], desired=8), NOW, CONFIG)
    assert [d.name for d in emptied.delete] == [rendezvous.name]
    assert emptied.patch_workload is None  # the rendezvous pod is still there
    released = plan_job(JOB, observed(evicted, [], desired=8), NOW, CONFIG)
    assert released.patch_workload is not None and released.patch_workload.status
    assert not released.create_rendezvous_pod and released.create_workers == ()


SPOT_FLAVOR = kueue.Flavor(
    "spot",
    {"pool": "spot-gpus"},
    ({"key": "spot", "operator": "Exists", "effect": "NoSchedule"},),
)


def test_the_admitted_flavors_node_labels_and_tolerations_go_onto_the_workers() -> None:
    admission = kueue.admission_of(
        JOB, [slice_().admitted(2, flavor="spot").parsed()], NOW, {"spot": SPOT_FLAVOR}
    )
    assert admission.placement == Placement({"pool": "spot-gpus"}, SPOT_FLAVOR.tolerations)
    seen = Observed([], frozenset(), NODES, 8, free_gpus=0, admission=admission)
    plan = plan_job(JOB, seen, NOW, CONFIG)
    pods = [
        w.body
        for w in writes_of(plan, {})
        if isinstance(w, CreateChild) and w.body["metadata"]["name"].startswith("a-worker")
    ]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["pool"] == "spot-gpus"
        assert SPOT_FLAVOR.tolerations[0] in pod["spec"]["tolerations"]


# --- the pass --------------------------------------------------------------------------------------


def test_the_allocator_gives_a_queued_job_no_more_than_its_admission() -> None:
    unqueued = make_job(JobBuilder("c").replicas(1, 8))
    config = OperatorConfig(kueue=True)
    workloads = [slice_().admitted(3).parsed()]
    objects = KueueObjects(workloads)
    result = decide(
        list(NODES.values()), [], [JOB, unqueued], {}, {}, NOW, config, PriorityFairShare(), None, objects
    )
    plans = {p.job.name: p for p in result.plans}
    assert len(plans["a"].create_workers) == 3
    assert len(plans["c"].create_workers) == 8  # the GPUs Kueue did not admit to a go to the others
    ignored = decide(list(NODES.values()), [], [JOB], {}, {}, NOW, OperatorConfig(), PriorityFairShare())
    assert len(ignored.plans[0].create_workers) == 8  # without --kueue the label means nothing


def test_the_allocator_places_a_queued_job_on_its_flavors_nodes_only() -> None:
    nodes = [*NODES.values(), make_node("spot-0", gpus=4, labels={"pool": "spot-gpus"})]
    workloads = [slice_().admitted(8, flavor="spot").parsed()]
    config = OperatorConfig(kueue=True)
    objects = KueueObjects(workloads, [SPOT_FLAVOR])
    result = decide(nodes, [], [JOB], {}, {}, NOW, config, PriorityFairShare(), None, objects)
    # Only the flavor's node carries its label: four workers fit there, whatever the admission.
    assert len(result.plans[0].create_workers) == 4
