"""The Grafana dashboard shown to work without Grafana: while a job trains through a rescale, every
PromQL expression of every panel returns data from a real Prometheus that scrapes the operator and
the trainers as the chart's ServiceMonitor and PodMonitor do (hack/prometheus)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from ebbflow_api.waiting import wait_for
from ebbflow_operator.devcluster.kind import E2E_NAMESPACE, REPO, Kind, poll

from . import jobs
from .jobs import JOB_DEADLINE_S

DASHBOARD = REPO / "charts" / "ebbflow" / "dashboards" / "ebbflow.json"
JOB = "watched"
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


@pytest.fixture(scope="module")
def rescaled_job(kind: Kind) -> Iterator[str]:
    """A job training on three workers that lost one (a rescale, a pause) and is still running. It goes
    whether or not it got there: left running, it held three GPUs through the next module's tests."""
    jobs.apply(kind, jobs.digits_job(JOB, 1, 3, steps=4000, vnode_seconds=0.03))
    try:
        poll(lambda: jobs.all_training_together(kind, JOB, 3), JOB_DEADLINE_S, "three workers training")
        victim = sorted(jobs.running_workers(kind, JOB))[-1]
        kind.kubectl("-n", E2E_NAMESPACE, "delete", "pod", victim, timeout=120)
        poll(lambda: jobs.all_training_together(kind, JOB, 3), JOB_DEADLINE_S, "three again after a rescale")
        yield JOB
    finally:
        kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjob", JOB, "--wait=true", timeout=300)


@pytest.mark.parametrize(("panel", "expression"), _expressions(), ids=[i for i, _ in _expressions()])
def test_every_panel_expression_returns_data(
    kind: Kind, rescaled_job: str, panel: str, expression: str
) -> None:
    query = _with_variables(expression)
    assert "$" not in query, f"panel {panel}: a variable the test does not set: {query}"
    # Scrapes every 5 s; the first query may come before the series it needs were scraped.
    result = wait_for(lambda: kind.query(query), 120, f"data for panel {panel}: {query}", interval=5)
    assert result, query
