"""The simulator against the real operator: one small trace replayed both ways, per policy.

A trace of --jobs jobs (ebbflow_sim.trace.generate: 1-8 GPUs asked for, up to twice that as max,
two priorities, durations of minutes) arrives on --nodes KWOK nodes of 4 GPUs; --losses of the spot
nodes are preempted at scripted times and replaced --replace-delay seconds later. Per policy it runs
- through ebbflow-sim, its cluster model set to this run's: the operator's resync interval as its
  tick, the stand-ins' rescale pause and restart cost, the same nodes, losses and replacements;
- through the real operator (`--policy`) on the local control plane, each job's trainers played by
  bench/fidelity_standins.py with the simulator's true models.
Per job: its completion time both ways and the simulator's error (sim / operator - 1); per policy:
the average JCT both ways and its error. Targets (issue 48): average within 10 %, each job within 25 %.

    .venv/bin/python bench/sim_fidelity.py [--policies fair,goodput,quality] [--jobs 30] [--nodes 8]
                                           [--output bench/results/sim_fidelity.json]
                                           [--operated EARLIER.json]

`--operated` takes the operator's side from an earlier run's output (same trace flags) and runs only
the simulator: a change of the simulator's model is compared with the same operator runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from ebbflow_api import contract, crd
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.controlplane import running_control_plane
from ebbflow_devtools.gpunodes import GpuNodeTemplate, node_is_ready, preempt_node
from ebbflow_devtools.ports import free_port
from ebbflow_devtools.waiting import wait_for
from ebbflow_sim.cluster import ClusterConfig, initial_nodes, replacement
from ebbflow_sim.simulation import SimConfig, Simulation
from ebbflow_sim.trace import SimJob, TraceConfig, generate
from fidelity_standins import StandIns
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, GROUP_LABEL = "fidelity", "ebbflow.dev/fidelity"
GPUS_PER_NODE = 4
MAX_ASKED_GPUS = 8  # the trace's largest request (its generator caps sizes at its `gpus`)
TICK_S = 0.5  # the stand-ins' and the driver's loop


@dataclass(frozen=True)
class Setup:
    nodes: int
    spot: int  # the first `spot` nodes are spot (ebbflow_sim.cluster.initial_nodes)
    losses: tuple[tuple[float, str], ...]  # (seconds after the start, node)
    replace_delay_s: float
    pause_s: float
    restart_s: float
    resync_s: float

    @property
    def cluster(self) -> ClusterConfig:
        return ClusterConfig(
            gpus=self.nodes * GPUS_PER_NODE,
            gpus_per_node=GPUS_PER_NODE,
            replicas=1,
            spot_fraction=self.spot / self.nodes,
            preempt_rate_per_hour=0.0,  # the losses are scripted, the same both ways
            replace_delay_s=self.replace_delay_s,
        )


def make_trace(args: argparse.Namespace) -> list[SimJob]:
    """The generator sizes jobs up to its `gpus`: MAX_ASKED_GPUS, with the load scaled to the cluster."""
    cluster_gpus = args.nodes * GPUS_PER_NODE
    trace = TraceConfig(
        jobs=args.jobs,
        gpus=MAX_ASKED_GPUS,
        load=args.load * cluster_gpus / MAX_ASKED_GPUS,
        median_duration_s=args.median_duration,
        duration_sigma=0.6,
        min_duration_s=20.0,
        max_duration_s=6 * args.median_duration,
        elastic_max_factor=2,
        priorities=2,
    )
    return [replace(job, name=f"j{job.name[-3:]}") for job in generate(trace, args.seed)]


def make_setup(args: argparse.Namespace, jobs: list[SimJob]) -> Setup:
    window = max(job.arrival_s for job in jobs)
    spot = sorted(
        initial_nodes(
            ClusterConfig(gpus=args.nodes * GPUS_PER_NODE, spot_fraction=0.5, gpus_per_node=GPUS_PER_NODE)
        ).items()
    )
    spot_nodes = [name for name, is_spot in spot if is_spot]
    losses = tuple(
        (round(window * (i + 1) / (args.losses + 1), 1), spot_nodes[i % len(spot_nodes)])
        for i in range(args.losses)
    )
    return Setup(
        args.nodes, len(spot_nodes), losses, args.replace_delay, args.pause, args.restart, args.resync
    )


def simulate(jobs: list[SimJob], policy: str, setup: Setup) -> dict[str, Simulated]:
    sim_config = SimConfig(
        cluster=setup.cluster,
        rescale_pause_s=setup.pause_s,
        restart_s=setup.restart_s,
        checkpoint_s=0.0,
        preemption_notice=True,  # the losses evict the pods with their grace: the trainers hand over
        tick_s=setup.resync_s,
        debounce_s=0.0,
    )
    simulation = Simulation(jobs, policy, sim_config)
    for at, node in setup.losses:
        simulation.preempt_at(at, node)
    simulation.run()
    return {
        name: Simulated(
            state.finished_s - state.job.arrival_s, state.started_s - state.job.arrival_s, state.rescales
        )
        for name, state in simulation.states.items()
        if state.finished_s is not None and state.started_s is not None
    }


@dataclass(frozen=True)
class Simulated:
    """One job as the simulator ran it: completion and first start after its arrival, rescales."""

    jct_s: float
    started_s: float
    rescales: int


class Cluster:
    """The local control plane's API, as the operator run uses it."""

    def __init__(self, kubeconfig: Path) -> None:
        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.apiext = client.ApiextensionsV1Api(api)

    def install(self) -> None:
        manifest = yaml.safe_load((REPO / crd.CRD_FILE).read_text())
        self.apiext.create_custom_resource_definition(manifest)
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})

        def ready() -> bool:
            crd_now = self.apiext.read_custom_resource_definition(manifest["metadata"]["name"])
            established = any(
                c.type == "Established" and c.status == "True" for c in crd_now.status.conditions or []
            )
            return established and bool(self.core.list_namespaced_service_account(NAMESPACE).items)

        wait_for(ready, 60, "the CRD established and the namespace's ServiceAccount")

    def add_node(self, name: str, spot: bool) -> None:
        labels = {GROUP_LABEL: "yes"}
        template = GpuNodeTemplate(gpus=GPUS_PER_NODE, time_slicing_replicas=1, spot=spot, labels=labels)
        self.core.create_node(template.manifest(name))

    def submit(self, job: SimJob) -> None:
        manifest = (
            JobBuilder(job.name, NAMESPACE)
            .replicas(job.min_workers, job.max_workers)
            .gpus(job.gpus_per_worker)
            .set(virtualNodes=job.virtual_nodes, globalBatchSize=job.global_batch, leaveGraceSeconds=5)
            .priority(job.priority)
            .node_selector({GROUP_LABEL: "yes"})
            .image("ebbflow/trainer:fidelity")
            .obj()
        )
        self.custom.create_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, NAMESPACE, contract.PLURAL, manifest
        )

    def pods(self) -> list[dict[str, Any]]:
        answer = self.core.list_namespaced_pod(NAMESPACE, _preload_content=False)
        return list(json.loads(answer.data)["items"])

    def annotate(self, pod: str, annotations: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_pod(pod, NAMESPACE, {"metadata": {"annotations": annotations}})
        except client.ApiException as error:
            if error.status != 404:  # a pod deleted under the stand-in: the next tick sees it gone
                raise


def start_operator(
    kubeconfig: Path, port: int, policy: str, resync_s: float, log: Path
) -> subprocess.Popen[bytes]:
    command = [
        *(sys.executable, "-m", "ebbflow_operator", "--namespace", NAMESPACE, "--policy", policy),
        *("--node-selector", f"{GROUP_LABEL}=yes", "--resync-interval", str(resync_s)),
        *("--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--health-port", "0"),
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


class Losses:
    """The scripted node losses and replacements, each run on a thread of its own when due (a
    preemption waits for the node's pods to be evicted)."""

    def __init__(self, cluster: Cluster, setup: Setup) -> None:
        self.cluster = cluster
        self.due = sorted(
            [(at, "lose", node) for at, node in setup.losses]
            + [(at + setup.replace_delay_s, "replace", replacement(node)) for at, node in setup.losses]
        )
        self.threads: list[threading.Thread] = []

    def run_due(self, now: float) -> None:
        while self.due and self.due[0][0] <= now:
            _, what, node = self.due.pop(0)
            if what == "lose":
                work = threading.Thread(target=preempt_node, args=(self.cluster.core, node), daemon=True)
            else:
                work = threading.Thread(target=self.cluster.add_node, args=(node, True), daemon=True)
            work.start()
            self.threads.append(work)


def operate(
    jobs: list[SimJob], policy: str, setup: Setup, deadline_s: float, results: Path
) -> dict[str, Any]:
    """The trace through the real operator; each job's completion time, and the run's facts."""
    with running_control_plane() as plane:
        cluster = Cluster(plane.kubeconfig)
        cluster.install()
        nodes = initial_nodes(setup.cluster)
        for name, spot in nodes.items():
            cluster.add_node(name, spot)
        wait_for(lambda: all(node_is_ready(cluster.core, n) for n in nodes), 120, "the nodes Ready")
        port = free_port()
        log = results / f"sim_fidelity-{policy}-operator.log"
        operator = start_operator(plane.kubeconfig, port, policy, setup.resync_s, log)
        try:
            return _replay(cluster, jobs, setup, deadline_s)
        finally:
            operator.terminate()
            operator.wait(30)


def _replay(cluster: Cluster, jobs: list[SimJob], setup: Setup, deadline_s: float) -> dict[str, Any]:
    stand_ins = StandIns(jobs, cluster.annotate, setup.pause_s, setup.restart_s)
    losses = Losses(cluster, setup)
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    started = time.monotonic()
    late: list[float] = []  # how late each tick ran (a loaded machine's stand-ins fall behind)
    while len(stand_ins.finished()) < len(jobs):
        now = time.monotonic() - started
        if now > deadline_s:
            break
        while arrivals and arrivals[0].arrival_s <= now:
            cluster.submit(arrivals.pop(0))
        losses.run_due(now)
        stand_ins.tick(now, cluster.pods())
        pause = TICK_S - (time.monotonic() - started - now)
        late.append(max(0.0, -pause))
        time.sleep(max(0.0, pause))
    return {
        "jct_s": stand_ins.finished(),
        "timelines": {name: s.timeline for name, s in stand_ins.states.items()},
        "rescales": sum(s.rescales for s in stand_ins.states.values()),
        "ticks_late_p95_s": sorted(late)[int(0.95 * (len(late) - 1))] if late else 0.0,
    }


def operated_before(report: dict[str, Any]) -> dict[str, Any]:
    """One policy's operator side as `operate` returned it, rebuilt from an earlier run's output."""
    jobs = report["per_job"]
    return {
        "jct_s": {name: job["operator_s"] for name, job in jobs.items()},
        "timelines": {name: job["operator_workers"] for name, job in jobs.items()},
        "rescales": report["rescales"]["operator"],
        "ticks_late_p95_s": report["ticks_late_p95_s"],
    }


def compare(jobs: list[SimJob], sim: dict[str, Simulated], operated: dict[str, Any]) -> dict[str, Any]:
    """Per job (both finished) sim / operator - 1, with the operator's worker timeline and the
    simulator's first start and rescales beside it; the averages over the jobs both finished."""
    simulated = {name: run.jct_s for name, run in sim.items()}
    finished, timelines = operated["jct_s"], operated["timelines"]
    both = [j.name for j in jobs if j.name in simulated and j.name in finished]
    errors = {name: simulated[name] / finished[name] - 1.0 for name in both}
    worst: float | None = max(errors.values(), key=abs) if errors else None
    sim_avg = statistics.mean(simulated[n] for n in both) if both else float("nan")
    op_avg = statistics.mean(finished[n] for n in both) if both else float("nan")
    return {
        "jobs_compared": len(both),
        "unfinished": {"sim": len(jobs) - len(simulated), "operator": len(jobs) - len(finished)},
        "rescales": {"sim": sum(run.rescales for run in sim.values()), "operator": operated["rescales"]},
        "avg_jct_s": {"sim": round(sim_avg, 1), "operator": round(op_avg, 1)},
        "avg_error": round(sim_avg / op_avg - 1.0, 3) if both else None,
        "jobs_within_25_percent": sum(abs(e) <= 0.25 for e in errors.values()),
        "worst_job_error": None if worst is None else round(worst, 3),
        "per_job": {
            n: {
                "sim_s": round(simulated[n], 1),
                "operator_s": round(finished[n], 1),
                "error": round(e, 3),
                "sim_started_s": round(sim[n].started_s, 1),
                "sim_rescales": sim[n].rescales,
                "operator_workers": timelines[n],
            }
            for n, e in errors.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fair,goodput,quality")
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--load", type=float, default=1.5, help="offered load over the arrival window")
    parser.add_argument("--median-duration", type=float, default=60.0, help="seconds, at the asked size")
    parser.add_argument("--losses", type=int, default=3)
    parser.add_argument("--replace-delay", type=float, default=60.0)
    parser.add_argument(
        "--pause", type=float, default=2.8, help="rescale pause (the trainer's graceful leave)"
    )
    parser.add_argument("--restart", type=float, default=12.0, help="start after every worker was lost")
    parser.add_argument("--resync", type=float, default=5.0, help="the operator's resync interval")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds per operator run")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "sim_fidelity.json")
    parser.add_argument("--operated", type=Path, help="an earlier output: its operator runs, not new ones")
    args = parser.parse_args()
    earlier = json.loads(args.operated.read_text()) if args.operated else None
    jobs = make_trace(args)
    setup = make_setup(args, jobs)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    paths = {"output": str(args.output), "operated": str(args.operated or "")}
    report: dict[str, Any] = {"setup": {**vars(args), **paths}, "losses": setup.losses}
    for policy in args.policies.split(","):
        simulated = simulate(jobs, policy, setup)
        if earlier is not None:
            operated = operated_before(earlier[policy])
        else:
            operated = operate(jobs, policy, setup, args.deadline, args.output.parent)
        report[policy] = {
            **compare(jobs, simulated, operated),
            "ticks_late_p95_s": operated["ticks_late_p95_s"],
        }
        print(json.dumps({policy: {k: v for k, v in report[policy].items() if k != "per_job"}}), flush=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
