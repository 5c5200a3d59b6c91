"""Switching the allocation policy as platform teams do, with `helm upgrade` while jobs train, and back
with `helm rollback`; between the two, the goodput policy fed by real trainers' reports through their
pods' progress annotation.

The upgrade and the rollback replace the operator's pods; `steady` (one worker, min = max, which no
policy resizes) keeps its pods and trains on across both. Under goodput, two jobs of 12 virtual nodes
scale differently: `scales` computes 0.1 s per virtual node and its workers barely wait on each other;
`chatty` computes 0.01 s per virtual node and spends 1 s per step in its collective as soon as it has
a second worker (`--simulated-sync-seconds`, a slow interconnect). Fair share would give each half the
free GPUs; goodput, once their reports show how each scales, leaves `chatty` one worker and gives
`scales` what its measured scaling earns (more on a quiet machine). `scales` also allows a larger
global batch (spec.maxGlobalBatchSize with AdaScale): the policy raises it, the operator writes it on
every worker pod, the kubelet projects it into the file the trainers read, and every worker switches
at one step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.kind import E2E_CHART_VALUES, RELEASE, RELEASE_NAMESPACE, Kind, install_chart, poll, run
from ebbflow_devtools.waiting import NotYet

from . import jobs, release

# B = 24: the digits model's gradient-noise scale passes 2B within the first reports (it starts near
# 50), so the policy's batch choice need not wait for training to raise it past a larger B.
VIRTUAL_NODES, SAMPLES_PER_VIRTUAL_NODE = 12, 2
BATCH = VIRTUAL_NODES * SAMPLES_PER_VIRTUAL_NODE
# Time for reports to come in, the policy to move GPUs and the resized worlds to form.
CONVERGE_S = 600
HOLD_STILL_S = 20


class _Phases:
    """Seconds each phase of the scenario took, for the figures."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.monotonic()

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._since, 1)
        self._since = now


def _job(name: str, vnode_seconds: float, sync_seconds: float, **spec: Any) -> dict[str, Any]:
    job = jobs.digits_job(
        name,
        1,
        VIRTUAL_NODES,
        steps=100_000,
        vnode_seconds=vnode_seconds,
        virtual_nodes=VIRTUAL_NODES,
        samples_per_virtual_node=SAMPLES_PER_VIRTUAL_NODE,
    )
    job["spec"]["template"]["spec"]["containers"][0]["command"] += [
        "--simulated-sync-seconds",
        str(sync_seconds),
    ]
    job["spec"].update(spec)
    return job


def _sizes_holding_still(
    kind: Kind, names: tuple[str, ...], wanted: Callable[[dict[str, int]], bool]
) -> dict[str, int]:
    """The jobs' sizes once they are `wanted`, every desired worker runs, and they held for
    HOLD_STILL_S seconds."""
    since: list[tuple[dict[str, int], float]] = []

    def still() -> dict[str, int] | None:
        sizes = {n: int(jobs.status(kind, n).get("desiredReplicas") or 0) for n in names}
        if not wanted(sizes) or not all(len(jobs.running_workers(kind, n)) == sizes[n] for n in names):
            since.clear()
            return None
        if not since or since[0][0] != sizes:
            since[:] = [(sizes, time.monotonic())]
        return sizes if time.monotonic() - since[0][1] >= HOLD_STILL_S else None

    return poll(still, CONVERGE_S, "sizes that hold still")


def _goodput_allocates_by_the_reports(kind: Kind) -> dict[str, int]:
    adaptive = {"maxGlobalBatchSize": 4 * BATCH, "lrScaling": "adascale"}
    jobs.apply(kind, _job("scales", vnode_seconds=0.1, sync_seconds=0.0, **adaptive))
    jobs.apply(kind, _job("chatty", vnode_seconds=0.01, sync_seconds=1.0))
    # Both jobs start at their minimum, one worker. Fair share would give each half the free GPUs;
    # goodput leaves chatty one (its reports show the collective's cost) and gives scales what its
    # measured scaling earns: more on a quiet machine, sometimes one on CI's two saturated cores.
    return _sizes_holding_still(kind, ("scales", "chatty"), lambda s: s["chatty"] == 1 <= s["scales"])


def _the_raised_batch_reaches_every_worker(kind: Kind) -> int:
    def switched() -> tuple[int, dict[str, trainer_logs.BatchSwitch]] | NotYet:
        """The batch the policy chose for scales once above spec.globalBatchSize (it keeps B until
        the workers' reports carry a gradient-noise estimate that favours a larger one, and may move
        again as the estimate does), with each running worker's switch to it, once it is on every
        worker pod and every running worker has switched or trains in a world formed since (a world
        receives the batch with the state: a newcomer, or a worker whose process a re-formation
        replaced before it logged the switch). When no running worker logged the switch (every
        worker that did has left since), rank 0's report of the current world says the batch it
        trains at: the world's workers share it (they read it in one reduced message)."""
        status = jobs.status(kind, "scales")
        chosen = status.get("globalBatchSize")
        if not chosen or chosen <= BATCH:
            return NotYet(f"status.globalBatchSize is {chosen!r}")
        annotated = {
            p["metadata"]["name"]: p["metadata"]["annotations"].get(contract.ANNOTATION_GLOBAL_BATCH_SIZE)
            for p in jobs.worker_pods(kind, "scales")
        }
        logs = {p: jobs.logs(kind, p) for p in jobs.running_workers(kind, "scales")}
        switches = {p: trainer_logs.batch_switches(log) for p, log in logs.items()}
        found = {p: s[-1] for p, s in switches.items() if s and s[-1].batch == chosen}
        others = {p: trainer_logs.resumptions(log) for p, log in logs.items() if p not in found}
        progress = status.get("progress") or {}
        seen = (
            f"chosen {chosen}; annotations {annotated}; switches {switches}; others' resumptions {others}; "
            f"rank 0 reports {progress.get('microBatch')} samples x {VIRTUAL_NODES} virtual nodes on "
            f"{progress.get('worldSize')} workers at step {progress.get('step')}"
        )
        if set(annotated.values()) != {str(chosen)} or not all(others.values()):
            return NotYet(seen)
        if found:
            step = min(s.step for s in found.values())
            return (chosen, found) if all(r[-1].step >= step for r in others.values()) else NotYet(seen)
        formed = max(r[-1].step for r in others.values())  # the current world's first step
        current = (
            progress.get("worldSize") == len(logs)
            and int(progress.get("step") or 0) > formed
            and int(progress.get("microBatch") or 0) * VIRTUAL_NODES == chosen
        )
        return (chosen, found) if current else NotYet(seen)

    chosen, last = poll(switched, CONVERGE_S, "every scales worker at a batch above spec.globalBatchSize")
    assert chosen <= 4 * BATCH and chosen % VIRTUAL_NODES == 0, chosen
    assert len({s.step for s in last.values()}) <= 1, f"every worker switches at one step: {last}"
    # The samples add up: V virtual nodes of the new per-node count make the chosen global batch.
    assert all(s.samples_per_virtual_node * VIRTUAL_NODES == chosen for s in last.values()), last
    assert "globalBatchSize" not in jobs.status(kind, "chatty"), "a job without maxGlobalBatchSize keeps B"
    return chosen


def test_helm_upgrade_to_goodput_allocates_by_the_trainers_reports_and_helm_rollback_restores_fair(
    kind: Kind, namespace: str, operator: str, reinstalled: None
) -> None:
    jobs.apply(kind, jobs.digits_job("steady", 1, 1, steps=100_000, vnode_seconds=0.05))
    jobs.wait_phase(kind, "steady", "Running")
    release.trains_on(kind, "steady", 5)
    steady = release.job_pods(kind, "steady")
    assert len(steady) == 2, f"a worker and the rendezvous store: {steady}"
    history = json.loads(run("helm", "history", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json", timeout=60))
    revision = max(entry["revision"] for entry in history)

    # A changed value changes the Deployment's pod template: its pods are replaced, the jobs' are not.
    phases = _Phases()
    first = release.operator_pods(kind)
    install_chart(kind, (*E2E_CHART_VALUES, "operator.policy=goodput"))
    upgraded = release.rolled(kind, first, "--policy=goodput")
    release.trains_on(kind, "steady", 20)
    assert release.job_pods(kind, "steady") == steady, "helm upgrade replaced a pod of the job"
    phases.done("upgrade")

    sizes = _goodput_allocates_by_the_reports(kind)
    phases.done("sizes_held_still")
    batch = _the_raised_batch_reaches_every_worker(kind)
    phases.done("batch_switched")

    # The goodput jobs have shown what they were for: their workers would share the cores with the
    # operator's roll (steady, which no policy resizes, shows that jobs train on across it).
    jobs.remove(kind, "scales", "chatty")
    rollback = ("helm", "rollback", RELEASE, str(revision), "-n", RELEASE_NAMESPACE, "--wait")
    run(*rollback, timeout=release.REMOVAL_DEADLINE_S)
    release.rolled(kind, upgraded, "--policy=fair")
    release.trains_on(kind, "steady", 20)
    assert release.job_pods(kind, "steady") == steady, "helm rollback replaced a pod of the job"
    assert jobs.status(kind, "steady")["phase"] == "Running"
    phases.done("rollback")
    jobs.record_figures("goodput", {"sizes": sizes, "batch": batch, "phase_seconds": phases.seconds})
