"""Metrics exposition and rank 0's progress report outside a cluster (best effort by design)."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

from ebbflow_api import contract
from ebbflow_trainer import metrics
from ebbflow_trainer.config import TrainerConfig


def _config(checkpoint_path: str) -> TrainerConfig:
    return TrainerConfig(
        spec="",
        rdzv_endpoint="rdzv:1",
        rdzv_id="unit",
        min_replicas=1,
        max_replicas=1,
        virtual_nodes=1,
        global_batch_size=8,
        checkpoint_path=checkpoint_path,
    )


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
    reporter = metrics.ProgressReporter(_config(str(tmp_path)), environ={})
    reporter.maybe_report(reporter.report(12, 96, 0.5, 100.0), force=True)
    report = json.loads((tmp_path / "progress.json").read_text())
    assert tuple(report) == contract.PROGRESS_FIELDS
    assert (report["step"], report["samples"], report["loss"], report["samplesPerSecond"]) == (
        12,
        96,
        0.5,
        100.0,
    )


def test_a_failing_progress_report_never_raises(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    reporter = metrics.ProgressReporter(_config(str(blocked)), environ={})
    reporter.maybe_report(reporter.report(1, 8, 1.0, 1.0), force=True)
    assert not (blocked / "progress.json").exists()
