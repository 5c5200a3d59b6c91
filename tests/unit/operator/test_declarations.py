"""Which workers the operator declares gone to the job's rendezvous, and where (decision/declarations.py):
pure, from pods and nodes built here, sorted by `planner.classify` as a pass does."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from ebbflow_devtools.builders import JobBuilder, make_job, make_node, make_rendezvous, make_worker
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.declarations import declaration
from ebbflow_operator.decision.model import Pod, Taint
from ebbflow_operator.decision.planner import classify

J = make_job(JobBuilder("j").replicas(1, 4))
NODES = {
    "n0": make_node("n0"),
    "n1": make_node("n1"),
    "evicting": make_node("evicting", taints=(Taint("spot-reclaim", "NoExecute"),)),
}
RDZV = replace(make_rendezvous(J, "n0"), ip="10.0.0.5")
ADDRESS = f"10.0.0.5:{manifests.declarations_port(J)}"


def worker(index: int, node: str | None = "n0", phase: str = "Running", **fields: Any) -> Pod:
    return make_worker(J, index, node, phase, **fields)


@pytest.mark.parametrize(
    ("pods", "recorded", "declared"),
    [
        pytest.param([worker(0), worker(1, "n1")], {}, (), id="all-running-nothing"),
        pytest.param(
            [worker(0), worker(1, "lost-node")],
            {"j-worker-1": "lost-node"},
            (("j-worker-1", "its node lost-node is gone"),),
            id="node-gone",
        ),
        pytest.param(
            [worker(0), worker(1, "lost-node", deleting=True)],
            {"j-worker-1": "lost-node"},
            (("j-worker-1", "its node lost-node is gone"),),
            id="deleting-on-a-node-gone",
        ),
        pytest.param(
            [worker(0), worker(1, phase="Failed", exit_code=137)],
            {"j-worker-1": "n0"},
            (("j-worker-1", "its pod failed (exit code 137)"),),
            id="killed",
        ),
        pytest.param(
            [worker(0, phase="Failed", exit_code=1, disruption="DeletionByTaintManager")],
            {"j-worker-0": "n0"},
            (("j-worker-0", "its pod failed (DeletionByTaintManager)"),),
            id="failed-with-a-disruption",
        ),
        pytest.param(
            [worker(0)],
            {"j-worker-0": "n0", "j-worker-1": "n1"},
            (("j-worker-1", "its pod is gone (Evicted)"),),
            id="recorded-pod-vanished",
        ),
        pytest.param(
            [worker(0), worker(1, deleting=True)],
            {"j-worker-1": "n0"},
            (),
            id="deleted-on-a-live-node-leaves-gracefully",
        ),
        pytest.param([worker(0), worker(1, "evicting")], {}, (), id="evicted-by-a-taint-leaves-gracefully"),
        pytest.param(
            [worker(0, phase="Succeeded", exit_code=0)], {"j-worker-0": "n0"}, (), id="succeeded-not-gone"
        ),
    ],
)
def test_workers_that_run_nowhere_are_declared_with_their_evidence(
    pods: list[Pod], recorded: dict[str, str], declared: tuple[tuple[str, str], ...]
) -> None:
    seen = classify(pods, recorded, NODES, J)
    if any(p.node == "evicting" for p in pods):
        assert [d.reason for d in seen.taken] == ["being evicted"], "the taint is one that evicts"
    found = declaration(J, [RDZV, *pods], pods, seen, NODES)
    assert (found.pods if found is not None else ()) == declared
    assert found is None or found.address == ADDRESS


@pytest.mark.parametrize(
    "rendezvous",
    [
        pytest.param([], id="no-rendezvous-pod"),
        pytest.param([make_rendezvous(J, "n0")], id="no-address-yet"),
        pytest.param([replace(RDZV, phase="Pending")], id="not-running"),
        pytest.param([replace(RDZV, deleting=True)], id="being-replaced"),
        pytest.param([replace(RDZV, owner_uid="another-incarnation")], id="another-jobs"),
    ],
)
def test_no_declaration_without_a_running_rendezvous_pod_to_hear_it(rendezvous: list[Pod]) -> None:
    pods = [worker(0), worker(1, "lost-node")]
    seen = classify(pods, {"j-worker-1": "lost-node"}, NODES, J)
    assert declaration(J, [*rendezvous, *pods], pods, seen, NODES) is None
