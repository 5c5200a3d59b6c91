"""An API server outage: the kube-apiserver stops for 20 s and comes back (as in a control-plane
upgrade). The operator, a real process, must stay up, reconnect its watches and converge; the jobs
keep every pod: an operator that briefly sees nothing must not delete anything."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.waiting import wait_for

from .conftest import GpuNodes, Kube
from .operator_helpers import (
    SETTLE,
    OperatorProcess,
    conditions_current,
    create_job,
    job_manifest,
    patch_job,
    pod_uids,
    running_operator,
    settled,
    status,
    workers,
)

pytestmark = pytest.mark.usefixtures("crd")

OUTAGE = 20.0  # seconds without an API server
# Longer than the test: the operator's own periodic full list cannot hide a watch that never came
# back; what happens after the outage reaches it through its (reconnected) watches, or not at all.
RELIST = "600"
MORE = {"spec": {"replicas": {"max": 8}}}  # alpha may grow to 8; with 8 GPUs it stays at 4


def converged(kube: Kube, namespace: str, sizes: dict[str, int]) -> bool:
    """Every job runs with its expected number of workers, with status written for its current spec."""
    return all(
        settled(kube, namespace, job, count) and conditions_current(kube, namespace, job)
        for job, count in sizes.items()
    )


def assert_alive(operator: OperatorProcess) -> None:
    assert operator.process is not None
    assert operator.process.poll() is None, f"operator exited ({operator.process.returncode})"


def test_operator_survives_api_server_outage_and_keeps_every_pod(
    kube: Kube, control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> None:
    gpu_nodes.add(2)  # 2 x 4 time-sliced GPUs: 4 workers for each job
    log = tmp_path / "operator.log"
    with running_operator(
        control_plane, namespace, gpu_nodes.selector, log, "--relist-interval", RELIST
    ) as operator:
        try:
            for job in ("alpha", "beta"):
                create_job(kube, namespace, job_manifest(job, 2, 6, gpu_nodes.selector))
            wait_for(lambda: converged(kube, namespace, {"alpha": 4, "beta": 4}), SETTLE, "4 + 4 workers")
            before = pod_uids(kube, namespace)
            assert len(before) == 10, before  # 8 workers, 2 rendezvous pods

            # The controllers wait: the operator alone must notice the API is back.
            with control_plane.apiserver_down(await_controllers=False):
                time.sleep(OUTAGE)  # the outage itself: nothing to poll, nothing answers
                assert_alive(operator)
            back = time.monotonic()
            try:
                # A spec change after the outage gets its status: the job watch is back.
                wait_for(lambda: patch_job(kube, namespace, "alpha", MORE) or True, 30, "patch accepted")
                wait_for(lambda: converged(kube, namespace, {"alpha": 4, "beta": 4}), SETTLE, "converged")
                reconnected = time.monotonic() - back
                assert pod_uids(kube, namespace) == before, "a pod was deleted or replaced by the outage"
            finally:
                control_plane.await_controllers()  # whatever happened: usable for the next tests

            # New capacity is used: the node and pod watches are back too.
            gpu_nodes.add(2, group="after")
            added = time.monotonic()
            wait_for(lambda: converged(kube, namespace, {"alpha": 8, "beta": 6}), SETTLE, "grown to 8 + 6")
            grown = time.monotonic() - added
            after = pod_uids(kube, namespace)
            assert before.items() <= after.items(), "growing must not replace any pod"
            assert len(after) == 16
            assert_alive(operator)
            code, body = operator.health()
            assert code == 200, (code, body)
            print(f"API server ready -> operator converged on a new spec in {reconnected:.1f} s")
            print(f"nodes added after the outage -> jobs grown in {grown:.1f} s")
        finally:
            print(operator.log())
            for job in ("alpha", "beta"):  # what the job and its pods looked like at the end
                print(
                    job,
                    status(kube, namespace, job),
                    [(p.metadata.name, p.status.phase) for p in workers(kube, namespace, job, None)],
                )
