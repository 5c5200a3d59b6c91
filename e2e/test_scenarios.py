"""What users meet on a cluster whose capacity changes, with the operator installed by its chart:
a node preempted under a job and given back, a higher-priority job taking GPUs from a running one,
and a bad manifest refused. Each scenario's figures (from the trainers' own logs) are written to
.cluster/e2e/<scenario>.json for the issue notes and docs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from ebbflow_devtools import trainer_logs
from ebbflow_devtools.demo import target_accuracy
from ebbflow_devtools.demo_plan import node_to_take
from ebbflow_devtools.kind import E2E_NAMESPACE, Kind, KindError, environment, poll
from ebbflow_operator.decision.manifests import rendezvous_name

from . import jobs
from .jobs import JOB_DEADLINE_S

# Whole-node workers (4 GPUs: 2 devices x 2 replicas) on the three kind workers, 12 virtual nodes.
WHOLE_NODE = {"gpus": 4, "virtual_nodes": 12}
# Steps for a job that must still be training when its scenario ends (hours at 0.03 s a virtual node).
LONGER_THAN_THE_SCENARIO = 100_000


def _step(kind: Kind, name: str) -> int:
    return int((jobs.status(kind, name).get("progress") or {}).get("step") or 0)


def _pod_logs(kind: Kind, name: str) -> list[str]:
    return [jobs.logs(kind, p["metadata"]["name"]) for p in jobs.worker_pods(kind, name)]


def _finish(kind: Kind, name: str) -> tuple[dict[str, Any], tuple[int, str]]:
    """Wait for Succeeded; the status and rank 0's (step, model digest)."""
    final = jobs.wait_phase(kind, name, "Succeeded", timeout=2 * JOB_DEADLINE_S)
    digest = poll(lambda: trainer_logs.finished(_pod_logs(kind, name)), 60, f"{name}'s final digest")
    return final, digest


def _grows_after(kind: Kind, name: str, generation: int, size: int) -> bool:
    worlds = trainer_logs.worlds(_pod_logs(kind, name))
    return any(w.generation > generation and w.size == size for w in worlds)


def test_a_preempted_node_shrinks_the_job_and_its_return_grows_it_bitwise_as_calm(
    kind: Kind, namespace: str, operator: str
) -> None:
    started = time.monotonic()
    # 600 steps: the node goes at step 60 or so and comes back after 100 steps on two workers; the
    # world of three forms again within about 200 steps (pod start, imports, a step boundary), so
    # the job still has steps left to train on three. A worker per node, leaving each node one GPU.
    spot = jobs.digits_job("spot", 1, 3, steps=600, vnode_seconds=0.03, gpus=3, virtual_nodes=12)
    jobs.apply(kind, spot)
    poll(lambda: jobs.all_training_together(kind, "spot", 3) and _step(kind, "spot") >= 60, 600, "3 at work")
    rendezvous = kind.json("-n", E2E_NAMESPACE, "get", "pod", rendezvous_name("spot"))["spec"]["nodeName"]
    node = node_to_take(jobs.status(kind, "spot")["workerNodes"], rendezvous)
    # The calm reference meanwhile, on the spare GPU of the node that stays: one worker of one GPU
    # running all 12 virtual nodes, without the simulated device time (a sleep, no arithmetic):
    # deterministic mode promises the same bits as the disturbed world of 12 processes.
    calm = jobs.digits_job("calm", 1, 1, steps=600, vnode_seconds=0.0, virtual_nodes=12, node=rendezvous)
    jobs.apply(kind, calm)
    trio = max(w.generation for w in trainer_logs.worlds(_pod_logs(kind, "spot")))
    taken_at = time.monotonic()
    kind.take_node_away(node)

    shrunk = poll(lambda: (s := jobs.status(kind, "spot")).get("desiredReplicas") == 2 and s, 120, "shrunk")
    assert shrunk["phase"] == "Running" and shrunk.get("preemptions", 0) >= 1, shrunk
    assert any(c["type"] == "Preempted" and c["status"] == "True" for c in shrunk["conditions"]), shrunk
    poll(lambda: _grows_after(kind, "spot", trio, 2), JOB_DEADLINE_S, "a world of two training")
    resumed_at = time.monotonic()
    pair = next(
        w for w in trainer_logs.worlds(_pod_logs(kind, "spot")) if w.generation > trio and w.size == 2
    )
    assert pair.source == "memory" and pair.steps_lost == 0, pair

    step = _step(kind, "spot")
    poll(lambda: _step(kind, "spot") >= step + 100, JOB_DEADLINE_S, "100 steps on two workers")
    kind.bring_node_back(node)
    poll(lambda: _grows_after(kind, "spot", pair.generation, 3), JOB_DEADLINE_S, "three again")
    final, (steps, digest) = _finish(kind, "spot")
    accuracy = final["progress"]["eval"]["metrics"]["accuracy"]
    assert steps == 600 and accuracy >= target_accuracy(), final["progress"]
    disturbed_s = time.monotonic() - started
    _, (_, calm_digest) = _finish(kind, "calm")
    assert digest == calm_digest, "the disturbed run's model differs from the calm run's"
    jobs.record_figures(
        "preemption",
        {
            "worlds": [vars(w) for w in trainer_logs.worlds(_pod_logs(kind, "spot"))],
            "node_taken_to_world_of_two_seconds": round(resumed_at - taken_at, 1),
            "job_seconds": round(disturbed_s, 1),
            "accuracy": accuracy,
        },
    )


def _rendezvous_pod(kind: Kind, name: str) -> dict[str, Any]:
    return dict(kind.json("-n", E2E_NAMESPACE, "get", "pod", rendezvous_name(name)))


def test_the_job_keeps_training_when_its_rendezvous_node_is_lost(
    kind: Kind, namespace: str, operator: str
) -> None:
    # 400 steps: the store and a worker go at step 60 or so, and nothing trains until the new store
    # serves (the world lost a member), so the job cannot end before the scenario's last event.
    jobs.apply(kind, jobs.digits_job("store", 1, 3, steps=400, vnode_seconds=0.03, **WHOLE_NODE))
    poll(
        lambda: jobs.all_training_together(kind, "store", 3) and _step(kind, "store") >= 60, 600, "3 at work"
    )
    store = _rendezvous_pod(kind, "store")
    node = store["spec"]["nodeName"]
    trio = max(w.generation for w in trainer_logs.worlds(_pod_logs(kind, "store")))
    taken_at = time.monotonic()
    kind.take_node_away(node)
    # The operator puts a new store under the same DNS name; the trainers resolve it again, re-join
    # it (it starts empty) and resume from memory.
    replaced = poll(
        lambda: (
            (p := _rendezvous_pod(kind, "store"))["metadata"]["uid"] != store["metadata"]["uid"]
            and p["status"].get("phase") == "Running"
        ),
        JOB_DEADLINE_S,
        "a new rendezvous pod",
    )
    assert replaced
    poll(lambda: _grows_after(kind, "store", trio, 2), JOB_DEADLINE_S, "a world of two on the new store")
    resumed_at = time.monotonic()
    pair = next(
        w for w in trainer_logs.worlds(_pod_logs(kind, "store")) if w.generation > trio and w.size == 2
    )
    assert pair.source == "memory", pair
    final, (steps, _) = _finish(kind, "store")
    assert steps == 400 and final["progress"]["eval"]["metrics"]["accuracy"] >= target_accuracy()
    jobs.record_figures(
        "rendezvous_node_lost",
        {
            "worlds": [vars(w) for w in trainer_logs.worlds(_pod_logs(kind, "store"))],
            "node_taken_to_world_of_two_seconds": round(resumed_at - taken_at, 1),
        },
    )


def test_a_higher_priority_job_takes_gpus_gracefully_and_gives_them_back(
    kind: Kind, namespace: str, operator: str
) -> None:
    # The low job must outlive the whole scenario (the namespace fixture deletes it): at 1,500 steps it
    # once finished on 1 or 2 workers, while the node the previous scenario gave back was not yet
    # running pods, before the high job had taken its GPUs (a CI failure: desiredReplicas 0, Succeeded).
    low_job = jobs.digits_job(
        "low", 1, 3, steps=LONGER_THAN_THE_SCENARIO, vnode_seconds=0.03, priority=0, **WHOLE_NODE
    )
    jobs.apply(kind, low_job)
    poll(lambda: jobs.all_training_together(kind, "low", 3), 600, "the low-priority job on 3 workers")
    trio = max(w.generation for w in trainer_logs.worlds(_pod_logs(kind, "low")))
    jobs.apply(kind, jobs.digits_job("high", 1, 2, steps=200, vnode_seconds=0.03, priority=10, **WHOLE_NODE))
    poll(lambda: jobs.all_training_together(kind, "high", 2), JOB_DEADLINE_S, "the high-priority job at max")
    assert jobs.status(kind, "low")["desiredReplicas"] == 1
    # The leavers stopped at a step boundary (SIGTERM, exit 0): the one left resumed from memory and
    # lost nothing, and the operator counted no failure.
    poll(lambda: _grows_after(kind, "low", trio, 1), JOB_DEADLINE_S, "the low job training alone")
    alone = next(
        w for w in trainer_logs.worlds(_pod_logs(kind, "low")) if w.generation > trio and w.size == 1
    )
    assert alone.source == "memory" and alone.steps_lost == 0, alone
    jobs.wait_phase(kind, "high", "Succeeded")
    poll(lambda: _grows_after(kind, "low", alone.generation, 3), JOB_DEADLINE_S, "the low job back to 3")
    low = jobs.status(kind, "low")
    assert low["phase"] == "Running" and not low.get("restarts"), low
    worlds = [w for w in trainer_logs.worlds(_pod_logs(kind, "low")) if w.generation > 1]
    assert worlds and {w.steps_lost for w in worlds} == {0}, worlds


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        pytest.param(
            "virtualNodes",
            5,
            "spec.globalBatchSize must be a multiple",
            id="batch-not-a-multiple-of-virtual-nodes",
        ),
        pytest.param(
            "replicas",
            {"min": 3, "max": 2},
            "spec.replicas.min must be <= spec.replicas.max",
            id="min-above-max",
        ),
    ],
)
def test_a_bad_manifest_is_refused_by_kubectl_apply(
    kind: Kind, field: str, value: Any, expected: str
) -> None:
    job = jobs.digits_job("bad", 1, 3, steps=10, vnode_seconds=0.0)
    job["spec"][field] = value
    manifest = Path(jobs.FIGURES / f"bad-{field}.yaml")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(job))
    result = subprocess.run(
        ["kubectl", "apply", "-f", str(manifest)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    with pytest.raises(KindError, match="NotFound"):
        kind.kubectl("-n", E2E_NAMESPACE, "get", "elastictrainingjob", "bad")
