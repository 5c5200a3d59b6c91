"""The memory budget of a job with spec.bandLimit: spec value, else the nodes' GPU feature discovery
labels over the job's scheduled workers (tables, no API)."""

from __future__ import annotations

from typing import Any

import pytest
from ebbflow_devtools.builders import JobBuilder, make_job, make_node, make_worker
from ebbflow_operator.decision.gpu_memory import job_budget_mib, worker_share_mib
from ebbflow_operator.decision.model import LABEL_GPU_MEMORY, LABEL_GPU_REPLICAS, Job, Node


def gpu_node(name: str, memory: str | None = "40960", replicas: str | None = None) -> Node:
    """A node labelled as GPU feature discovery labels it (a label left out when None)."""
    labels = {LABEL_GPU_MEMORY: memory, LABEL_GPU_REPLICAS: replicas}
    return make_node(name, labels={k: v for k, v in labels.items() if v is not None})


def band_limited(gpus: int = 1, **band: Any) -> Job:
    return make_job(JobBuilder("b").replicas(1, 8).virtual_nodes(16).gpus(gpus).band_limit(**band))


NODES = {
    "a100-40": gpu_node("a100-40"),
    "a100-40-by-2": gpu_node("a100-40-by-2", replicas="2"),
    "a100-40-by-4": gpu_node("a100-40-by-4", replicas="4"),
    "a100-40-by-3": gpu_node("a100-40-by-3", replicas="3"),
    "h100-80": gpu_node("h100-80", "81559"),
    "unlabelled": gpu_node("unlabelled", memory=None, replicas="2"),
    "replicas-unparsable": gpu_node("replicas-unparsable", replicas="two"),
    "replicas-zero": gpu_node("replicas-zero", replicas="0"),
    "memory-unparsable": gpu_node("memory-unparsable", memory="40GB"),
    "memory-zero": gpu_node("memory-zero", memory="0"),
}


@pytest.mark.parametrize(
    ("job", "placed", "expected"),
    [
        pytest.param(
            make_job(JobBuilder("b").replicas(1, 2)), ["a100-40"], None, id="no-band-limit-no-budget"
        ),
        pytest.param(band_limited(memory_budget_mib=5000), ["a100-40-by-4"], 5000, id="spec-value-wins"),
        pytest.param(band_limited(memory_budget_mib=5000), [], 5000, id="spec-value-without-workers"),
        pytest.param(band_limited(), ["a100-40"], 40960, id="exclusive-gpu"),
        pytest.param(band_limited(), ["a100-40-by-4"], 10240, id="time-sliced-4-ways"),
        pytest.param(band_limited(gpus=2), ["a100-40-by-4"], 20480, id="two-replicas-per-worker"),
        pytest.param(band_limited(), ["a100-40-by-3"], 13653, id="rounded-down"),
        pytest.param(band_limited(), ["h100-80", "a100-40-by-2", "a100-40"], 20480, id="smallest-worker"),
        pytest.param(band_limited(), ["unlabelled", "a100-40-by-4"], 10240, id="unlabelled-node-ignored"),
        pytest.param(band_limited(), ["unlabelled"], None, id="only-unlabelled-nodes"),
        pytest.param(band_limited(), [None, "h100-80"], 81559, id="unscheduled-worker-ignored"),
        pytest.param(band_limited(), [None], None, id="nothing-scheduled"),
        pytest.param(band_limited(), [], None, id="no-workers"),
        pytest.param(band_limited(), ["gone", "a100-40-by-2"], 20480, id="worker-on-unknown-node-ignored"),
        pytest.param(band_limited(), ["replicas-unparsable"], 40960, id="replicas-unparsable-is-one"),
        pytest.param(band_limited(), ["replicas-zero"], 40960, id="replicas-zero-is-one"),
        pytest.param(band_limited(), ["memory-unparsable"], None, id="memory-unparsable-ignored"),
        pytest.param(band_limited(), ["memory-zero", "h100-80"], 81559, id="memory-zero-ignored"),
    ],
)
def test_job_budget(job: Job, placed: list[str | None], expected: int | None) -> None:
    workers = [make_worker(job, i, node) for i, node in enumerate(placed)]
    assert job_budget_mib(job, workers, NODES) == expected


def test_a_worker_without_gpus_has_no_share() -> None:
    assert worker_share_mib(NODES["a100-40"], 0) is None
    job = band_limited()
    workers = [make_worker(job, 0, "a100-40", gpus=0), make_worker(job, 1, "a100-40-by-2")]
    assert job_budget_mib(job, workers, NODES) == 20480
