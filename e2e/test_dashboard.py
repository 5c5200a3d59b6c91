"""A job on three real pods loses a worker to `kubectl delete pod`: the survivors re-form from memory at
a step boundary and no step is lost, and the Grafana dashboard, shown to work without Grafana, has
data for every PromQL expression of every panel from a real Prometheus that scrapes the operator and
the trainers through the chart's ServiceMonitor and PodMonitor (the Prometheus Operator's, as users
install it: hack/prometheus-operator), across the rescale; and the panels' values are the cluster's
(desired and ready workers, world size, virtual nodes, GPUs). One job serves all: the pod deletion is
the rescale the dashboard shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import E2E_NAMESPACE, REPO, Kind, poll
from ebbflow_devtools.waiting import wait_for

from . import jobs
from .jobs import JOB_DEADLINE_S

DASHBOARD = REPO / "charts" / "ebbflow" / "dashboards" / "ebbflow.json"
JOB = "watched"
VIRTUAL_NODES = 4
# Grafana's variables as the dashboard would set them for this job; the interval spans the rescale.
VARIABLES = {"$__rate_interval": "3m", "$namespace": E2E_NAMESPACE, "$job": JOB}


def _expressions() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [
        (f"{panel['id']}-{target.get('refId', i)}", target["expr"])
        for panel in panels
        for i, target in enumerate(panel.get("targets", []))
    ]


def _with_variables(expression: str) -> str:
    for name, value in VARIABLES.items():
        expression = expression.replace(name, value)
    return expression


@dataclass(frozen=True)
class Rescale:
    """What the survivors of a deleted worker logged when they first trained again."""

    victim: str
    resumed: list[trainer_logs.Resumption]


@pytest.fixture(scope="module")
def rescaled_job(kind: Kind) -> Iterator[Rescale]:
    """A job training on three workers that lost one, not rank 0, to a pod deletion (SIGTERM, its
    grace period: a rescale, a pause) and is still running. It goes whether or not it got there: left
    running, it held three GPUs through the next module's tests."""
    jobs.apply(kind, jobs.digits_job(JOB, 1, 3, steps=4000, vnode_seconds=0.03, virtual_nodes=VIRTUAL_NODES))
    try:
        poll(lambda: jobs.all_training_together(kind, JOB, 3), JOB_DEADLINE_S, "three workers training")
        latest = {pod: jobs.resumptions(kind, pod)[-1] for pod in jobs.running_workers(kind, JOB)}
        trio = max(r.generation for r in latest.values())  # the world of three
        victim = next(pod for pod, r in latest.items() if r.rank != 0)
        survivors = [pod for pod in latest if pod != victim]
        kind.kubectl("-n", E2E_NAMESPACE, "delete", "pod", victim, timeout=120)

        def after_deletion() -> list[trainer_logs.Resumption]:
            found = [r for pod in survivors for r in jobs.resumptions(kind, pod)]
            return [r for r in found if r.generation > trio]

        poll(lambda: bool(after_deletion()), JOB_DEADLINE_S, "the survivors to train in a new world")
        first = min(r.generation for r in after_deletion())
        resumed = [r for r in after_deletion() if r.generation == first]
        poll(lambda: jobs.all_training_together(kind, JOB, 3), JOB_DEADLINE_S, "three again after a rescale")
        yield Rescale(victim, resumed)
    finally:
        kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjob", JOB, "--wait=true", timeout=300)


def test_a_deleted_worker_leaves_by_sigterm_and_no_step_is_lost(rescaled_job: Rescale) -> None:
    resumed = rescaled_job.resumed
    # The survivors' first world holds both, or one of them when the other rejoined after the last call
    # (a loaded machine: the next round adds it), or three when the replacement joined that round;
    # whichever, it resumes from memory and loses no step.
    sources = {r.source for r in resumed}
    assert sources <= {"memory", "peer"} and "memory" in sources, resumed
    lost = [r.steps_lost for r in resumed if r.rank == 0]
    assert lost == [0], f"rank 0 of the new world reports lost steps: {resumed}"


@pytest.mark.parametrize(("panel", "expression"), _expressions(), ids=[i for i, _ in _expressions()])
def test_every_panel_expression_returns_data(
    kind: Kind, rescaled_job: Rescale, panel: str, expression: str
) -> None:
    query = _with_variables(expression)
    assert "$" not in query, f"panel {panel}: a variable the test does not set: {query}"
    # Scrapes every 5 s; the first query may come before the series it needs were scraped.
    result = wait_for(lambda: kind.query(query), 120, f"data for panel {panel}: {query}", interval=5)
    assert result, query


def _panel_value(kind: Kind, panel: str, by: str = "") -> dict[str, float]:
    """A panel expression's values for the watched job, by the series' `by` label ("" for one series)."""
    expression = _with_variables(dict(_expressions())[panel])
    return {series["metric"].get(by, ""): float(series["value"][1]) for series in kind.query(expression)}


def _truth(kind: Kind) -> dict[str, object]:
    """What the cluster says, read from the API: the job's status, its pods, the nodes' GPUs."""
    status = jobs.status(kind, JOB)
    pods = jobs.worker_pods(kind, JOB)
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    gpus = sum(
        int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in kind.json("get", "nodes")["items"]
    )
    return {
        "desired workers": float(status["desiredReplicas"]),
        "ready workers": float(len(ready)),
        "world size": float(len(jobs.running_workers(kind, JOB))),
        "virtual nodes": float(VIRTUAL_NODES),
        "cluster GPUs": float(gpus),
    }


def _shown(kind: Kind) -> dict[str, object]:
    """What the dashboard's panels show for the same things, from Prometheus."""
    return {
        "desired workers": _panel_value(kind, "2-A").get(""),
        "ready workers": _panel_value(kind, "2-C").get(""),
        "world size": _panel_value(kind, "11-A").get(""),
        "virtual nodes": sum(_panel_value(kind, "12-A", by="pod").values()),
        "cluster GPUs": _panel_value(kind, "4-A", by="state").get("total"),
    }


def test_the_panels_show_what_the_cluster_says(kind: Kind, rescaled_job: Rescale) -> None:
    """The desired and ready workers equal the job's status and pods, the world size the running
    workers, the virtual nodes per worker add up to the job's V, the GPUs the nodes' allocatable:
    values, not only data. Scrapes every 5 s, so the two sides agree within a few scrapes."""
    seen: list[tuple[dict[str, object], dict[str, object]]] = []

    def agree() -> bool:
        truth, shown = _truth(kind), _shown(kind)
        seen.append((truth, shown))
        return truth == shown

    try:
        wait_for(agree, 60, "the panels to show the cluster's values", interval=5)
    except TimeoutError:
        truth, shown = seen[-1]
        pytest.fail(f"the dashboard shows {shown}, the cluster says {truth}")
