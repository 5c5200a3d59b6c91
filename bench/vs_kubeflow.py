"""Ebbflow against Kubeflow's PyTorchJob (elastic), on the same kind cluster, with the same model and
the same disruptions, one system at a time, each on an identical fresh cluster.

Per system: a fresh kind cluster (hack/kind; the operator by its chart; Kubeflow's training-operator
v1.8.1, hack/kubeflow), each worker node advertising one GPU (three in all); the digits example with
min 2, max 4 workers of one GPU each and a global batch of 384 (Ebbflow: 6 virtual nodes of 64; Kubeflow:
examples/digits/torchrun_ddp.py under stock torchrun, Worker replicas 4, checkpoint every 50 steps on a
volume every node shares). A calm run, then a run through this schedule:

  a  a worker node lost (hosting neither the rendezvous nor worker 0)
  d  that node joins again (capacity added back)
  c  the highest-index worker evicted through the Eviction API (graceful)
  b  the node of worker 0 lost (Kubeflow's rendezvous host); if the job has not trained again within
     --patience seconds, the node comes back and the row says so

Each disruption waits until the job trains again (or --patience runs out) before the next, and is
applied at the same place between two of Kubeflow's checkpoints (steps 25-29 of every 50). The
disrupted run repeats --repeats times (default 3) on the same cluster, its lost nodes back before each:
a recovery of a few seconds on a 2-core machine that also hosts the control plane varies by seconds from
one run to the next, so the table gives each figure's median over the runs (times with their range) and
results.json keeps every run. Figures come
from the trainers' journals on the shared volume (ebbflow_devtools/recovery.py), never from
pod phases. Systems: ``ebbflow``; ``kubeflow`` (the documented defaults: no maxRestarts, torchrun's
rendezvous timeouts); ``kubeflow-tuned`` (maxRestarts 100 and Ebbflow's heartbeats: every second, 3 missed;
torchrun's 30 s last call).

    .venv/bin/python bench/vs_kubeflow.py [--systems ebbflow,kubeflow,kubeflow-tuned] [--steps 1000]
                                          [--repeats 3]
    .venv/bin/python bench/vs_kubeflow.py --compare RUN_DIR RUN_DIR   # is a second run within 30 %?

Results under bench/results/vs-kubeflow/<UTC time>/: each run's raw journals and pod logs,
results.json and table.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from ebbflow_devtools import recovery as rec
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.kind import (
    E2E_NAMESPACE,
    REPO,
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    SHARED_VOLUMES,
    TRAINER_IMAGE,
    WORKERS,
    Kind,
    KindError,
    load_image,
    run,
    set_up,
)
from ebbflow_devtools.kind_jobs import example
from ebbflow_devtools.waiting import wait_for
from ebbflow_operator.decision.manifests import rendezvous_name

NAMESPACE = E2E_NAMESPACE
# The host's side of the claim every job's pods mount (a hostPath PersistentVolume on /shared/volumes
# of every kind worker: the namespace's `restricted` Pod Security refuses an inline hostPath volume).
SHARED = SHARED_VOLUMES
CLAIM = "vs-kubeflow"
RESULTS = REPO / "bench" / "results" / "vs-kubeflow"
VIRTUAL_NODES, SAMPLES_PER_VNODE = 6, 64
GLOBAL_BATCH = VIRTUAL_NODES * SAMPLES_PER_VNODE
MIN_WORKERS, MAX_WORKERS = 2, 4
EXAMPLES = "/opt/ebbflow/examples/digits"
# Under Kubeflow a restart goes back to the last checkpoint, so its steps lost are the disruption's
# place between two checkpoints: each disruption waits for the same place (steps 25-29 of every 50),
# or that figure would be a draw from 0 to 49 and no second run could repeat it.
CHECKPOINT_EVERY, DISRUPT_AFTER_CHECKPOINT, DISRUPT_WINDOW = 50, 25, 5
# Torchrun's 30 s last call is kept: with Ebbflow's 1 s the tuned job crash-looped after an eviction in
# 2 of 4 disrupted runs (bench/README.md), a draw no repeat makes reproducible.
TUNED_RDZV = {"keep_alive_interval": "1", "keep_alive_max_attempt": "3"}


@dataclass(frozen=True)
class Settings:
    steps: int
    vnode_seconds: float
    patience: float
    repeats: int = 1


def _shared_volume(run_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bench's claim, its `run_name` folder mounted at /shared/<run_name> (made by `submit`)."""
    volume = {"name": "shared", "persistentVolumeClaim": {"claimName": CLAIM}}
    return volume, {"name": "shared", "mountPath": f"/shared/{run_name}", "subPath": run_name}


def _restricted(pod: dict[str, Any]) -> None:
    """The pod spec meets the `restricted` Pod Security standard its namespace enforces."""
    pod["securityContext"] = copy.deepcopy(RESTRICTED_POD_CONTEXT)
    for container in pod["containers"]:
        container["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER_CONTEXT)


class Ebbflow:
    name = "ebbflow"

    def manifest(self, job: str, settings: Settings) -> dict[str, Any]:
        """The digits example as an ElasticTrainingJob; every worker appends its journal to /shared."""
        manifest = JobBuilder(job, NAMESPACE).replicas(MIN_WORKERS, MAX_WORKERS).gpus(1).obj()
        manifest["spec"].update(virtualNodes=VIRTUAL_NODES, globalBatchSize=GLOBAL_BATCH)
        pod = manifest["spec"]["template"]["spec"]
        volume, mount = _shared_volume(job)
        container = pod["containers"][0]
        container["image"], container["imagePullPolicy"] = TRAINER_IMAGE, "IfNotPresent"
        container["command"] = [
            "ebbflow-train",
            "run",
            f"{EXAMPLES}/train.py",
            "--steps",
            str(settings.steps),
        ]
        container["command"] += ["--simulated-vnode-seconds", str(settings.vnode_seconds)]
        container["command"] += ["--progress-interval", "1", "--journal", f"/shared/{job}/$(POD_NAME).jsonl"]
        container["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        container["volumeMounts"], pod["volumes"] = [mount], [volume]
        _restricted(pod)
        # Durable checkpoints on the shared volume too (every 1,000 steps by default): what a job whose
        # every worker died would resume from. The disruptions here never need them.
        manifest["spec"]["checkpoint"] = {"path": f"/shared/{job}/checkpoints"}
        return manifest

    def kind_of_object(self) -> str:
        return "elastictrainingjob"

    def outcome(self, kind: Kind, job: str) -> str | None:
        phase = (kind.json("-n", NAMESPACE, "get", "elastictrainingjob", job).get("status") or {}).get(
            "phase"
        )
        return phase if phase in ("Succeeded", "Failed") else None

    def rendezvous_node(self, kind: Kind, job: str) -> str:
        return str(kind.json("-n", NAMESPACE, "get", "pod", rendezvous_name(job))["spec"]["nodeName"])

    def timeline(self, job: str) -> rec.Timeline:
        return rec.ebbflow_timeline(_records(SHARED / job, "*.jsonl"))


class Kubeflow:
    """Kubeflow's PyTorchJob with an elasticPolicy: stock torchrun in every pod, the c10d store hosted by
    worker 0's agent (PET_RDZV_ENDPOINT=<job>-worker-0), Worker replicas = max."""

    def __init__(self, tuned: bool) -> None:
        self.tuned = tuned
        self.name = "kubeflow-tuned" if tuned else "kubeflow"

    def manifest(self, job: str, settings: Settings) -> dict[str, Any]:
        volume, mount = _shared_volume(job)
        sample_seconds = settings.vnode_seconds / SAMPLES_PER_VNODE
        command = ["torchrun", f"{EXAMPLES}/torchrun_ddp.py", "--steps", str(settings.steps)]
        command += ["--global-batch", str(GLOBAL_BATCH), "--checkpoint-dir", f"/shared/{job}/checkpoints"]
        command += ["--checkpoint-every", str(CHECKPOINT_EVERY)]
        command += [
            "--simulated-sample-seconds",
            str(sample_seconds),
            "--events",
            f"/shared/{job}/events.jsonl",
        ]
        policy: dict[str, Any] = {
            "minReplicas": MIN_WORKERS,
            "maxReplicas": MAX_WORKERS,
            "rdzvBackend": "c10d",
        }
        if self.tuned:
            policy["maxRestarts"] = 100
            policy["rdzvConf"] = [{"key": k, "value": v} for k, v in TUNED_RDZV.items()]
        container = {
            "name": "pytorch",
            "image": TRAINER_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "volumeMounts": [mount],
        }
        pod = {"containers": [container], "volumes": [volume]}
        _restricted(pod)
        worker = {"replicas": MAX_WORKERS, "restartPolicy": "OnFailure", "template": {"spec": pod}}
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": job, "namespace": NAMESPACE},
            "spec": {"nprocPerNode": "1", "elasticPolicy": policy, "pytorchReplicaSpecs": {"Worker": worker}},
        }

    def kind_of_object(self) -> str:
        return "pytorchjob"

    def outcome(self, kind: Kind, job: str) -> str | None:
        conditions = (kind.json("-n", NAMESPACE, "get", "pytorchjob", job).get("status") or {}).get(
            "conditions"
        )
        done = [
            c["type"]
            for c in conditions or []
            if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
        ]
        return done[0] if done else None

    def rendezvous_node(self, kind: Kind, job: str) -> str:
        return str(kind.json("-n", NAMESPACE, "get", "pod", f"{job}-worker-0")["spec"]["nodeName"])

    def timeline(self, job: str) -> rec.Timeline:
        return rec.torchrun_timeline(_records(SHARED / job, "events.jsonl"))


System = Ebbflow | Kubeflow


def _records(directory: Path, pattern: str) -> list[dict[str, Any]]:
    """Every complete JSON line of the matching files (a line being written is skipped)."""
    records = []
    for path in sorted(directory.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def fresh_cluster(kind: Kind) -> None:
    """A new kind cluster set up as the e2e tier's, each worker with one GPU, Kubeflow's operator beside
    Ebbflow's."""
    run("bash", "hack/kind/down.sh")
    set_up(kind, say=print)
    manifest = (REPO / "hack" / "fake-gpu-plugin" / "deploy.yaml").read_text()
    plugin = run("bash", "hack/fake-gpu-plugin/build-image.sh").strip().splitlines()[-1]
    one_gpu = manifest.replace("ebbflow/fake-gpu-plugin:latest", plugin).replace("replicas: 2", "replicas: 1")
    one_gpu = one_gpu.replace('value: "2"', 'value: "1"')  # FAKE_GPU_COUNT
    kind.kubectl("apply", "-f", "-", input=one_gpu)
    wait_for(lambda: kind.gpus_advertised(WORKERS, per_node=1), 300, "one GPU on every worker")
    volume, claim = example("volumes/shared-checkpoints.yaml")
    volume["metadata"]["name"] = f"ebbflow-{CLAIM}"
    claim["metadata"]["name"], claim["spec"]["volumeName"] = CLAIM, volume["metadata"]["name"]
    kind.ensure_namespace(NAMESPACE)
    kind.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=yaml.safe_dump_all([volume, claim]))
    image = run("bash", "hack/kubeflow/build-image.sh").strip().splitlines()[-1]
    load_image(image)
    run("env", f"TRAINING_OPERATOR_IMAGE={image}", "bash", "hack/kubeflow/install.sh")


def submit(kind: Kind, system: System, job: str, settings: Settings) -> float:
    """A fresh journal directory, then the job; the submission's wall time."""
    shutil.rmtree(SHARED / job, ignore_errors=True)
    (SHARED / job).mkdir(parents=True)
    (SHARED / job).chmod(0o777)  # both systems' trainers run as non-root users
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(system.manifest(job, settings)))
    return time.time()


def training_together(system: System, job: str, size: int, after: float, steps: int = 20) -> bool:
    """A world of ``size`` that started after ``after`` has completed ``steps`` steps."""
    timeline = system.timeline(job)
    worlds = {s.world for s in timeline.starts if s.time > after and s.size == size}
    return sum(1 for s in timeline.steps if s.world in worlds) >= steps


def worker_pods(kind: Kind, job: str) -> list[dict[str, Any]]:
    """The job's worker pods, whatever their phase (both systems name them <job>-worker-<i>)."""
    pods = kind.json("-n", NAMESPACE, "get", "pods")["items"]
    return [p for p in pods if p["metadata"]["name"].startswith(f"{job}-worker-")]


def worker_nodes(kind: Kind, job: str) -> dict[str, str]:
    """Running worker pods of the job and their nodes."""
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in worker_pods(kind, job)
        if p["status"].get("phase") == "Running"
    }


def evict(kind: Kind, pod: str) -> None:
    """Through the Eviction API, as a drain does: graceful, PodDisruptionBudgets respected."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": NAMESPACE},
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"
    kind.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction))


@dataclass
class Row:
    system: str
    disruption: str
    resumed_after_s: float | None
    steps_lost: int | None
    source: str | None
    size_after: int | None
    worlds_started: int
    note: str = ""


def disrupt(
    kind: Kind, system: System, job: str, label: str, action: Callable[[], None], patience: float
) -> tuple[Row, float]:
    """Apply one disruption at the same place between two checkpoints (`at_disruption_phase`) and
    wait until the job trains in a new world (or ``patience`` runs out); the row and the
    disruption's time."""
    with contextlib.suppress(TimeoutError):  # a job that does not train is disrupted as it is
        wait_for(lambda: at_disruption_phase(_last_step(system, job)), 60, f"{job} at its disruption step")
    at = time.time()
    action()

    def trained_again() -> bool:
        return (
            recovered(system, job, label, at).resumed_after_s is not None
            or system.outcome(kind, job) is not None
        )

    with contextlib.suppress(TimeoutError):
        wait_for(trained_again, patience, f"{system.name} training again after {label}")
    found = recovered(system, job, label, at)
    row = Row(system.name, label, *_figures(found))
    if found.resumed_after_s is None:
        ended = system.outcome(kind, job)
        row.note = f"the job ended ({ended}) first" if ended else f"no step within {patience:.0f} s"
    return row, at


def at_disruption_phase(step: int | None) -> bool:
    """Whether the last step trained lies where every disruption is applied (`CHECKPOINT_EVERY`)."""
    if step is None:
        return False
    return 0 <= step % CHECKPOINT_EVERY - DISRUPT_AFTER_CHECKPOINT < DISRUPT_WINDOW


def _last_step(system: System, job: str) -> int | None:
    steps = system.timeline(job).steps
    return steps[-1].step if steps else None


def recovered(system: System, job: str, label: str, at: float) -> rec.Recovery:
    return rec.recovery(system.timeline(job), label, at, time.time())


def _figures(found: rec.Recovery) -> tuple[float | None, int | None, str | None, int | None, int]:
    seconds = None if found.resumed_after_s is None else round(found.resumed_after_s, 1)
    return seconds, found.steps_lost, found.source, found.size_after, found.worlds_started


def settle(system: System, job: str, after: float, timeout: float) -> None:
    """Twenty steps in worlds started after ``after``, so that the next disruption meets a steady job."""
    timeline = system.timeline

    def steady() -> bool:
        fresh = {s.world for s in timeline(job).starts if s.time > after}
        return sum(1 for s in timeline(job).steps if s.world in fresh) >= 20

    with contextlib.suppress(TimeoutError):
        wait_for(steady, timeout, f"{job} steady")


def _index(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


def schedule(kind: Kind, system: System, job: str, patience: float) -> list[Row]:
    """Disruptions a, d, c, b in this order on the running job (module docstring)."""
    nodes = worker_nodes(kind, job)
    first = min(nodes, key=_index)
    spared = {system.rendezvous_node(kind, job), nodes[first]}
    lost = sorted(set(nodes.values()) - spared)[0]
    rows = []
    row, at = disrupt(kind, system, job, "a: worker node lost", lambda: kind.take_node_away(lost), patience)
    rows.append(row)
    settle(system, job, at, patience)
    row, at = disrupt(
        kind, system, job, "d: node joins", lambda: kind.bring_node_back(lost, gpus=1), patience
    )
    rows.append(row)
    settle(system, job, at, patience)
    victim = max(worker_nodes(kind, job), key=_index)
    row, at = disrupt(kind, system, job, "c: worker evicted", lambda: evict(kind, victim), patience)
    rows.append(row)
    settle(system, job, at, patience)
    nodes = worker_nodes(kind, job)
    node0 = nodes[min(nodes, key=_index)]
    row, at = disrupt(
        kind, system, job, "b: worker 0's node lost", lambda: kind.take_node_away(node0), patience
    )
    if row.resumed_after_s is None and system.outcome(kind, job) is None:
        kind.bring_node_back(node0, gpus=1)
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: recovered(system, job, "b", at).resumed_after_s is not None, patience, "b again")
        row = Row(system.name, row.disruption, *_figures(recovered(system, job, row.disruption, at)))
        row.note = f"no step within {patience:.0f} s; the node came back then"
    rows.append(row)
    return rows


def finish(
    kind: Kind, system: System, job: str, submitted: float, settings: Settings, out: Path
) -> dict[str, Any]:
    """Wait for the job's end (at most ``3 x patience + 20 min``); its outcome, the steps it trained, its
    duration (to the trainers' last step) and its containers' restarts; journals and logs kept."""
    deadline = 3 * settings.patience + 1200
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: system.outcome(kind, job), deadline, f"{job} to end")
    outcome = system.outcome(kind, job) or f"not ended within {deadline:.0f} s"
    timeline = system.timeline(job)
    finished = timeline.finished_at(settings.steps)
    pods = worker_pods(kind, job)
    restarts = sum(c.get("restartCount", 0) for p in pods for c in p["status"].get("containerStatuses", []))
    keep = out / job
    shutil.copytree(SHARED / job, keep, ignore=shutil.ignore_patterns("checkpoints"), dirs_exist_ok=True)
    for pod in pods:
        name = pod["metadata"]["name"]
        with contextlib.suppress(KindError):
            (keep / f"{name}.log").write_text(kind.kubectl("-n", NAMESPACE, "logs", name, "--all-containers"))
    kind.kubectl("-n", NAMESPACE, "delete", system.kind_of_object(), job, "--wait=true", timeout=300)
    wait_for(lambda: not worker_pods(kind, job), 300, f"{job}'s pods gone")
    return {
        "outcome": outcome,
        "steps": max((s.step for s in timeline.steps), default=0),
        "job_seconds": None if finished is None else round(finished - submitted, 1),
        "container_restarts": restarts,
    }


def restore_nodes(kind: Kind) -> None:
    """Every worker node back with its GPU, as the next disrupted run must find the cluster."""
    for node in sorted(set(WORKERS) - kind.node_names()):
        kind.bring_node_back(node, gpus=1)


def disrupted_run(kind: Kind, system: System, job: str, settings: Settings, out: Path) -> dict[str, Any]:
    """One job through the schedule: its rows and how it ended."""
    submitted = submit(kind, system, job, settings)
    wait_for(lambda: training_together(system, job, 3, 0, steps=50), 900, f"{job}: three training")
    rows = schedule(kind, system, job, settings.patience)
    return {
        "disrupted": finish(kind, system, job, submitted, settings, out),
        "rows": [asdict(r) for r in rows],
    }


def measure(kind: Kind, system: System, settings: Settings, out: Path) -> dict[str, Any]:
    """A calm run, then ``settings.repeats`` disrupted ones on the current cluster (its lost nodes
    back before each, and after the last: the next user of the cluster finds every node); the
    disrupted figures combined by :func:`combine`, each run's kept in ``runs``."""
    calm = f"{system.name}-calm"
    calm_result = finish(kind, system, calm, submit(kind, system, calm, settings), settings, out)
    runs = []
    for repeat in range(1, settings.repeats + 1):
        restore_nodes(kind)
        job = f"{system.name}-disrupted" + (f"-{repeat}" if repeat > 1 else "")
        runs.append(disrupted_run(kind, system, job, settings, out))
    restore_nodes(kind)
    return {"calm": calm_result, **combine(runs), "runs": runs}


def _median(values: list[Any], counts: bool = False) -> Any:
    """The median of the measured values (None when none was); for counts an observed one (the lower
    middle), so that a count stays whole."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return statistics.median_low(known) if counts else round(statistics.median(known), 1)


def _most_common(values: list[Any]) -> Any:
    """The value most runs agree on (the first run's among equals)."""
    return Counter(values).most_common(1)[0][0]


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated disrupted runs as one: per disruption the median time to train again (with its range)
    and steps lost, the category most runs agree on; the job's median duration. A disruption measured in
    fewer runs than ran says so in its note, so a median over the runs that recovered hides no failure."""
    rows = []
    for index, first in enumerate(runs[0]["rows"]):
        same = [run["rows"][index] for run in runs]
        resumed = [r["resumed_after_s"] for r in same if r["resumed_after_s"] is not None]
        notes = list(dict.fromkeys(r["note"] for r in same if r["note"]))
        if len(runs) > 1 and len(resumed) < len(runs):
            notes.insert(0, f"trained again in {len(resumed)} of {len(runs)} runs")
        rows.append(
            {
                "system": first["system"],
                "disruption": first["disruption"],
                "resumed_after_s": _median(resumed),
                "resumed_range_s": [min(resumed), max(resumed)] if resumed else None,
                "steps_lost": _median([r["steps_lost"] for r in same], counts=True),
                "source": _most_common([r["source"] for r in same]),
                "size_after": _most_common([r["size_after"] for r in same]),
                "worlds_started": _median([r["worlds_started"] for r in same], counts=True),
                "note": "; ".join(notes),
                "runs": len(same),
            }
        )
    jobs = [run["disrupted"] for run in runs]
    outcomes = Counter(job["outcome"] for job in jobs)
    disrupted = {
        "outcome": ", ".join(
            o if n == len(jobs) else f"{o} ({n} of {len(jobs)})" for o, n in outcomes.items()
        ),
        "steps": min(job["steps"] for job in jobs),
        "job_seconds": _median([job["job_seconds"] for job in jobs]),
        "container_restarts": _median([job["container_restarts"] for job in jobs], counts=True),
    }
    return {"disrupted": disrupted, "rows": rows}


def _cell(value: Any) -> str:
    return "—" if value is None else str(value)


def _resumed_cell(row: dict[str, Any]) -> str:
    """The time to train again; over repeated runs the median and its range."""
    spread = row.get("resumed_range_s")
    if row.get("runs", 1) > 1 and spread:
        return f"{row['resumed_after_s']} ({spread[0]}-{spread[1]})"
    return _cell(row["resumed_after_s"])


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per system and disruption, then the job totals."""
    lines = [
        "| system | disruption | trains again after (s) | steps lost | resumed from | world after |"
        " worlds started before training | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results.values():
        for r in result["rows"]:
            cells = [r["system"], r["disruption"], _resumed_cell(r), r["steps_lost"], r["source"]]
            cells += [r["size_after"], r["worlds_started"], r["note"]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += [
        "",
        "| system | calm job (s) | disrupted job (s) | ratio | outcome | steps trained | container"
        " restarts |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        calm, hit = result["calm"]["job_seconds"], result["disrupted"]["job_seconds"]
        ratio = round(hit / calm, 2) if calm and hit else None
        disrupted = result["disrupted"]
        cells = [
            name,
            calm,
            hit,
            ratio,
            disrupted["outcome"],
            disrupted["steps"],
            disrupted["container_restarts"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


REPEAT_TOLERANCE = 0.30  # the issue's "the same numbers within 30 % on a second run"


def _difference(first: Any, second: Any) -> tuple[str, bool]:
    """A cell of the repeatability table and whether it repeats: numbers within REPEAT_TOLERANCE of
    the first run's (equal counts repeat; a cell measured in one run only does not), anything else
    equal."""
    if isinstance(first, int | float) and isinstance(second, int | float):
        change = abs(second - first) / abs(first) if first else (0.0 if second == first else math.inf)
        return f"{first} / {second} ({change:.0%})", change <= REPEAT_TOLERANCE
    return f"{_cell(first)} / {_cell(second)}", first == second


def _kept(source: str | None) -> str | None:
    """Where training resumed from, as the repeatability check compares it: from memory or from a peer
    are both state kept without a checkpoint (which one depends on which worker the new world's rank 0
    is), so they count as the same."""
    return "memory or peer" if source in ("memory", "peer") else source


def repeatability(first: dict[str, Any], second: dict[str, Any]) -> tuple[str, list[str]]:
    """Two runs' results.json side by side: a markdown table of every figure (first / second, the
    change relative to the first) and the cells that did not repeat."""
    lines = [
        "| system | figure | first / second (change) | repeats |",
        "|---|---|---|---|",
    ]
    misses: list[str] = []

    def add(system: str, figure: str, a: Any, b: Any) -> None:
        text, repeats = _difference(a, b)
        lines.append(f"| {system} | {figure} | {text} | {'yes' if repeats else '**no**'} |")
        if not repeats:
            misses.append(f"{system}: {figure}")

    for system in [name for name in first["results"] if name in second["results"]]:
        one, two = first["results"][system], second["results"][system]
        rows = {r["disruption"]: r for r in two["rows"]}
        for row in one["rows"]:
            other = rows.get(row["disruption"], {})
            for key, label in (("resumed_after_s", "trains again after (s)"), ("steps_lost", "steps lost")):
                add(system, f"{row['disruption']}: {label}", row[key], other.get(key))
            add(system, f"{row['disruption']}: resumed from", *(_kept(r.get("source")) for r in (row, other)))
        for job in ("calm", "disrupted"):
            add(system, f"{job} job (s)", one[job]["job_seconds"], two[job]["job_seconds"])
        add(system, "outcome", one["disrupted"]["outcome"], two["disrupted"]["outcome"])
    return "\n".join(lines) + "\n", misses


def compare(first_dir: Path, second_dir: Path) -> int:
    first, second = (json.loads((d / "results.json").read_text()) for d in (first_dir, second_dir))
    text, misses = repeatability(first, second)
    print(text)
    print(f"{len(misses)} figure(s) outside {REPEAT_TOLERANCE:.0%}: {', '.join(misses) or 'none'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="ebbflow,kubeflow,kubeflow-tuned")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--vnode-seconds", type=float, default=0.05, help="simulated device time per 64 samples"
    )
    parser.add_argument(
        "--patience", type=float, default=240, help="seconds to wait for training after a disruption"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="disrupted runs per system; the table shows medians"
    )
    parser.add_argument("--compare", nargs=2, type=Path, metavar="RUN_DIR", help="two runs' folders")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    systems: dict[str, System] = {
        "ebbflow": Ebbflow(),
        "kubeflow": Kubeflow(False),
        "kubeflow-tuned": Kubeflow(True),
    }
    chosen = [systems[name] for name in args.systems.split(",")]
    settings = Settings(args.steps, args.vnode_seconds, args.patience, args.repeats)
    out = RESULTS / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True)
    kind, results, started = Kind(), {}, time.monotonic()
    for system in chosen:
        print(f"== {system.name}: fresh cluster", flush=True)
        fresh_cluster(kind)
        results[system.name] = measure(kind, system, settings, out)
        (out / "results.json").write_text(
            json.dumps({"settings": asdict(settings), "results": results}, indent=2)
        )
        print(table(results), flush=True)
    (out / "table.md").write_text(table(results))
    print(f"bench duration {time.monotonic() - started:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
