"""The goodput policy as users install it (`helm upgrade --set operator.policy=goodput`), fed by
real trainers' reports through their pods' progress annotation.

Two jobs of 12 virtual nodes scale differently: `scales` computes 0.1 s per virtual node and its
workers barely wait on each other; `chatty` computes 0.01 s per virtual node and spends 1 s per step
in its collective as soon as it has a second worker (`--simulated-sync-seconds`, a slow interconnect).
Fair share would give each half the GPUs; goodput, once their reports show how each scales, leaves
`chatty` one worker and gives `scales` the rest it can use. `scales` also allows a larger global batch
(spec.maxGlobalBatchSize with AdaScale): the policy raises it, the operator writes it on every worker
pod, the kubelet projects it into the file the trainers read, and every worker switches at one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import CHART_VALUES, Kind, install_chart, poll

from . import jobs

VIRTUAL_NODES, SAMPLES_PER_VIRTUAL_NODE = 12, 16
BATCH = VIRTUAL_NODES * SAMPLES_PER_VIRTUAL_NODE
# Time for reports to come in, the policy to move GPUs and the resized worlds to form.
CONVERGE_S = 600
HOLD_STILL_S = 20


@pytest.fixture
def goodput(kind: Kind) -> Iterator[None]:
    """The release switched to the goodput policy by `helm upgrade`, and back to the tier's values."""
    install_chart(kind, (*CHART_VALUES, "operator.policy=goodput"))
    yield
    install_chart(kind, CHART_VALUES)


def _job(name: str, vnode_seconds: float, sync_seconds: float, **spec: Any) -> dict[str, Any]:
    job = jobs.digits_job(
        name,
        1,
        VIRTUAL_NODES,
        steps=100_000,
        vnode_seconds=vnode_seconds,
        virtual_nodes=VIRTUAL_NODES,
        samples_per_virtual_node=SAMPLES_PER_VIRTUAL_NODE,
    )
    job["spec"]["template"]["spec"]["containers"][0]["command"] += [
        "--simulated-sync-seconds",
        str(sync_seconds),
    ]
    job["spec"].update(spec)
    return job


def _sizes_holding_still(
    kind: Kind, names: tuple[str, ...], wanted: Callable[[dict[str, int]], bool]
) -> dict[str, int]:
    """The jobs' sizes once they are `wanted`, every desired worker runs, and they held for
    HOLD_STILL_S seconds."""
    since: list[tuple[dict[str, int], float]] = []

    def still() -> dict[str, int] | None:
        sizes = {n: int(jobs.status(kind, n).get("desiredReplicas") or 0) for n in names}
        if not wanted(sizes) or not all(len(jobs.running_workers(kind, n)) == sizes[n] for n in names):
            since.clear()
            return None
        if not since or since[0][0] != sizes:
            since[:] = [(sizes, time.monotonic())]
        return sizes if time.monotonic() - since[0][1] >= HOLD_STILL_S else None

    return poll(still, CONVERGE_S, "sizes that hold still")


def test_goodput_gives_gpus_by_the_reported_scaling_and_raises_the_batch_the_spec_allows(
    kind: Kind, namespace: str, operator: str, goodput: None
) -> None:
    adaptive = {"maxGlobalBatchSize": 4 * BATCH, "lrScaling": "adascale"}
    jobs.apply(kind, _job("scales", vnode_seconds=0.1, sync_seconds=0.0, **adaptive))
    jobs.apply(kind, _job("chatty", vnode_seconds=0.01, sync_seconds=1.0))

    sizes = _sizes_holding_still(kind, ("scales", "chatty"), lambda sizes: sizes["chatty"] == 1)
    assert sizes["scales"] > sizes["chatty"], sizes
    jobs.record_figures("goodput", {"sizes": sizes})

    chosen = poll(
        lambda: jobs.status(kind, "scales").get("globalBatchSize"), CONVERGE_S, "a batch chosen for scales"
    )
    assert BATCH < chosen <= 4 * BATCH and chosen % VIRTUAL_NODES == 0, chosen
    pods = jobs.worker_pods(kind, "scales")
    assert all(
        p["metadata"]["annotations"].get(contract.ANNOTATION_GLOBAL_BATCH_SIZE) == str(chosen) for p in pods
    )

    def switched() -> dict[str, list[trainer_logs.BatchSwitch]] | None:
        found = {
            p: trainer_logs.batch_switches(jobs.logs(kind, p)) for p in jobs.running_workers(kind, "scales")
        }
        return found if found and all(s and s[-1].batch == chosen for s in found.values()) else None

    switches = poll(switched, jobs.JOB_DEADLINE_S, f"every scales worker at B={chosen}")
    last = {pod: s[-1] for pod, s in switches.items()}
    assert len({s.step for s in last.values()}) == 1, f"every worker switches at one step: {last}"
    # The samples add up: V virtual nodes of the new per-node count make the chosen global batch.
    assert all(s.samples_per_virtual_node * VIRTUAL_NODES == chosen for s in last.values()), last
    assert "globalBatchSize" not in jobs.status(kind, "chatty"), "a job without maxGlobalBatchSize keeps B"
