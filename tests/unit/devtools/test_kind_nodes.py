"""When a kind worker given back counts as back: every DaemonSet that runs on the other workers has a
Ready pod on it (its pod network, NetworkPolicy and device-plugin agents serve again)."""

from __future__ import annotations

from typing import Any

import pytest
from ebbflow_devtools.kind import daemons_not_ready

pytestmark = pytest.mark.unit

WORKERS = ("w1", "w2", "w3")


def pod(
    daemonset: str | None, node: str, ready: bool = True, namespace: str = "kube-system"
) -> dict[str, Any]:
    owners = (
        [{"kind": "DaemonSet", "name": daemonset}] if daemonset else [{"kind": "ReplicaSet", "name": "x"}]
    )
    status = "True" if ready else "False"
    return {
        "metadata": {"namespace": namespace, "ownerReferences": owners},
        "spec": {"nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


EVERY_AGENT_ELSEWHERE = [
    pod("kube-router", "w2"),
    pod("flannel", "w2"),
    pod("kube-router", "w3"),
    pod("flannel", "w3"),
]


@pytest.mark.parametrize(
    ("here", "missing"),
    [
        pytest.param([pod("kube-router", "w1"), pod("flannel", "w1")], set(), id="every-agent-ready"),
        pytest.param([pod("flannel", "w1")], {"kube-system/kube-router"}, id="kube-router-not-yet-created"),
        pytest.param(
            [pod("kube-router", "w1", ready=False), pod("flannel", "w1")],
            {"kube-system/kube-router"},
            id="kube-router-starting",
        ),
        pytest.param([], {"kube-system/kube-router", "kube-system/flannel"}, id="nothing-yet"),
        pytest.param(
            [pod("kube-router", "w1"), pod("flannel", "w1"), pod(None, "w1", ready=False)],
            set(),
            id="other-pods-ignored",
        ),
    ],
)
def test_a_worker_is_back_once_every_daemonset_of_the_others_is_ready_on_it(
    here: list[dict[str, Any]], missing: set[str]
) -> None:
    assert daemons_not_ready(EVERY_AGENT_ELSEWHERE + here, "w1", WORKERS) == missing


def test_a_daemonset_only_on_the_control_plane_is_not_awaited() -> None:
    pods = [pod("control-only", "control-plane"), pod("kube-router", "w2"), pod("kube-router", "w1")]
    assert daemons_not_ready(pods, "w1", WORKERS) == set()
