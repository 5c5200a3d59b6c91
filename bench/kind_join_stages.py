"""On the kind cluster, where the time goes when a node returns: from the node given back to its new
worker training in the job's bigger world, stage by stage (issue 45: "measure each stage and remove
what is not needed").

A digits job of whole-node workers (min 2, max 3) trains on the three worker nodes; each repetition
takes one node away (a spot preemption: its pod leaves gracefully), waits for the world of two to
train, then gives the node back and times, from that moment:

  node registered, node Ready, GPUs advertised       the kubelet, flannel and the device plugin
  node schedulable                                   the node lifecycle controller lifts not-ready
  worker pod created, bound                          the operator, the scheduler
  container running                                  the kubelet: sandbox, pod network, container
  launcher's first line, join attempt                the trainer's start: imports, script check
  world joined, newcomer resumes, rank 0 trains      the rendezvous, the state's transfer, a step

API-side stages are sampled every POLL_S (their timestamps have second precision); the trainer's
stages come from its log lines' kubelet timestamps. Results: one JSON line per repetition, then the
median of each stage, also written to bench/results/kind_join_stages.json.

    .venv/bin/python -m ebbflow_devtools.kind      # the e2e tier's cluster, if none is up
    .venv/bin/python bench/kind_join_stages.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from datetime import datetime

import yaml
from ebbflow_api import contract
from ebbflow_devtools.kind import E2E_NAMESPACE, REPO, WORKERS, Kind, KindError
from ebbflow_devtools.kind_jobs import digits_job
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision.manifests import rendezvous_name

JOB = "joins"
POLL_S = 0.2
DEADLINE_S = 300
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
RESULTS = REPO / "bench" / "results" / "kind_join_stages.json"
# Stages in the order they happen; each is seconds from the node given back.
STAGES = (
    "node_registered",
    "node_ready",
    "gpus_advertised",
    "node_schedulable",
    "pod_created",
    "pod_bound",
    "container_running",
    "launcher_first_line",
    "join_attempt",
    "world_joined",
    "newcomer_resumes",
    "rank0_trains",
)


class ApiStages(threading.Thread):
    """Samples the node and the job's pods until stopped: when each API-side stage was first seen."""

    def __init__(self, kind: Kind, node: str, old_pods: set[str]) -> None:
        super().__init__(daemon=True)
        self._kind, self._node, self._old = kind, node, old_pods
        self.seen: dict[str, float] = {}
        self.pod: str | None = None
        self._stop_sampling = threading.Event()

    def stop(self) -> None:
        self._stop_sampling.set()
        self.join()

    def run(self) -> None:
        while not self._stop_sampling.wait(POLL_S):
            try:
                self._sample()
            except KindError:
                continue  # the API server was busy; the next sample sees the same

    def _mark(self, stage: str, holds: bool) -> None:
        if holds and stage not in self.seen:
            self.seen[stage] = time.time()

    def _sample(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self._kind.api.json("/api/v1/nodes")["items"]}
        node = nodes.get(self._node)
        if node is not None:
            self._mark("node_registered", True)
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            self._mark("node_ready", conditions.get("Ready") == "True")
            gpus = node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")
            self._mark("gpus_advertised", int(gpus) > 0)
            taints = {t["key"] for t in node["spec"].get("taints", [])}
            ready = conditions.get("Ready") == "True"
            self._mark("node_schedulable", ready and not taints & NOT_READY_TAINTS)
        pods = self._kind.api.pods(E2E_NAMESPACE, f"{contract.LABEL_JOB_NAME}={JOB}")
        new = [
            p for p in pods if p["metadata"]["name"] not in self._old and "-worker-" in p["metadata"]["name"]
        ]
        if not new:
            return
        pod = new[0]
        self.pod = pod["metadata"]["name"]
        self._mark("pod_created", True)
        self._mark("pod_bound", bool(pod["spec"].get("nodeName")))
        states = [c.get("state", {}) for c in pod["status"].get("containerStatuses", [])]
        self._mark("container_running", any("running" in s for s in states))


def _log_times(kind: Kind, pod: str) -> list[tuple[float, str]]:
    """The pod's log lines with the kubelet's timestamps, as (epoch seconds, text)."""
    text = kind.api.text(f"/api/v1/namespaces/{E2E_NAMESPACE}/pods/{pod}/log", timestamps="true")
    lines = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        lines.append((datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp(), rest))
    return lines


def _first(lines: list[tuple[float, str]], needle: str, after: float = 0.0) -> float | None:
    return next((t for t, text in lines if needle in text and t >= after), None)


def _trainer_stages(kind: Kind, newcomer: str, given_back: float) -> dict[str, float | None]:
    """The trainer's stages from the newcomer's log and rank 0's (`rank0_trains`: rank 0 logs the
    pause after the bigger world's first step)."""
    lines = _log_times(kind, newcomer)
    joined = _first(lines, "joined generation") or given_back
    rank0_trains = None
    for pod in _worker_pods(kind):
        pod_lines = _log_times(kind, pod)
        if _first(pod_lines, "rank 0 of 3 resumes", after=joined) is not None:
            rank0_trains = _first(pod_lines, "training resumed after", after=joined)
    return {
        "launcher_first_line": lines[0][0] if lines else None,
        "join_attempt": _first(lines, "attempts to join the next round"),
        "world_joined": _first(lines, "joined generation"),
        "newcomer_resumes": _first(lines, "resumes at step"),
        "rank0_trains": rank0_trains,
    }


def _worker_pods(kind: Kind) -> list[str]:
    pods = kind.api.pods(E2E_NAMESPACE, f"{contract.LABEL_JOB_NAME}={JOB}")
    return [
        p["metadata"]["name"]
        for p in pods
        if "-worker-" in p["metadata"]["name"] and p["status"].get("phase") == "Running"
    ]


def _training_on(kind: Kind, size: int, since: float, first_world: bool = False) -> bool:
    """A world of `size` resumed after `since` and rank 0 has trained in it (a job's first world
    logs no pause: its resumption is enough)."""
    for pod in _worker_pods(kind):
        with_times = _log_times(kind, pod)
        if _first(with_times, f"rank 0 of {size} resumes", after=since) is not None:
            return first_world or _first(with_times, "training resumed after", after=since) is not None
    return False


def one_return(kind: Kind) -> dict[str, float | None]:
    """Take a node away (not the rendezvous pod's), wait for the world of two, give it back: each
    stage's seconds."""
    store = kind.api.pods(E2E_NAMESPACE, f"{contract.LABEL_JOB_NAME}={JOB}")
    store_nodes = {p["spec"].get("nodeName") for p in store if p["metadata"]["name"] == rendezvous_name(JOB)}
    node = max(set(WORKERS) - store_nodes)
    taken = time.time()
    kind.take_node_away(node)
    wait_for(lambda: _training_on(kind, 2, taken), DEADLINE_S, "a world of two training")
    sampler = ApiStages(kind, node, set(_worker_pods(kind)))
    given_back = time.time()
    sampler.start()
    kind.bring_node_back(node)
    wait_for(lambda: _training_on(kind, 3, given_back), DEADLINE_S, "a world of three training")
    sampler.stop()
    assert sampler.pod is not None, "no new worker pod was seen"
    moments: dict[str, float | None] = {**sampler.seen, **_trainer_stages(kind, sampler.pod, given_back)}
    return {s: None if (t := moments.get(s)) is None else round(t - given_back, 2) for s in STAGES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    kind = Kind()
    kind.ensure_namespace(E2E_NAMESPACE)
    job = digits_job(JOB, 2, 3, steps=1_000_000, vnode_seconds=0.03, gpus=4, virtual_nodes=12)
    kind.kubectl("-n", E2E_NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump(job))
    try:
        wait_for(lambda: _training_on(kind, 3, 0, first_world=True), DEADLINE_S, "the job training on three")
        runs = []
        for _ in range(args.repeats):
            runs.append(one_return(kind))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjob", JOB, "--ignore-not-found")
        kind.give_back_taken_nodes()
    medians = {s: statistics.median(v) for s in STAGES if (v := [t for r in runs if (t := r[s]) is not None])}
    print(json.dumps({"median": medians}), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs, "median": medians}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
