"""Prometheus metrics and rank 0's progress report (best effort: reporting never stops training).

Progress goes where the operator reads it: JSON with ``contract.PROGRESS_FIELDS`` in the pod's
``contract.ANNOTATION_PROGRESS`` annotation (a merge-patch through the Kubernetes API with the pod's
service-account token), or, outside a cluster, ``progress.json`` under the checkpoint path (the
node's state directory when checkpoints go to an object store).
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ebbflow_trainer.config import TrainerConfig

log = logging.getLogger(__name__)

STEP = Gauge("ebbflow_trainer_step", "Global training steps completed")
SAMPLES = Counter("ebbflow_trainer_samples", "Samples trained on by the whole job, counted by this worker")
SAMPLES_PER_SECOND = Gauge("ebbflow_trainer_samples_per_second", "Job throughput over the last step")
STEP_SECONDS = Histogram(
    "ebbflow_trainer_step_seconds",
    "Wall time of one global step",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
COMPUTE_SECONDS = Gauge("ebbflow_trainer_compute_seconds", "This worker's compute time in the last step")
VIRTUAL_NODES = Gauge("ebbflow_trainer_virtual_nodes", "Virtual nodes assigned to this worker")
GLOBAL_BATCH_SIZE = Gauge(
    "ebbflow_trainer_global_batch_size",
    "Samples per step of the whole job (B) in the last step; changes only with spec.maxGlobalBatchSize",
)
COMPRESSION_RATE = Gauge(
    "ebbflow_trainer_compression_rate",
    "Fraction of each band-limited convolution's spectrum dropped (0 without spec.bandLimit)",
)
WORKER_SAMPLES = Gauge("ebbflow_trainer_worker_samples_per_step", "Samples per step computed by this worker")
LOSS = Gauge("ebbflow_trainer_loss", "Training loss of the last step (mean over the global batch)")
WORLD_SIZE = Gauge("ebbflow_trainer_world_size", "Workers in the current world")
GENERATION = Gauge("ebbflow_trainer_generation", "Rendezvous generation of the current world")
RESCALE_PAUSE = Histogram(
    "ebbflow_trainer_rescale_pause_seconds",
    "From the last step before a membership change to the first step after it",
    buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120),
)
NONFINITE_STEPS = Counter(
    "ebbflow_trainer_nonfinite_steps",
    "Steps skipped because their loss or gradient was not finite (NaN or infinity)",
)
STEPS_LOST = Counter(
    "ebbflow_trainer_steps_lost", "Completed steps that had to be trained again after a restart"
)
OVERFLOW_STEPS = Counter(
    "ebbflow_trainer_overflow_steps",
    "Steps skipped because the fp16 loss scale made the gradient overflow (the scale backed off)",
)
LOSS_SCALE = Gauge("ebbflow_trainer_loss_scale", "The fp16 dynamic loss scale for the next step")
LEARNING_RATE = Gauge(
    "ebbflow_trainer_learning_rate", "The learning rate of the last step (first parameter group)"
)
EVAL = Gauge(
    "ebbflow_trainer_eval", "The training script's evaluation metrics at the last evaluation", ["metric"]
)


def serve(port: int) -> None:
    """Expose /metrics; a port that is taken (several workers on one host) only costs the metrics."""
    if port <= 0:
        return
    try:
        start_http_server(port)
    except OSError as error:
        log.warning("metrics port %s unavailable (%s); continuing without /metrics", port, error)


@dataclass(frozen=True)
class StepShape:
    """How the last step was trained and where its time went (the policies' throughput model)."""

    world_size: int
    micro_batch: int  # samples per virtual node
    micro_batches: int  # rank 0's virtual nodes this step
    step_seconds: float
    compute_seconds: float  # rank 0's forward+backward over all its micro-batches
    noise_scale: float | None = None
    rescale_pause_seconds: float | None = None
    compression_rate: float | None = None  # spec.bandLimit only

    def values(self) -> tuple[Any, ...]:
        """The contract's fields after "eval", in order."""
        batches = max(1, self.micro_batches)
        return (
            self.world_size,
            self.micro_batch,
            batches - 1,
            self.step_seconds,
            self.compute_seconds / batches,
            max(0.0, self.step_seconds - self.compute_seconds),
            _finite_or_none(self.noise_scale),
            self.rescale_pause_seconds,
            self.compression_rate,
        )


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class ProgressReporter:
    """Rank 0's progress, written at most every ``interval`` seconds from a background thread."""

    def __init__(self, config: TrainerConfig, environ: dict[str, str] | None = None):
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        self._last = 0.0
        self._thread: threading.Thread | None = None
        self.failures = 0  # reports that failed (each logged once); training went on regardless

    @staticmethod
    def report(
        step: int,
        samples: int,
        loss: float | None,
        samples_per_second: float,
        evaluation: dict[str, Any] | None,
        shape: StepShape,
    ) -> dict[str, Any]:
        """``evaluation``: the last evaluation, ``{"step": s, "metrics": {name: finite number}}``."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        values = (step, samples, loss, samples_per_second, now, evaluation, *shape.values())
        return dict(zip(contract.PROGRESS_FIELDS, values, strict=True))

    def maybe_report(self, report: dict[str, Any], *, force: bool = False) -> None:
        """Write ``report`` in the background unless one was written within the interval; ``force``
        (the last step) writes it in any case, after the report still being written."""
        now = time.monotonic()
        if force and self._thread is not None:
            self._thread.join(timeout=5)
        busy = self._thread is not None and self._thread.is_alive()
        if busy or (not force and now - self._last < self.config.progress_interval_seconds):
            return
        self._last = now
        self._thread = threading.Thread(target=self._write, args=(report,), daemon=True)
        self._thread.start()
        if force:
            self._thread.join(timeout=5)

    def _write(self, report: dict[str, Any]) -> None:
        try:
            if self._in_cluster():
                self._patch_pod(report)
            elif (directory := self._local_directory()) is not None:
                path = directory / "progress.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                temporary = path.with_name(".progress.json.tmp")
                temporary.write_text(json.dumps(report))
                os.replace(temporary, path)
        except Exception as error:  # best effort by design: log, count and keep training
            self.failures += 1
            log.warning("progress report failed: %s", error)

    def _local_directory(self) -> Path | None:
        """Outside a cluster: the checkpoint directory, or the node's state directory when the
        checkpoints go to an object store."""
        checkpoints = self.config.checkpoint_path
        if checkpoints and not checkpoints.startswith("s3://"):
            return Path(checkpoints)
        return Path(self.config.state_dir) if checkpoints and self.config.state_dir else None

    def _in_cluster(self) -> bool:
        token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
        return bool(
            self.environ.get("KUBERNETES_SERVICE_HOST")
            and self.config.pod_name
            and self.config.namespace
            and token.is_file()
        )

    def _patch_pod(self, report: dict[str, Any]) -> None:
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        host = self.environ["KUBERNETES_SERVICE_HOST"]
        port = self.environ.get("KUBERNETES_SERVICE_PORT", "443")
        url = f"https://{host}:{port}/api/v1/namespaces/{self.config.namespace}/pods/{self.config.pod_name}"
        body = json.dumps({"metadata": {"annotations": {contract.ANNOTATION_PROGRESS: json.dumps(report)}}})
        request = urllib.request.Request(
            url,
            data=body.encode(),
            method="PATCH",
            headers={
                "Authorization": f"Bearer {(account / 'token').read_text().strip()}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            response.read()
