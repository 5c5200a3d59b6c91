"""Two operator replicas with leader election against the real API server: exactly one acts; when
the leader is SIGKILLed in the middle of a scale-up, the standby takes the Lease once it expires and
finishes the rescale, with no duplicate and no orphaned worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from ebbflow_api import contract
from ebbflow_devtools.controlplane import ControlPlane
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.leader import LEASE_NAME
from kubernetes import client

from .conftest import GpuNodes, Kube
from .operator_helpers import (
    SETTLE,
    OperatorProcess,
    create_job,
    get_job,
    job_manifest,
    running_operator,
    workers,
)

pytestmark = pytest.mark.usefixtures("crd")

LEASE_DURATION = 6.0  # short for the test; the chart's default is 15 s
ELECTION = ("--lease-duration", str(LEASE_DURATION), "--renew-deadline", "4", "--retry-period", "1")


@pytest.fixture
def replicas(
    control_plane: ControlPlane, namespace: str, gpu_nodes: GpuNodes, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    with ExitStack() as stack:
        processes = [
            stack.enter_context(
                running_operator(
                    control_plane,
                    namespace,
                    gpu_nodes.selector,
                    tmp_path / f"operator-{name}.log",
                    "--leader-elect=true",
                    "--leader-election-namespace",
                    namespace,
                    *ELECTION,
                )
            )
            for name in ("a", "b")
        ]
        yield processes
        for process in processes:
            print(process.log())  # shown by pytest when the test failed


def leading(process: OperatorProcess) -> bool:
    if process.process is None or process.process.poll() is not None:
        return False
    try:
        return "ebbflow_operator_leader 1.0" in process.metrics()
    except OSError:
        return False


def the_leader(replicas: list[OperatorProcess]) -> OperatorProcess | None:
    found = [p for p in replicas if leading(p)]
    assert len(found) <= 1, "two replicas lead at once"
    return found[0] if found else None


def worker_indices(kube: Kube, namespace: str, job: str) -> list[int]:
    uid = get_job(kube, namespace, job)["metadata"]["uid"]
    pods = workers(kube, namespace, job, None)
    assert all([o.uid for o in p.metadata.owner_references] == [uid] for p in pods), (
        "a worker without its job"
    )
    return sorted(int(p.metadata.labels[contract.LABEL_WORKER_INDEX]) for p in pods)


def test_the_standby_takes_over_a_killed_leaders_scale_up(
    kube: Kube, namespace: str, gpu_nodes: GpuNodes, replicas: list[OperatorProcess]
) -> None:
    gpu_nodes.add(1)  # 4 GPUs
    leader = wait_for(lambda: the_leader(replicas), SETTLE, "one replica leading")
    [standby] = [p for p in replicas if p is not leader]
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(LEASE_NAME, namespace)
    assert lease.spec.holder_identity and lease.spec.lease_transitions in (0, None)

    create_job(kube, namespace, job_manifest("ha", 1, 8, gpu_nodes.selector))
    wait_for(lambda: worker_indices(kube, namespace, "ha") == [0, 1, 2, 3], SETTLE, "4 workers")
    assert not leading(standby)

    gpu_nodes.add(1)  # 4 more GPUs: the leader starts growing the job to 8 ...
    wait_for(lambda: len(worker_indices(kube, namespace, "ha")) > 4 or None, SETTLE, "the scale-up under way")
    leader.kill()  # ... and dies in the middle of it
    killed = time.monotonic()

    most = 0

    def grown() -> bool:
        nonlocal most
        indices = worker_indices(kube, namespace, "ha")
        most = max(most, len(indices))
        assert len(set(indices)) == len(indices), f"duplicate worker index: {indices}"
        return indices == list(range(8)) and len(workers(kube, namespace, "ha")) == 8

    wait_for(lambda: leading(standby), LEASE_DURATION + SETTLE, "the standby leading")
    took_over = time.monotonic() - killed
    wait_for(grown, SETTLE, "the job grown to 8 by the new leader")
    grown_after = time.monotonic() - killed
    assert most == 8, f"{most} workers at once: more than the job's 8"
    assert took_over < LEASE_DURATION + 10, f"took over after {took_over:.1f} s"
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(LEASE_NAME, namespace)
    assert lease.spec.lease_transitions == 1
    print(f"after the leader's SIGKILL: new leader in {took_over:.1f} s, 8 workers in {grown_after:.1f} s")
