"""The chart's release on the kind cluster: what `helm install` created is there and the operator is
Ready, two replicas of which one holds the leader's Lease; `helm uninstall` removes every object of
the release except the CRD (kept, with the jobs in it, as `helm.sh/resource-policy: keep` promises);
installing again brings the operator back and it takes up the job left behind; the leader's node lost,
the standby takes over. (`helm upgrade` and `helm rollback` while jobs train: e2e/test_policies.py.)

The session's setup installed the release on a fresh cluster; these tests reinstall it however they
end, so that the tests after them find the operator running as set up."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from ebbflow_api import contract
from ebbflow_devtools.kind import (
    E2E_CHART_VALUES,
    RELEASE,
    RELEASE_NAMESPACE,
    Kind,
    KindError,
    install_chart,
    poll,
    run,
)
from ebbflow_operator.leader import LEASE_NAME

from . import jobs, release

CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"


def release_objects(kind: Kind) -> list[dict[str, Any]]:
    """Kind, name and namespace of every object in the release's manifest."""
    manifest = run("helm", "get", "manifest", RELEASE, "--namespace", RELEASE_NAMESPACE, timeout=60)
    return [
        {
            "kind": doc["kind"],
            "name": doc["metadata"]["name"],
            "namespace": doc["metadata"].get("namespace"),
        }
        for doc in yaml.safe_load_all(manifest)
        if doc
    ]


def exists(kind: Kind, obj: dict[str, Any]) -> bool:
    args = ["get", obj["kind"], obj["name"], "--ignore-not-found", "-o", "name"]
    if obj["namespace"]:
        args += ["--namespace", obj["namespace"]]
    return bool(kind.kubectl(*args).strip())


def test_helm_uninstall_removes_the_release_but_keeps_the_crd_and_the_jobs(
    kind: Kind, namespace: str, reinstalled: None
) -> None:
    objects = release_objects(kind)
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "ServiceAccount", "Deployment", "Service"} <= kinds, kinds
    assert {"ClusterRole", "ClusterRoleBinding", "PodDisruptionBudget"} <= kinds, kinds
    assert all(exists(kind, o) for o in objects), "an object of the release is missing"
    assert release.operator_ready(kind)
    pods = poll(lambda: release.operator_pods(kind), release.REMOVAL_DEADLINE_S, "the operator pods listed")
    assert len(pods) == 2, f"the chart runs a leader and a standby: {pods}"
    holder = poll(lambda: release.lease_holder(kind), 120, "a leader elected")
    assert [p for p in pods if holder.startswith(f"{p}-")], f"the Lease is held by {holder}, not by {pods}"
    crd = kind.json("get", "customresourcedefinition", CRD_NAME)
    assert crd["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep"

    # A job the operator cannot place (no node matches): it stays an object with no pods.
    job = jobs.digits_job("left-behind", 1, 1, steps=10, vnode_seconds=0.0)
    job["spec"]["template"]["spec"]["nodeSelector"] = {"ebbflow.dev/no-such-node": "true"}
    jobs.apply(kind, job)
    poll(lambda: jobs.status(kind, "left-behind").get("phase") == "Pending", 120, "the job Pending")

    uninstall = ("helm", "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")
    run(*uninstall, timeout=release.REMOVAL_DEADLINE_S)
    removed = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    poll(
        lambda: not any(exists(kind, o) for o in removed),
        release.REMOVAL_DEADLINE_S,
        "every object of the release but the CRD removed",
    )
    selector = f"app.kubernetes.io/instance={RELEASE}"
    poll(  # the Deployment's pods go after it, within their termination grace
        lambda: not kind.json("--namespace", RELEASE_NAMESPACE, "get", "pods", "-l", selector)["items"],
        release.REMOVAL_DEADLINE_S,
        "the operator's pods gone with the release",
    )
    assert exists(kind, {"kind": "CustomResourceDefinition", "name": CRD_NAME, "namespace": None})
    left = kind.json("--namespace", namespace, "get", "elastictrainingjob", "left-behind")
    assert left["status"].get("phase") == "Pending", "the job left behind lost its status"

    with pytest.raises(KindError):  # the release is gone, not just scaled down
        run("helm", "status", RELEASE, "--namespace", RELEASE_NAMESPACE, timeout=60)

    install_chart(kind, E2E_CHART_VALUES)
    poll(lambda: release.operator_ready(kind), release.REMOVAL_DEADLINE_S, "the operator Ready again")
    # A spec change made now is observed: the reinstalled operator reconciles the job left behind.
    patch = '{"spec": {"replicas": {"max": 2}}}'
    job_ref = ("--namespace", namespace, "elastictrainingjob", "left-behind")
    kind.kubectl("patch", *job_ref, "--type=merge", "-p", patch)
    wanted = kind.json("get", *job_ref)["metadata"]["generation"]
    poll(
        lambda: jobs.status(kind, "left-behind").get("observedGeneration") == wanted,
        120,
        f"the reinstalled operator observing generation {wanted} of the job left behind",
    )


# What a standby's take-over may take beyond the Lease's duration: its retry period (2 s), kubectl's
# polling and a loaded machine's scheduling.
TAKE_OVER_MARGIN_S = 10


def _operator_nodes(kind: Kind) -> dict[str, str]:
    """Running operator pod -> its node."""
    selector = f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE}"
    found = kind.json("--namespace", RELEASE_NAMESPACE, "get", "pods", "-l", selector)["items"]
    running = set(release.operator_pods(kind))
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in found if p["metadata"]["name"] in running}


def test_the_standby_leads_within_the_lease_when_the_leaders_node_is_lost_and_the_job_trains_on(
    kind: Kind, namespace: str, operator: str
) -> None:
    nodes = poll(lambda: n if len(n := _operator_nodes(kind)) == 2 else None, 120, "two operator pods")
    holder = poll(lambda: release.lease_holder(kind), 120, "a leader elected")
    (leader,) = [p for p in nodes if holder.startswith(f"{p}-")]
    (standby,) = [p for p in nodes if p != leader]
    lost = nodes[leader]
    assert nodes[standby] != lost, f"the chart spreads its replicas over nodes: {nodes}"
    lease = kind.json("--namespace", RELEASE_NAMESPACE, "get", "lease", LEASE_NAME)["spec"]
    duration = int(lease["leaseDurationSeconds"])

    job = jobs.digits_job("steady", 1, 1, steps=100_000, vnode_seconds=0.05)
    away = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [lost]}
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [away]}]
            }
        }
    }
    jobs.apply(kind, job)
    jobs.wait_phase(kind, "steady", "Running")
    release.trains_on(kind, "steady", 5)

    # The node stops at once, its processes frozen mid-flight: the leader neither renews nor releases
    # the Lease, which the standby may take only once it has expired.
    frozen_at = time.monotonic()
    run("docker", "pause", lost, timeout=60)
    try:
        leading = f"{standby}-"
        poll(lambda: release.lease_holder(kind).startswith(leading), duration + 60, "the standby leading")
        took = time.monotonic() - frozen_at
        figures = {"lease_seconds": duration, "took_over_seconds": round(took, 1)}
        jobs.record_figures("operator-take-over", figures)
        assert took <= duration + TAKE_OVER_MARGIN_S, f"took over after {took:.1f} s (Lease {duration} s)"
        # The new leader writes the job's status from the trainers' reports.
        release.trains_on(kind, "steady", 20)
    finally:
        run("docker", "unpause", lost, timeout=60)
    # The old leader wakes past its renew deadline: it stays a standby, and the new leader keeps the Lease.
    poll(lambda: release.operator_ready(kind), release.REMOVAL_DEADLINE_S, "both operator pods Ready again")
    assert release.lease_holder(kind).startswith(f"{standby}-")
    release.trains_on(kind, "steady", 5)
