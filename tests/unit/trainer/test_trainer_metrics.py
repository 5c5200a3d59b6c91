"""Metrics exposition and rank 0's progress report outside a cluster (best effort by design)."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from pathlib import Path

import pytest
from ebbflow_api import contract
from ebbflow_trainer import metrics

from tests.trainer_config import trainer_config


def test_metrics_endpoint_exposes_the_trainer_series() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port)
    metrics.STEP.set(7)
    metrics.RESCALE_PAUSE.observe(2.5)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "ebbflow_trainer_step 7.0" in body
    assert 'ebbflow_trainer_rescale_pause_seconds_bucket{le="3.0"}' in body
    for series in (
        "samples_per_second",
        "virtual_nodes",
        "worker_samples_per_step",
        "loss",
        "steps_lost_total",
    ):
        assert f"ebbflow_trainer_{series}" in body


def test_progress_goes_to_a_local_file_outside_a_cluster(tmp_path: Path) -> None:
    reporter = metrics.ProgressReporter(trainer_config(checkpoint_path=str(tmp_path)), environ={})
    reporter.maybe_report(reporter.report(12, 96, 0.5, 100.0), force=True)
    report = json.loads((tmp_path / "progress.json").read_text())
    assert tuple(report) == contract.PROGRESS_FIELDS
    assert (report["step"], report["samples"], report["loss"], report["samplesPerSecond"]) == (
        12,
        96,
        0.5,
        100.0,
    )


def test_a_failing_progress_report_is_logged_once_and_the_next_one_still_goes_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "checkpoints"
    blocked.write_text("a file where the checkpoint directory should be")
    reporter = metrics.ProgressReporter(trainer_config(checkpoint_path=str(blocked)), environ={})
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        reporter.maybe_report(reporter.report(1, 8, 1.0, 1.0), force=True)  # returns, does not raise
    logged = [r.getMessage() for r in caplog.records if r.name == metrics.__name__]
    assert reporter.failures == 1
    assert len(logged) == 1 and logged[0].startswith("progress report failed:"), logged

    blocked.unlink()  # the path is usable again: the reporter must not have given up
    reporter.maybe_report(reporter.report(2, 16, 0.5, 1.0), force=True)
    assert reporter.failures == 1
    assert json.loads((blocked / "progress.json").read_text())["step"] == 2
