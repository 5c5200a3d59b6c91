"""The chart's release on the kind cluster as the e2e tests watch it: the operator's pods, which one
leads, the flags they run with, and a job's pods and progress across what a test does to the release."""

from __future__ import annotations

import json

from ebbflow_api import contract
from ebbflow_devtools.kind import E2E_NAMESPACE, OPERATOR_DEPLOYMENT, RELEASE, RELEASE_NAMESPACE, Kind, poll
from ebbflow_operator.leader import LEASE_NAME

from . import jobs

REMOVAL_DEADLINE_S = 180
OPERATOR_SELECTOR = f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE}"


def operator_ready(kind: Kind) -> bool:
    deployment = kind.json("--namespace", RELEASE_NAMESPACE, "get", "deployment", OPERATOR_DEPLOYMENT)
    wanted = deployment["spec"]["replicas"]
    return bool(wanted > 0 and deployment["status"].get("readyReplicas", 0) == wanted)


def operator_pods(kind: Kind) -> list[str]:
    """Names of the release's running operator pods."""
    found = kind.api.pods(RELEASE_NAMESPACE, OPERATOR_SELECTOR)
    return sorted(
        p["metadata"]["name"]
        for p in found
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def lease_holder(kind: Kind) -> str:
    """The leader's identity (`<pod>-<suffix>`), or "" while nobody holds the Lease."""
    lease = kind.kubectl(
        "--namespace", RELEASE_NAMESPACE, "get", "lease", LEASE_NAME, "--ignore-not-found", "-o", "json"
    )
    return str(json.loads(lease)["spec"].get("holderIdentity") or "") if lease.strip() else ""


def job_pods(kind: Kind, name: str) -> dict[str, str]:
    """Name -> UID of the job's pods (workers and rendezvous store)."""
    selector = f"{contract.LABEL_JOB_NAME}={name}"
    found = kind.api.pods(E2E_NAMESPACE, selector)
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found}


def operator_args(kind: Kind) -> list[list[str]]:
    found = kind.api.pods(RELEASE_NAMESPACE, OPERATOR_SELECTOR)
    return [p["spec"]["containers"][0]["args"] for p in found if not p["metadata"].get("deletionTimestamp")]


def rolled(kind: Kind, before: list[str], flag: str) -> list[str]:
    """Two new operator pods instead of `before`, every one with `flag`, one of them leading."""

    def replaced() -> list[str] | None:
        pods = operator_pods(kind)
        return pods if len(pods) == 2 and not set(pods) & set(before) else None

    pods = poll(replaced, REMOVAL_DEADLINE_S, "two new operator pods")
    assert all(flag in args for args in operator_args(kind)), operator_args(kind)
    poll(lambda: any(lease_holder(kind).startswith(f"{p}-") for p in pods), 120, "a new operator pod leading")
    return pods


def trains_on(kind: Kind, name: str, steps: int) -> None:
    """The job's status (written by the operator from the trainers' reports) advances `steps` steps."""

    def step() -> int:
        return int((jobs.status(kind, name).get("progress") or {}).get("step") or 0)

    start = step()
    poll(lambda: step() >= start + steps, jobs.JOB_DEADLINE_S, f"{name} {steps} steps further")
