"""NetworkPolicy enforced: on the kind cluster kube-router's firewall, beside flannel
(hack/kube-router), enforces the NetworkPolicy the operator creates with each job. Only the job's own
pods reach its rendezvous store; another pod of the same namespace is turned away there, yet reaches
the trainers' metrics port, which the policy leaves open for Prometheus. (flannel alone enforces no
NetworkPolicy.)

A probe tells a filter's answer from a listener's: a connection is `dropped` (no answer within its
timeout: a filter that drops), `rejected` (an ICMP error: a filter that rejects, as kube-router
does) or `refused` (a TCP reset: the packet reached the pod, where nothing listens). With the
stranger's own network shown to work, dropped or rejected is the policy's doing."""

from __future__ import annotations

import yaml
from ebbflow_api import contract
from ebbflow_devtools.kind import (
    E2E_NAMESPACE,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    TRAINER_IMAGE,
    Kind,
    KindError,
    poll,
)
from ebbflow_operator.decision.manifests import network_policy_name, rendezvous_host

from . import jobs

PROBE_TIMEOUT_S = 3
# What a filter answers with: nothing, or an ICMP error.
TURNED_AWAY = {"dropped", "rejected"}
# Prints how a TCP connection to argv[1]:argv[2] ends: connected, refused, rejected or dropped. A
# refused connect is a reset unless an ICMP error waits on the socket's error queue (IP_RECVERR, 11:
# Python names no constant for it).
PROBE = f"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.IPPROTO_IP, 11, 1)
s.settimeout({PROBE_TIMEOUT_S})
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except ConnectionRefusedError:
    s.setblocking(False)
    try:
        s.recvmsg(512, 512, socket.MSG_ERRQUEUE)
        print("rejected")
    except OSError:
        print("refused")
except (TimeoutError, socket.timeout):
    print("dropped")
"""


def probe(kind: Kind, pod: str, host: str, port: int) -> str:
    """From inside `pod`: how a connection to host:port ends."""
    return kind.kubectl(
        "-n", E2E_NAMESPACE, "exec", pod, "--", "python3", "-c", PROBE, host, str(port)
    ).strip()


def stranger_pod(name: str) -> dict[str, object]:
    """A pod of the job's namespace that is not the job's (no job label), with Python for the probe."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": E2E_NAMESPACE, "labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": TRAINER_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "900"],
                    "securityContext": RESTRICTED_CONTAINER_CONTEXT,
                }
            ],
            # The namespace enforces the `restricted` Pod Security Standard.
            "securityContext": RESTRICTED_POD_CONTEXT,
            "terminationGracePeriodSeconds": 0,
        },
    }


def test_only_the_jobs_pods_reach_its_rendezvous_store(kind: Kind, namespace: str, operator: str) -> None:
    jobs.apply(kind, jobs.digits_job("fenced", 2, 2, steps=3000, vnode_seconds=0.05))
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(stranger_pod("stranger")))
    jobs.wait_phase(kind, "fenced", "Running")
    # Training together: each worker's process (and so its metrics port) is up, and the job's own
    # traffic (store, collectives) got through the policy.
    training = "two workers training"
    poll(lambda: jobs.all_training_together(kind, "fenced", 2), jobs.JOB_DEADLINE_S, training)
    kind.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", "pod/stranger", "--timeout=300s", timeout=320
    )
    assert kind.json("-n", namespace, "get", "networkpolicy", network_policy_name("fenced"))

    store = rendezvous_host("fenced", namespace)
    worker = jobs.running_workers(kind, "fenced")[0]
    worker_ip = kind.json("-n", namespace, "get", "pod", worker)["status"]["podIP"]

    def reaches(pod: str, host: str, port: int) -> bool:
        try:
            return probe(kind, pod, host, port) == "connected"
        except KindError:  # the pod's container is restarting: ask again
            return False

    # The job's own pods reach the store; the stranger reaches a worker's metrics port, so its network
    # works and the policy's open port is honoured.
    poll(lambda: reaches(worker, store, contract.RENDEZVOUS_PORT), 60, "a worker reaching its store")
    poll(lambda: reaches("stranger", worker_ip, contract.METRICS_PORT), 60, "the stranger reaching metrics")
    # The same stranger is turned away at the store, and at a worker's port where nothing listens
    # (without a filter the worker's kernel would answer with a reset: "refused").
    assert probe(kind, "stranger", store, contract.RENDEZVOUS_PORT) in TURNED_AWAY
    assert probe(kind, "stranger", worker_ip, contract.RENDEZVOUS_PORT) in TURNED_AWAY
