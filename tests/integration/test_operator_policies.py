"""`ebbflow-operator --policy goodput|quality` against the real control plane: the allocation follows
what the trainers report.

The workers here are KWOK pods (no process runs), so each job's trainer is played by a thread that
writes rank 0's progress annotation as the real trainer does (the contract's fields, every second,
for the world size the job has right now), from a model of the job: its step time at K workers,
and its loss at a step. The real trainer's report is checked in the trainer tier; this tier checks
what the operator makes of reports.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from ebbflow_api import contract
from ebbflow_api.waiting import wait_for
from ebbflow_operator.devcluster.controlplane import ControlPlane
from ebbflow_operator.devcluster.gpunodes import GpuNodeTemplate

from .conftest import GpuNodes, Kube
from .operator_helpers import create_job, job_manifest, running_operator, settled, status, workers

pytestmark = pytest.mark.usefixtures("crd")

VIRTUAL_NODES, GLOBAL_BATCH = 24, 192  # 8-sample micro-batches; K workers do ceil(24 / K) each
NODES = GpuNodeTemplate(gpus=4, time_slicing_replicas=1)  # three of them: 12 exclusive GPUs
CONVERGE = 240  # seconds: a few measured sizes, each a rescale with a short leave grace


@dataclass(frozen=True)
class TrainerModel:
    """How one fake job trains: compute seconds per micro-batch, sync seconds when K > 1, loss(step)."""

    compute_s: float
    sync_s: float
    loss: Callable[[float], float]

    def step_shape(self, workers: int) -> tuple[int, float]:
        """(micro-batches of the busiest worker, step seconds) at `workers`."""
        micro_batches = math.ceil(VIRTUAL_NODES / workers)
        return micro_batches, micro_batches * self.compute_s + (self.sync_s if workers > 1 else 0.0)


def _report(model: TrainerModel, workers: int, step: float) -> dict[str, object]:
    micro_batches, step_s = model.step_shape(workers)
    return {
        "step": int(step),
        "samples": int(step) * GLOBAL_BATCH,
        "loss": model.loss(step),
        "samplesPerSecond": GLOBAL_BATCH / step_s,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "eval": None,
        "worldSize": workers,
        "microBatch": GLOBAL_BATCH // VIRTUAL_NODES,
        "accumulationSteps": micro_batches - 1,
        "stepSeconds": step_s,
        "computeSeconds": model.compute_s,
        "communicationSeconds": step_s - micro_batches * model.compute_s,
        "noiseScale": None,
        "rescalePauseSeconds": 1.0,
    }


@contextmanager
def fake_trainers(kube: Kube, namespace: str, models: dict[str, TrainerModel]) -> Iterator[None]:
    """One reporting thread for all jobs: each second, every job's step advances by what its
    current world size trains in that second, and its first running worker gets the report."""
    stop = threading.Event()
    steps = dict.fromkeys(models, 0.0)

    def report_all() -> None:
        while not stop.wait(1.0):
            for name, model in models.items():
                running = sorted(workers(kube, namespace, name), key=lambda p: p.metadata.name)
                if not running:
                    continue
                steps[name] += 1.0 / model.step_shape(len(running))[1]
                body = json.dumps(_report(model, len(running), steps[name]))
                annotations = {contract.ANNOTATION_PROGRESS: body}
                try:
                    kube.core.patch_namespaced_pod(
                        running[0].metadata.name, namespace, {"metadata": {"annotations": annotations}}
                    )
                except Exception:  # a pod deleted under us: the next second reports again
                    continue

    thread = threading.Thread(target=report_all, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _run(
    kube: Kube,
    plane: ControlPlane,
    namespace: str,
    gpu_nodes: GpuNodes,
    tmp_path: Path,
    policy: str,
    models: dict[str, TrainerModel],
) -> dict[str, int]:
    """Both jobs under `policy` until the sizes hold still for 20 s; returns them."""
    gpu_nodes.add(3, NODES)
    log = tmp_path / "operator.log"
    with running_operator(plane, namespace, gpu_nodes.selector, log, "--policy", policy) as operator:
        for name in models:
            shape = {"virtualNodes": VIRTUAL_NODES, "globalBatchSize": GLOBAL_BATCH}
            create_job(kube, namespace, job_manifest(name, 1, 12, gpu_nodes.selector, **shape))
        with fake_trainers(kube, namespace, models):
            history: list[dict[str, int]] = []

            def stable() -> dict[str, int] | None:
                sizes = {n: int(status(kube, namespace, n).get("desiredReplicas") or 0) for n in models}
                if not all(settled(kube, namespace, n, sizes[n]) for n in models):
                    history.clear()
                    return None
                history.append(sizes)
                recent = history[-20:]
                return sizes if len(recent) == 20 and all(r == sizes for r in recent) else None

            started = time.monotonic()
            try:
                sizes = wait_for(stable, CONVERGE, f"{policy}: sizes that hold still", interval=1.0)
            finally:
                print(operator.log())  # shown by pytest when the test failed
            print(f"{policy}: {sizes} held 20 s, {time.monotonic() - started:.0f} s after the jobs")
            return sizes


def _slow_loss(step: float) -> float:
    return 0.1 + 2.0 / (1.0 + step / 5000.0)


def test_goodput_gives_the_job_that_scales_better_more_gpus(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    """`scales` is compute-bound (0.5 s per micro-batch, 0.05 s sync): more workers shorten its step.
    `chatty` is sync-bound (0.01 s compute, 1 s sync): more workers barely help it, one is fastest.
    Fair share would give each 6 of the 12 GPUs; goodput moves GPUs to `scales`."""
    models = {
        "scales": TrainerModel(compute_s=0.5, sync_s=0.05, loss=_slow_loss),
        "chatty": TrainerModel(compute_s=0.01, sync_s=1.0, loss=_slow_loss),
    }
    sizes = _run(kube, control_plane, namespace, gpu_nodes, tmp_path, "goodput", models)
    assert sizes["scales"] > 6 > sizes["chatty"] >= 1, sizes
    recorded = status(kube, namespace, "scales")["progress"]
    assert recorded["worldSize"] == sizes["scales"] and recorded["stepSeconds"] > 0


def test_quality_gives_the_job_still_learning_more_gpus(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    """Same speed, different curves: `learning` halves its loss over thousands of steps, `converged`
    reached its floor within a hundred. Fair share would give each 6; quality favours `learning`."""
    models = {
        "learning": TrainerModel(compute_s=0.02, sync_s=0.01, loss=_slow_loss),
        "converged": TrainerModel(compute_s=0.02, sync_s=0.01, loss=lambda k: 0.5 + 2.0 / (1.0 + k / 10.0)),
    }
    sizes = _run(kube, control_plane, namespace, gpu_nodes, tmp_path, "quality", models)
    assert sizes["learning"] > 6 > sizes["converged"] >= 1, sizes
