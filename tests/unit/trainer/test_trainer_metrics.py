"""Metrics exposition and rank 0's progress report outside a cluster (best effort by design)."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import pytest
from ebbflow_api import contract
from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer import metrics

SHAPE = metrics.StepShape(world_size=2, micro_batch=8, micro_batches=3, step_seconds=1.0, compute_seconds=0.6)


def test_metrics_endpoint_exposes_the_trainer_series() -> None:
    port = free_port()
    metrics.serve(port)
    metrics.STEP.set(7)
    metrics.RESCALE_PAUSE.observe(2.5)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "ebbflow_trainer_step 7.0" in body
    assert 'ebbflow_trainer_rescale_pause_seconds_bucket{le="3.0"}' in body
    for series in (
        "samples_per_second",
        "virtual_nodes",
        "global_batch_size",
        "worker_samples_per_step",
        "loss",
        "steps_lost_total",
    ):
        assert f"ebbflow_trainer_{series}" in body


def test_progress_goes_to_a_local_file_outside_a_cluster(tmp_path: Path) -> None:
    reporter = metrics.ProgressReporter(trainer_config(checkpoint_path=str(tmp_path)), environ={})
    reporter.maybe_report(reporter.report(12, 96, 0.5, 100.0, None, SHAPE), force=True)
    report = json.loads((tmp_path / "progress.json").read_text())
    assert tuple(report) == contract.PROGRESS_FIELDS
    assert (report["step"], report["samples"], report["loss"], report["samplesPerSecond"]) == (
        12,
        96,
        0.5,
        100.0,
    )
    # Rank 0 did 3 micro-batches of 0.2 s: 2 accumulated, 0.4 s of the step was not its compute.
    shape = [report[k] for k in ("worldSize", "microBatch", "accumulationSteps", "stepSeconds")]
    assert shape == [2, 8, 2, 1.0]
    assert report["computeSeconds"] == pytest.approx(0.2)
    assert report["communicationSeconds"] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("noise", "reported"),
    [(None, None), (float("inf"), None), (float("nan"), None), (64.0, 64.0)],
    ids=["not-estimated", "no-signal-yet", "nan", "estimated"],
)
def test_the_noise_scale_is_reported_only_when_finite(noise: float | None, reported: float | None) -> None:
    """JSON has no infinity: before the estimate has a signal the report says null."""
    shape = metrics.StepShape(2, 8, 1, 1.0, 0.5, noise_scale=noise)
    report = metrics.ProgressReporter.report(1, 8, 1.0, 8.0, None, shape)
    assert report["noiseScale"] == reported
    json.dumps(report, allow_nan=False)


def test_a_failing_progress_report_is_logged_once_and_the_next_one_still_goes_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "checkpoints"
    blocked.write_text("a file where the checkpoint directory should be")
    reporter = metrics.ProgressReporter(trainer_config(checkpoint_path=str(blocked)), environ={})
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        # Returns, does not raise.
        reporter.maybe_report(reporter.report(1, 8, 1.0, 1.0, None, SHAPE), force=True)
    logged = [r.getMessage() for r in caplog.records if r.name == metrics.__name__]
    assert reporter.failures == 1
    assert len(logged) == 1 and logged[0].startswith("progress report failed:"), logged

    blocked.unlink()  # the path is usable again: the reporter must not have given up
    reporter.maybe_report(reporter.report(2, 16, 0.5, 1.0, None, SHAPE), force=True)
    assert reporter.failures == 1
    assert json.loads((blocked / "progress.json").read_text())["step"] == 2
