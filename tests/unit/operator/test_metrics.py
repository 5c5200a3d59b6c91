"""The operator's per-job gauges: set from each pass's job samples, removed when a job vanishes, and
none of them (nor the cluster's GPUs) on a replica that stands by."""

from __future__ import annotations

from ebbflow_operator.metrics import JobSample, Metrics
from prometheus_client import generate_latest

A = JobSample(("team", "a"), "Running", desired=3, current=3, ready=2, gpus_per_worker=2)
B = JobSample(("team", "b"), "Pending", desired=1, current=0, ready=0, gpus_per_worker=1)


def _exposition(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_each_job_reports_desired_current_ready_and_allocated_gpus() -> None:
    metrics = Metrics()
    metrics.record_jobs([A, B])
    text = _exposition(metrics)
    labels = 'job="a",namespace="team"'
    assert f"ebbflow_job_desired_workers{{{labels}}} 3.0" in text
    assert f"ebbflow_job_current_workers{{{labels}}} 3.0" in text
    assert f"ebbflow_job_ready_workers{{{labels}}} 2.0" in text
    assert f"ebbflow_job_allocated_gpus{{{labels}}} 6.0" in text
    assert 'ebbflow_jobs{phase="Running"} 1.0' in text
    assert 'ebbflow_jobs{phase="Pending"} 1.0' in text
    assert 'ebbflow_jobs{phase="Succeeded"} 0.0' in text


def test_a_vanished_job_loses_every_series() -> None:
    metrics = Metrics()
    metrics.record_jobs([A, B])
    metrics.record_jobs([B])
    text = _exposition(metrics)
    assert 'job="a"' not in text
    assert 'ebbflow_job_allocated_gpus{job="b",namespace="team"} 1.0' in text


def test_a_replica_that_stands_by_exports_no_jobs_and_no_gpus_but_keeps_its_counters() -> None:
    metrics = Metrics()
    metrics.record_jobs([A, B])
    metrics.gpus.labels("total").set(12)
    metrics.reconcile_errors.inc()
    metrics.forget_cluster_state()
    text = _exposition(metrics)
    for name in ("ebbflow_job_desired_workers{", "ebbflow_jobs{", "ebbflow_cluster_gpus{"):
        assert name not in text, name
    assert "ebbflow_reconcile_errors_total 1.0" in text
    metrics.record_jobs([B])  # leading again: the next pass's values
    assert 'ebbflow_job_desired_workers{job="b",namespace="team"} 1.0' in _exposition(metrics)
