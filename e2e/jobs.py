"""Jobs on the kind cluster for the e2e tests: the digits example (ebbflow_devtools.kind_jobs), and
kubectl reads of the job, its pods and their logs, in the e2e namespace."""

from __future__ import annotations

import json
from typing import Any

import yaml
from ebbflow_api.contract import API_GROUP, API_VERSION, LABEL_JOB_NAME
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import E2E_NAMESPACE, RELEASE, RELEASE_NAMESPACE, REPO, Kind, KindError, poll
from ebbflow_devtools.kind_jobs import CNN_SCRIPT as CNN_SCRIPT  # re-exported for the tests
from ebbflow_devtools.kind_jobs import digits_job as digits_job
from ebbflow_devtools.kind_jobs import shared_claim as shared_claim

JOB_DEADLINE_S = 420
# Each scenario's figures, for the issue notes and docs.
FIGURES = REPO / ".cluster" / "e2e"


def record_figures(scenario: str, figures: dict[str, Any]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{scenario}.json").write_text(json.dumps(figures, indent=2) + "\n")


def apply(kind: Kind, job: dict[str, Any]) -> None:
    kind.kubectl("-n", E2E_NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(job))


def status(kind: Kind, name: str) -> dict[str, Any]:
    job = kind.api.custom_object(f"{API_GROUP}/{API_VERSION}", E2E_NAMESPACE, "elastictrainingjobs", name)
    return dict(job.get("status") or {})


def remove(kind: Kind, *names: str) -> None:
    """Delete the jobs, then give their pods one second to stop, as the namespace fixture does at a
    test's end (a graceful leave would hand a state over to nobody)."""
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjobs", *names, timeout=300)
    selector = f"{LABEL_JOB_NAME} in ({','.join(names)})"
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "pods", "-l", selector, "--grace-period=1", "--wait=false")


def describe(kind: Kind) -> str:
    return kind.kubectl("-n", E2E_NAMESPACE, "get", "pods,elastictrainingjob", "-o", "wide")


def wait_phase(kind: Kind, name: str, phase: str, timeout: float = JOB_DEADLINE_S) -> dict[str, Any]:
    """The job's status once it reaches `phase`; fails at once when it fails instead."""

    def reached() -> dict[str, Any] | None:
        current = status(kind, name)
        assert current.get("phase") != "Failed" or phase == "Failed", f"job failed: {describe(kind)}"
        return current if current.get("phase") == phase else None

    return poll(reached, timeout, f"job {name} {phase}")


def worker_pods(kind: Kind, name: str) -> list[dict[str, Any]]:
    pods = kind.api.pods(E2E_NAMESPACE, f"ebbflow.dev/job-name={name}")
    return [p for p in pods if p["metadata"]["name"].startswith(f"{name}-worker-")]


def running_workers(kind: Kind, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in worker_pods(kind, name) if p["status"]["phase"] == "Running"]


def logs(kind: Kind, pod: str) -> str:
    try:
        return kind.api.log(E2E_NAMESPACE, pod)
    except KindError:
        return ""  # not started yet, or gone


def operator_log(kind: Kind, since: str) -> str:
    """Every operator replica's log (the leader and the standby) since `since` (RFC 3339), whole: a
    selector alone shows 10 lines. A pod the selector listed may be gone before its log is read (a
    reinstall replacing the operator's pods): read again."""
    selector = f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE}"
    read = ("-n", RELEASE_NAMESPACE, "logs", "-l", selector, "--tail=-1", "--prefix", f"--since-time={since}")
    (log,) = poll(lambda: (kind.kubectl(*read),), 120, "the operator's logs")  # a one-tuple: "" answers too
    return log


def resumptions(kind: Kind, pod: str) -> list[trainer_logs.Resumption]:
    return trainer_logs.resumptions(logs(kind, pod))


def exit_codes(pods: list[dict[str, Any]]) -> list[int]:
    return [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in pods]


def all_training_together(kind: Kind, name: str, size: int) -> bool:
    """`size` workers running, each of which last joined a world of `size`."""
    running = running_workers(kind, name)
    latest = [resumptions(kind, pod) for pod in running]
    return len(running) == size and all(r and r[-1].world_size == size for r in latest)
