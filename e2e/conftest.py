"""End-to-end tier: real images, kubelets, containers, signals and pod network on the kind cluster
built on this machine (hack/kind), with the fake GPU device plugin advertising time-sliced
`nvidia.com/gpu`. The operator runs in the cluster, installed by `helm install` from charts/ebbflow.

Session setup (minutes cold, about five warm): the cluster (`hack/kind/up.sh`) with kube-router's
firewall beside flannel so that NetworkPolicy is enforced (`hack/kube-router`), the images
(`hack/images/build-images.sh`; the trainer's CPU variant is loaded into the workers), the device
plugin, Kueue (`hack/kueue`), SeaweedFS as the object store (`hack/seaweedfs`) and the operator's
chart with its Kueue integration on. When any of it
fails, tests skip on a developer machine but fail under CI=true.
In CI the set-up ran before the tier (hack/ci-prepare-e2e.sh) and is not checked again.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ebbflow_devtools.kind import (
    E2E_CHART_VALUES,
    E2E_NAMESPACE,
    OPERATOR_DEPLOYMENT,
    RELEASE,
    RELEASE_NAMESPACE,
    SETUP_TIMEOUT_S,
    Kind,
    KindError,
    install_chart,
    poll,
    record_timing,
    run,
    set_up_e2e,
)

from . import jobs, release
from .diagnostics import cluster_state


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
            # The first test also pays for the session's setup (images, cluster).
            item.add_marker(pytest.mark.timeout(SETUP_TIMEOUT_S))


# Errors whose cluster state a report carries already: a module fixture's failure is raised again,
# the same object, in the set-up of each of its tests (26 for the dashboard's).
_REPORTED_ERRORS: list[BaseException] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed e2e test's report, or a failed fixture's (once), carries the cluster's state at that
    moment (e2e/diagnostics.py)."""
    report = yield
    cluster = getattr(item, "funcargs", {}).get("kind")
    if report.when not in ("setup", "call") or not report.failed or not isinstance(cluster, Kind):
        return report
    error = call.excinfo.value if call.excinfo is not None else None
    if error is not None and any(error is seen for seen in _REPORTED_ERRORS):
        return report
    if error is not None:
        _REPORTED_ERRORS.append(error)
    report.sections.append(("cluster state at the failure", cluster_state(cluster)))
    return report


# Set by hack/ci-test.sh once hack/ci-prepare-e2e.sh has set this commit's cluster up (the same
# `set_up` call): checking every step again took 106 s on a loaded CI machine (stop 35), on the
# critical path of the run.
PREPARED_ENV = "EBBFLOW_E2E_PREPARED"


@pytest.fixture(scope="session")
def kind() -> Kind:
    cluster = Kind()
    if os.environ.get(PREPARED_ENV) == "1":
        cluster.kubectl("get", "nodes")  # still the cluster it set up: reachable, or the tier fails here
        return cluster
    try:
        set_up_e2e(cluster, record_timing)
    except (KindError, TimeoutError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"e2e tier cannot run in CI: {error}", pytrace=False)
        pytest.skip(f"kind cluster unavailable: {error}")
    return cluster


@pytest.fixture(autouse=True)
def every_worker_node(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that takes a node away and fails before giving it back leaves the next test every
    worker node all the same: its failure stays its own."""
    yield
    if "kind" in request.fixturenames:
        cluster = request.getfixturevalue("kind")
        if isinstance(cluster, Kind):
            cluster.give_back_taken_nodes()


@pytest.fixture
def namespace(kind: Kind) -> Iterator[str]:
    """The e2e namespace (the chart gives its workers the trainers' ServiceAccount). A test's jobs
    go after it, with their pods, so that the next test finds every GPU free. The test is over: its
    workers get one second to stop (a graceful leave hands a state over to nobody)."""
    yield E2E_NAMESPACE
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjobs", "--all", timeout=300)
    kind.kubectl(
        "-n", E2E_NAMESPACE, "delete", "pods", "--all", "--grace-period=1", "--wait=true", timeout=300
    )


@pytest.fixture
def operator(kind: Kind) -> Iterator[str]:
    """The operator the chart installed, running in the cluster under the chart's ServiceAccount. Its
    log during the test must hold no refusal: the chart's RBAC is all it needs."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    yield OPERATOR_DEPLOYMENT
    log = jobs.operator_log(kind, since)
    refused = [line for line in log.splitlines() if "forbidden" in line.lower()]
    assert not refused, "the operator was refused by RBAC:\n" + "\n".join(refused[:10])


def _release_values() -> str | None:
    """The release's values as `helm get values` prints them; None when it is not installed."""
    try:
        return run("helm", "get", "values", RELEASE, "--namespace", RELEASE_NAMESPACE, "--output", "json")
    except KindError:
        return None


@pytest.fixture
def reinstalled(kind: Kind) -> Iterator[None]:
    """Whatever the test did to the release, the next test finds it installed and Ready: installed
    again unless it is still there with the values it had and Ready (a `helm rollback` to them)."""
    values = _release_values()
    yield
    if values is not None and _release_values() == values and release.operator_ready(kind):
        return
    install_chart(kind, E2E_CHART_VALUES)
    poll(
        lambda: release.operator_ready(kind), release.REMOVAL_DEADLINE_S, "the operator Ready after reinstall"
    )
