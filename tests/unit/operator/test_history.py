"""The trainers' reports turned into what the goodput and quality policies read (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ebbflow_api.models import parse_time
from ebbflow_devtools.builders import JobBuilder, make_job, make_node, make_worker
from ebbflow_operator.decision.allocator import PriorityFairShare
from ebbflow_operator.decision.model import Node
from ebbflow_operator.policies import GoodputPolicy, NodeDevices, QualityPolicy, policy_named
from ebbflow_operator.policies.history import (
    MAX_LOSSES,
    History,
    JobHistory,
    Where,
    measurement_of,
    node_devices,
    placement_of,
    record,
)
from ebbflow_operator.policies.throughput import Measurement


def report(step: int, time: str, **fields: Any) -> dict[str, Any]:
    """A trainer's progress report: two workers, 8-sample micro-batches, 1 s steps by default."""
    base = {
        "step": step,
        "loss": 2.0 / step,
        "time": time,
        "worldSize": 2,
        "microBatch": 8,
        "accumulationSteps": 1,
        "stepSeconds": 1.0,
        "computeSeconds": 0.4,
        "communicationSeconds": 0.2,
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(
            {},
            Measurement(
                workers=2, micro_batch=8, step_s=1.0, compute_s=0.4, nodes=2, accum_steps=1, share=1.5
            ),
            id="complete",
        ),
        pytest.param({"worldSize": None}, None, id="an-older-trainer-without-the-shape"),
        pytest.param({"stepSeconds": 0}, None, id="no-step-time"),
        pytest.param({"computeSeconds": "fast"}, None, id="not-a-number"),
        pytest.param(
            {"accumulationSteps": None},
            Measurement(
                workers=2, micro_batch=8, step_s=1.0, compute_s=0.4, nodes=2, accum_steps=0, share=1.5
            ),
            id="accumulation-defaults-to-none",
        ),
    ],
)
def test_a_report_becomes_one_measurement(fields: dict[str, Any], expected: Measurement | None) -> None:
    assert measurement_of(report(10, "t1", **fields), Where(nodes=2, share=1.5)) == expected


def test_a_report_is_recorded_once_and_a_known_shape_is_replaced_not_repeated() -> None:
    history = record(JobHistory(), report(10, "t1"), Where())
    assert record(history, report(10, "t1"), Where()) is history  # the same report again
    history = record(history, report(20, "t2", stepSeconds=0.9), Where())
    history = record(history, report(30, "t3", worldSize=4, stepSeconds=0.6), Where())
    assert [(m.workers, m.step_s) for m in history.measurements] == [(2, 0.9), (4, 0.6)]
    assert history.losses == ((10.0, 0.2), (20.0, 0.1), (30.0, 2.0 / 30))
    assert history.step == 30.0 and history.last_report == "t3"


RESCALED_AT = "2026-01-01T00:01:00Z"


@pytest.mark.parametrize(
    ("stamp", "measured"),
    [
        pytest.param("2026-01-01T00:00:59Z", False, id="before-the-rescale-another-world"),
        pytest.param(RESCALED_AT, False, id="the-rescale's-second-either-world"),
        pytest.param("2026-01-01T00:01:01Z", True, id="after-the-rescale"),
        pytest.param("t1", True, id="unreadable-time-nothing-says-it-is-old"),
    ],
)
def test_a_report_from_before_the_last_rescale_times_no_shape(stamp: str, measured: bool) -> None:
    """Its step time belongs to the workers and nodes before the rescale, not the job's present ones."""
    where = Where(nodes=1, since=parse_time(RESCALED_AT) or 0.0)
    history = record(JobHistory(), report(10, stamp), where)
    assert bool(history.measurements) is measured
    assert history.losses == ((10.0, 0.2),)  # the loss at a step is the same in any world


def test_the_history_dates_reports_against_the_jobs_last_rescale() -> None:
    """Two workers on two nodes timed a slow step; the job shrank to one: that report is not one
    worker's shape, while the next report, from the world of one, is."""
    rescale = {"time": RESCALED_AT, "from": 2, "to": 1, "reason": "CapacityReclaimed"}
    train = make_job(JobBuilder("train").replicas(1, 4), status={"lastRescale": rescale})
    devices = node_devices([make_node("a")])
    history = History()
    old = report(10, "2026-01-01T00:00:58Z", stepSeconds=3.0)
    history.update([train], [make_worker(train, 0, "a", progress=json.dumps(old))], devices)
    assert history.jobs[train.key].measurements == ()
    new = report(12, "2026-01-01T00:01:03Z", worldSize=1)
    history.update([train], [make_worker(train, 0, "a", progress=json.dumps(new))], devices)
    assert [(m.workers, m.nodes) for m in history.jobs[train.key].measurements] == [(1, 1)]


def test_losses_keep_the_first_and_the_newest_and_never_go_back_in_step() -> None:
    history = JobHistory()
    for step in range(1, MAX_LOSSES + 11):
        history = record(history, report(step, f"t{step}"), Where())
    history = record(history, report(5, "late"), Where())  # a restarted job's older step
    assert len(history.losses) == MAX_LOSSES
    assert [k for k, _ in history.losses] == [1.0] + [float(s) for s in range(12, MAX_LOSSES + 11)]


def test_noise_scale_and_pause_keep_their_last_measured_value() -> None:
    history = record(JobHistory(), report(1, "t1", noiseScale=64.0, rescalePauseSeconds=4.5), Where())
    history = record(history, report(2, "t2", noiseScale=None, rescalePauseSeconds=None), Where())
    assert (history.noise_scale, history.rescale_pause_s) == (64.0, 4.5)


@pytest.mark.parametrize(
    ("labels", "gpus", "expected"),
    [
        pytest.param({}, 4, NodeDevices(physical=4, replicas=4), id="no-labels-every-gpu-physical"),
        pytest.param({"nvidia.com/gpu.replicas": "4"}, 16, NodeDevices(4, 16), id="time-sliced-by-4"),
        pytest.param({"nvidia.com/gpu.count": "2"}, 8, NodeDevices(2, 8), id="physical-count-label"),
        pytest.param({"nvidia.com/gpu.replicas": "x"}, 4, NodeDevices(4, 4), id="unreadable-label"),
        pytest.param({}, 0, NodeDevices(0, 0), id="no-gpus"),
    ],
)
def test_physical_gpus_come_from_gpu_feature_discovery_labels(
    labels: dict[str, str], gpus: int, expected: NodeDevices
) -> None:
    assert node_devices([Node("a", gpus, labels=labels)]) == {"a": expected}


def test_placement_counts_nodes_and_the_most_contended_share() -> None:
    train = make_job(JobBuilder("train").replicas(1, 4))
    other = make_job(JobBuilder("other").replicas(1, 4))
    workers = [make_worker(train, 0, "a"), make_worker(train, 1, "b"), make_worker(train, 2, None)]
    busy = [make_worker(other, i, "b") for i in range(3)]  # b: 4 GPUs held on 2 physical
    devices = {"a": NodeDevices(4, 4), "b": NodeDevices(2, 8)}
    assert placement_of(workers, [*workers, *busy], devices) == Where(nodes=2, share=2.0)


def _annotated(job: Any, index: int, body: dict[str, Any]) -> Any:
    return make_worker(job, index, "a", progress=json.dumps(body))


def test_history_reads_the_newest_worker_report_and_forgets_deleted_jobs() -> None:
    train = make_job(JobBuilder("train").replicas(1, 4).virtual_nodes(4).global_batch_size(32))
    pods = [
        _annotated(train, 0, report(10, "2026-01-01T00:00:10Z")),
        _annotated(train, 1, report(9, "2026-01-01T00:00:09Z")),
    ]
    history = History()
    history.update([train], pods, node_devices([make_node("a")]))
    (metrics,) = history.metrics([train], {}).values()
    assert (metrics.global_batch, metrics.virtual_nodes, metrics.step) == (32, 4, 10.0)
    assert [m.workers for m in metrics.measurements] == [2]
    history.update([], pods, {})
    assert history.jobs == {}


def test_after_a_restart_the_history_starts_from_the_status_report() -> None:
    """A new operator has no memory: the job's status.progress is its first measurement."""
    status = {"progress": report(42, "2026-01-01T00:01:00Z", worldSize=3)}
    train = make_job(JobBuilder("train").replicas(1, 4), status=status)
    history = History()
    history.update([train], [], {})
    (metrics,) = history.metrics([train], {}).values()
    assert metrics.step == 42.0 and [m.workers for m in metrics.measurements] == [3]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("fair", PriorityFairShare), ("goodput", GoodputPolicy), ("quality", QualityPolicy)],
    ids=["fair", "goodput", "quality"],
)
def test_policy_named_builds_each_policy(name: str, kind: type) -> None:
    assert isinstance(policy_named(name, {}, {}, 0.0), kind)


def test_an_unknown_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="fair, goodput, quality"):
        policy_named("fastest", {}, {}, 0.0)


def test_where_names_the_gpu_type_only_when_every_node_has_the_same() -> None:
    train = make_job(JobBuilder("train").replicas(1, 4))
    devices = {
        "a": NodeDevices(4, 4, gpu_type="A100"),
        "b": NodeDevices(4, 4, gpu_type="A100"),
        "t": NodeDevices(4, 4, gpu_type="T4"),
    }
    same = [make_worker(train, 0, "a"), make_worker(train, 1, "b")]
    mixed = [make_worker(train, 0, "a"), make_worker(train, 1, "t")]
    assert placement_of(same, same, devices).gpu_type == "A100"
    assert placement_of(mixed, mixed, devices).gpu_type == ""


def test_time_sliced_products_are_one_type_with_the_learned_speed() -> None:
    labels = {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "2"}
    (device,) = node_devices([Node("t", 8, labels=labels)], {"Tesla-T4": 0.4}).values()
    assert (device.gpu_type, device.speed, device.physical) == ("Tesla-T4", 0.4, 4)


def test_speeds_are_pooled_over_jobs_and_reach_the_measurements() -> None:
    """Job a ran on A100 and T4 (compute 2.5x slower there); job b only on A100."""
    history = History()
    where_a100, where_t4 = Where(1, 1.0, "A100"), Where(1, 1.0, "T4")
    a = record(JobHistory(), report(1, "t1", computeSeconds=0.4), where_a100)
    a = record(a, report(2, "t2", computeSeconds=1.0, worldSize=3), where_t4)
    b = record(JobHistory(), report(1, "t1", computeSeconds=0.2), where_a100)
    history.jobs = {("ns", "a"): a, ("ns", "b"): b}
    speeds = history.speeds()
    assert speeds == {"A100": 1.0, "T4": pytest.approx(0.4)}
    job_a = make_job(JobBuilder("a").replicas(1, 4))
    (metrics,) = history.metrics([job_a], speeds).values()
    assert [(m.gpu_type, m.speed) for m in metrics.measurements] == [
        ("A100", 1.0),
        ("T4", pytest.approx(0.4)),
    ]
