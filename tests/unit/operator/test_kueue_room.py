"""Room made for a higher-priority queued job by shrinking lower-priority ones gracefully, pure
(decision/kueue_room.py), and the pass that carries it out (decide.py, planner.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from ebbflow_devtools.builders import (
    NOW,
    JobBuilder,
    WorkloadBuilder,
    make_cluster_queue,
    make_job,
    make_local_queue,
    make_node,
    make_worker,
)
from ebbflow_operator.decision import kueue, kueue_room
from ebbflow_operator.decision.allocator import PriorityFairShare
from ebbflow_operator.decision.decide import KueueObjects, OperatorConfig, decide
from ebbflow_operator.decision.model import Job
from ebbflow_operator.decision.status import ADMITTED

LOW = make_job(JobBuilder("a").replicas(2, 8).queue("team"))
HIGH = make_job(JobBuilder("b").replicas(4, 4).queue("team").priority(100), age=5)
LOCAL = {("ns", "team"): make_local_queue()}


def queued(name: str, low: int, high: int, priority: int = 0, age: float = 3600.0, gpus: int = 1) -> Job:
    builder = JobBuilder(name).replicas(low, high).queue("team").priority(priority).gpus(gpus)
    return make_job(builder, age=age)


def room(
    jobs: Sequence[Job],
    workloads: Sequence[WorkloadBuilder],
    queue: kueue_room.ClusterQueue | None = None,
    local: dict[tuple[str, str], kueue_room.LocalQueue] | None = None,
) -> kueue_room.Room:
    parsed = [w.parsed() for w in workloads]
    admissions = {job.key: kueue.admission_of(job, parsed, NOW) for job in jobs}
    queues = {"team": queue or make_cluster_queue(gpus=8)}
    return kueue_room.make_room(admissions, jobs, parsed, queues, LOCAL if local is None else local, NOW)


def first(result: kueue_room.Room, job: Job) -> tuple[int | None, str]:
    admission = result.admissions[job.key]
    return admission.first_workers, admission.reason


A8 = WorkloadBuilder(LOW).admitted(8)


@pytest.mark.parametrize(
    ("jobs", "workloads", "queue", "expected_first", "expected_yields"),
    [
        pytest.param([LOW, HIGH], [A8], make_cluster_queue(gpus=12), (4, "Creating"), {}, id="fits"),
        pytest.param([LOW, HIGH], [A8], None, (0, "MakingRoom"), {LOW.key: 4}, id="lower-shrinks"),
        pytest.param(
            [LOW, HIGH],
            [WorkloadBuilder(LOW).admitted(8).lowered(4)],
            None,
            (4, "Creating"),
            {},
            id="lowered-in-place-counts-at-once",
        ),
        pytest.param(
            [queued("a", 6, 8), HIGH],
            [WorkloadBuilder(queued("a", 6, 8)).admitted(8)],
            None,
            (4, "Creating"),
            {},
            id="shrinking-cannot-make-room-kueue-decides",
        ),
        pytest.param(
            [LOW, HIGH],
            [A8],
            make_cluster_queue(gpus=8, policy="Never"),
            (4, "Creating"),
            {},
            id="never-preempts",
        ),
        pytest.param(
            [LOW, queued("b", 4, 4, priority=100, age=kueue_room.ROOM_DEADLINE_S + 1)],
            [A8],
            None,
            (4, "Creating"),
            {},
            id="deadline-passed-kueue-decides",
        ),
        pytest.param([LOW, queued("b", 4, 4, age=5)], [A8], None, (4, "Creating"), {}, id="equal-priority"),
        pytest.param(
            [LOW, queued("b", 4, 4, age=5)],
            [A8],
            make_cluster_queue(gpus=8, policy="LowerOrNewerEqualPriority"),
            (4, "Creating"),
            {},
            id="equal-priority-but-older-is-no-victim",
        ),
        pytest.param(
            [LOW, queued("b", 2, 6, priority=100, age=5)],
            [A8],
            None,
            (0, "MakingRoom"),
            {LOW.key: 6},
            id="room-for-its-max-down-to-the-victims-min",
        ),
        pytest.param(
            [LOW, queued("b", 2, 2, priority=100, age=5, gpus=2)],
            [A8],
            None,
            (0, "MakingRoom"),
            {LOW.key: 4},
            id="gpus-per-worker",
        ),
    ],
)
def test_make_room(
    jobs: list[Job],
    workloads: list[WorkloadBuilder],
    queue: kueue_room.ClusterQueue | None,
    expected_first: tuple[int, str],
    expected_yields: dict[tuple[str, str], int],
) -> None:
    result = room(jobs, workloads, queue)
    assert first(result, jobs[-1]) == expected_first
    assert result.yields == expected_yields


def test_victims_go_lowest_priority_first_and_never_below_their_minimum() -> None:
    lowest, middle = queued("a", 1, 4, priority=0), queued("c", 1, 4, priority=10)
    new = queued("b", 4, 4, priority=100, age=5)
    workloads = [WorkloadBuilder(lowest).admitted(4), WorkloadBuilder(middle).admitted(4)]
    result = room([lowest, middle, new], workloads)
    assert result.yields == {lowest.key: 3, middle.key: 1}
    assert "a 4 -> 1, c 4 -> 3" in result.admissions[new.key].message


def test_the_most_recently_admitted_of_one_priority_goes_first() -> None:
    older, newer = queued("a", 1, 4), queued("c", 1, 4)
    new = queued("b", 2, 2, priority=100, age=5)
    earlier = WorkloadBuilder(older).admitted(4).obj()
    earlier["status"]["conditions"][0]["lastTransitionTime"] = "1970-01-01T00:00:01Z"
    parsed = [kueue.parse_workload(earlier), WorkloadBuilder(newer).admitted(4).parsed()]
    admissions = {job.key: kueue.admission_of(job, parsed, NOW) for job in (older, newer, new)}
    queues = {"team": make_cluster_queue(gpus=8)}
    result = kueue_room.make_room(admissions, [older, newer, new], parsed, queues, LOCAL, NOW)
    assert result.yields == {newer.key: 2}


def test_quota_held_by_other_workloads_and_waiting_higher_priorities_leaves_no_room_to_grow() -> None:
    other = queued("x", 1, 2)  # its Workload shares the ClusterQueue; the operator does not run it
    pending_high = queued("b", 4, 4, priority=100)
    workloads = [
        WorkloadBuilder(LOW).admitted(4),
        WorkloadBuilder(other).admitted(2),
        WorkloadBuilder(pending_high).pending(),
    ]
    result = room([LOW, pending_high], workloads)
    assert result.admissions[LOW.key].quota_gpus == 0  # 8 - 4 - 2, and b waits for 4
    alone = room([LOW], [WorkloadBuilder(LOW).admitted(4)])
    assert alone.admissions[LOW.key].quota_gpus == 4


def test_a_job_whose_queue_or_cluster_queue_is_unknown_is_left_to_kueue() -> None:
    result = room([LOW, HIGH], [A8], local={})
    assert first(result, HIGH) == (None, "Creating") and result.yields == {}


def test_the_first_slice_asks_for_the_count_room_was_made_for() -> None:
    admission = kueue.admission_of(HIGH, [], NOW)
    waiting = kueue.next_write(
        HIGH,
        replace(admission, first_workers=0),
        target=0,
        pods_left=False,
        workers_leaving=False,
        room_workers=0,
        ended=None,
        now=NOW,
    )
    assert waiting is None
    partial = queued("c", 2, 6, priority=100, age=5)
    body = kueue.next_write(
        partial,
        replace(kueue.admission_of(partial, [], NOW), first_workers=4),
        target=0,
        pods_left=False,
        workers_leaving=False,
        room_workers=0,
        ended=None,
        now=NOW,
    )
    assert isinstance(body, dict)
    assert body["spec"]["podSets"][0] | {"template": None} == {
        "name": "workers",
        "count": 4,
        "minCount": 2,
        "template": None,
    }


NODES = [make_node(f"n{i}", gpus=4) for i in range(3)]


def test_the_pass_shrinks_the_lower_priority_job_gracefully_then_creates_the_new_slice() -> None:
    config = OperatorConfig(kueue=True)
    queues = KueueObjects(cluster_queues=[make_cluster_queue(gpus=8)], local_queues=list(LOCAL.values()))
    workers = [make_worker(LOW, i, f"n{i % 2}") for i in range(8)]
    making_room = decide(
        NODES,
        workers,
        [LOW, HIGH],
        {},
        {},
        NOW,
        config,
        PriorityFairShare(),
        None,
        KueueObjects([A8.parsed()], (), queues.cluster_queues, queues.local_queues),
    )
    plans = {p.job.name: p for p in making_room.plans}
    assert len(plans["a"].delete) == 4 and all(d.grace_seconds > 0 for d in plans["a"].delete)
    assert plans["b"].create_workload is None and plans["b"].create_workers == ()
    admitted = next(c for c in plans["b"].status["conditions"] if c["type"] == ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("False", "MakingRoom")

    kept = [w for w in workers if w.name not in {d.name for d in plans["a"].delete}]
    lowered = WorkloadBuilder(LOW).admitted(8).lowered(4).parsed()
    made = decide(
        NODES,
        kept,
        [LOW, HIGH],
        {},
        {},
        NOW,
        config,
        PriorityFairShare(),
        None,
        KueueObjects([lowered], (), queues.cluster_queues, queues.local_queues),
    )
    plans = {p.job.name: p for p in made.plans}
    assert plans["a"].delete == () and plans["a"].create_workload is None  # no growth into b's room
    body = plans["b"].create_workload
    assert body is not None and body["spec"]["podSets"][0]["count"] == 4


def test_a_waiting_slice_that_can_never_fit_the_quota_holds_back_nobody() -> None:
    huge = queued("h", 10, 12, priority=100)
    workloads = [WorkloadBuilder(LOW).admitted(4), WorkloadBuilder(huge).pending()]
    assert room([LOW, huge], workloads).admissions[LOW.key].quota_gpus == 4
