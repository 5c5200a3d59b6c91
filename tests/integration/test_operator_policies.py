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
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_api.models import GPU_RESOURCE
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.gpunodes import GpuNodeTemplate
from ebbflow_devtools.waiting import wait_for

from .conftest import GpuNodes, Kube
from .operator_helpers import create_job, events, job_manifest, running_operator, settled, status, workers

pytestmark = pytest.mark.usefixtures("crd")

VIRTUAL_NODES, GLOBAL_BATCH = 24, 192  # 8-sample micro-batches; K workers do ceil(24 / K) each
NODES = GpuNodeTemplate(gpus=4, time_slicing_replicas=1)  # three of them: 12 exclusive GPUs
CONVERGE = 240  # seconds: a few measured sizes, each a rescale with a short leave grace


@dataclass(frozen=True)
class TrainerModel:
    """How one fake job trains: compute seconds per micro-batch (plus per sample beyond the spec's
    micro-batch), sync seconds when K > 1, loss(step), and the gradient noise scale it reports."""

    compute_s: float
    sync_s: float
    loss: Callable[[float], float]
    per_sample_s: float = 0.0
    noise_scale: float | None = None
    cross_node_sync_s: float | None = None  # sync when the workers span nodes (default: sync_s)

    def micro_batch_s(self, batch: int) -> float:
        return self.compute_s + self.per_sample_s * (batch - GLOBAL_BATCH) / VIRTUAL_NODES

    def step_shape(self, workers: int, batch: int = GLOBAL_BATCH, nodes: int = 1) -> tuple[int, float]:
        """(micro-batches of the busiest worker, step seconds) at `workers` on `nodes` nodes and
        global batch `batch`."""
        micro_batches = math.ceil(VIRTUAL_NODES / workers)
        sync = self.cross_node_sync_s if nodes > 1 and self.cross_node_sync_s is not None else self.sync_s
        return micro_batches, micro_batches * self.micro_batch_s(batch) + (sync if workers > 1 else 0.0)


def _report(model: TrainerModel, workers: int, step: float, batch: int, nodes: int) -> dict[str, object]:
    micro_batches, step_s = model.step_shape(workers, batch, nodes)
    return {
        "step": int(step),
        "samples": int(step) * batch,
        "loss": model.loss(step),
        "samplesPerSecond": batch / step_s,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "eval": None,
        "worldSize": workers,
        "microBatch": batch // VIRTUAL_NODES,
        "accumulationSteps": micro_batches - 1,
        "stepSeconds": step_s,
        "computeSeconds": model.micro_batch_s(batch),
        "communicationSeconds": step_s - micro_batches * model.micro_batch_s(batch),
        "noiseScale": model.noise_scale,
        "rescalePauseSeconds": 1.0,
    }


def _batch_of(pod: Any) -> int:
    """The global batch the operator gave a worker (its annotation), as the real trainer reads it."""
    return int((pod.metadata.annotations or {}).get(contract.ANNOTATION_GLOBAL_BATCH_SIZE) or GLOBAL_BATCH)


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
                batch, nodes = _batch_of(running[0]), len({p.spec.node_name for p in running})
                steps[name] += 1.0 / model.step_shape(len(running), batch, nodes)[1]
                body = json.dumps(_report(model, len(running), steps[name], batch, nodes))
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
    shapes: dict[str, dict[str, Any]] | None = None,
) -> dict[str, int]:
    """Both jobs under `policy` until the sizes hold still for 20 s; returns them."""
    gpu_nodes.add(3, NODES)
    log = tmp_path / "operator.log"
    with running_operator(plane, namespace, gpu_nodes.selector, log, "--policy", policy) as operator:
        for name in models:
            shape = {
                "virtualNodes": VIRTUAL_NODES,
                "globalBatchSize": GLOBAL_BATCH,
                **(shapes or {}).get(name, {}),
            }
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


def test_goodput_raises_the_batch_of_a_job_that_allows_it(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    """Two sync-bound jobs (1 s sync per step, cheap samples) whose gradients are noisy (noise scale
    50,000 samples: a 4x larger batch keeps ~99 % statistical efficiency). `adaptive` lets the policy
    raise B up to 4x (spec.maxGlobalBatchSize, adascale): a larger batch trains more samples per sync,
    so goodput raises it, writes it to status and to every worker's annotation (which the fake
    trainer reads back, as the real one does through its file). `fixed` keeps its B untouched."""
    model = TrainerModel(
        compute_s=0.01, sync_s=1.0, loss=_slow_loss, per_sample_s=0.0005, noise_scale=50_000.0
    )
    adaptive = {"maxGlobalBatchSize": 4 * GLOBAL_BATCH, "lrScaling": "adascale"}
    _run(
        kube,
        control_plane,
        namespace,
        gpu_nodes,
        tmp_path,
        "goodput",
        {"adaptive": model, "fixed": model},
        shapes={"adaptive": adaptive},
    )
    chosen = status(kube, namespace, "adaptive").get("globalBatchSize")
    assert chosen is not None and GLOBAL_BATCH < chosen <= 4 * GLOBAL_BATCH and chosen % VIRTUAL_NODES == 0
    wait_for(
        lambda: all(_batch_of(p) == chosen for p in workers(kube, namespace, "adaptive")) or None,
        30,
        "every adaptive worker annotated with the chosen batch",
    )
    assert "globalBatchSize" not in status(kube, namespace, "fixed")
    assert all(
        contract.ANNOTATION_GLOBAL_BATCH_SIZE not in (p.metadata.annotations or {})
        for p in workers(kube, namespace, "fixed")
    )


def _placeholder(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod holding `gpus` GPUs of `node` (bound there directly, as another tenant's pod would be)."""
    container = {
        "name": "hold",
        "image": "ebbflow/trainer:test",
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }
    spec = {"nodeName": node, "restartPolicy": "Never", "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_goodput_moves_a_spread_job_onto_one_node_when_room_frees(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    """Other tenants hold 2 of each node's 4 GPUs, so the scheduler must spread `spread` (4 workers,
    min = max) over two or three nodes, where its step pays a 1 s cross-node sync instead of 0.05 s.
    Once the tenants leave, goodput moves the workers off all but one node onto it (same size, new
    pods pinned to that node), and the real scheduler puts them there."""
    nodes = gpu_nodes.add(3, NODES)
    for i, node in enumerate(nodes):
        kube.core.create_namespaced_pod(namespace, _placeholder(f"tenant-{i}", node, 2))
    model = TrainerModel(compute_s=0.05, sync_s=0.05, cross_node_sync_s=1.0, loss=_slow_loss)
    manifest = job_manifest(
        "spread", 4, 4, gpu_nodes.selector, virtualNodes=VIRTUAL_NODES, globalBatchSize=GLOBAL_BATCH
    )
    log = tmp_path / "operator.log"
    with running_operator(
        control_plane, namespace, gpu_nodes.selector, log, "--policy", "goodput"
    ) as operator:
        create_job(kube, namespace, manifest)
        with fake_trainers(kube, namespace, {"spread": model}):
            try:
                wait_for(lambda: settled(kube, namespace, "spread", 4), 60, "spread: 4 workers running")
                before = {p.spec.node_name for p in workers(kube, namespace, "spread")}
                assert len(before) > 1, before
                wait_for(lambda: status(kube, namespace, "spread").get("progress"), 30, "a first report")
                for i in range(len(nodes)):
                    kube.core.delete_namespaced_pod(f"tenant-{i}", namespace, grace_period_seconds=0)

                def on_one_node() -> set[str] | None:
                    where = {p.spec.node_name for p in workers(kube, namespace, "spread")}
                    return where if len(where) == 1 and settled(kube, namespace, "spread", 4) else None

                [after] = wait_for(on_one_node, 90, "spread: every worker on one node")
            finally:
                print(operator.log())
    assert after in before  # onto one of its own nodes: fewest workers moved
    moved = events(kube, namespace, "spread", "MovedOntoOneNode")
    assert len(moved) == 1 and after in moved[0].message, [e.message for e in moved]
    assert status(kube, namespace, "spread")["desiredReplicas"] == 4
