"""The operator and the trainer together on real pods: workers time-slicing one physical device train
side by side and the job ends Succeeded, its rendezvous pod removed (jobs across the kind workers
train to the end in test_scenarios.py; a deleted worker's SIGTERM leave is in test_dashboard.py)."""

from __future__ import annotations

from ebbflow_devtools.kind import E2E_NAMESPACE, WORKERS, Kind, poll

from . import jobs
from .jobs import JOB_DEADLINE_S


def _visible_devices(kind: Kind, pod: str) -> str:
    command = ("-n", E2E_NAMESPACE, "exec", pod, "--", "printenv", "NVIDIA_VISIBLE_DEVICES")
    return kind.kubectl(*command).strip()


def test_workers_sharing_one_physical_device_both_train(kind: Kind, namespace: str, operator: str) -> None:
    # Three one-GPU workers on one node that has 2 physical devices x 2 replicas: two of them
    # must get replicas of the same physical device (NVIDIA's plugin sets its UUID, once).
    jobs.apply(kind, jobs.digits_job("shared", 3, 3, steps=400, vnode_seconds=0.02, node=WORKERS[0]))
    poll(lambda: jobs.all_training_together(kind, "shared", 3), JOB_DEADLINE_S, "three on one node")
    devices = {pod: _visible_devices(kind, pod) for pod in jobs.running_workers(kind, "shared")}
    assert all(devices.values()) and all("," not in d for d in devices.values()), devices
    shared = [d for d in set(devices.values()) if list(devices.values()).count(d) >= 2]
    assert shared, f"no two workers share a physical device: {devices}"
    jobs.wait_phase(kind, "shared", "Succeeded")
    # The job may succeed before the kubelet reports its workers' phase (their containers exit 0 first).
    pods = poll(
        lambda: (
            (found := jobs.worker_pods(kind, "shared"))
            and all(p["status"]["phase"] == "Succeeded" for p in found)
            and found
        ),
        60,
        "every worker pod Succeeded",
    )
    assert {p["spec"]["nodeName"] for p in pods} == {WORKERS[0]}
    assert jobs.exit_codes(pods) == [0, 0, 0], jobs.describe(kind)
    worlds = [r.world_size for p in pods for r in jobs.resumptions(kind, p["metadata"]["name"])]
    assert worlds and max(worlds) == 3, "the workers never trained in one world of three"
    # cleanPodPolicy Running: the finished job's rendezvous pod is gone, its workers stay for their logs.
    assert not kind.json("-n", namespace, "get", "pods", "-l", "ebbflow.dev/role=rendezvous")["items"]
