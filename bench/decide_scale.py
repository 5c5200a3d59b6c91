"""The operator's pure decision pass (`decide`) at the scales of bench/operator_scale.py, without any
API: how long one pass takes, and how that grows with nodes + pods.

    .venv/bin/python bench/decide_scale.py [--scales 100x500,300x1500,1000x5000] [--passes 5]
                                          [--policy fair|goodput|quality] [--profile 1000x5000]
                                          [--state steady|starting|submitted]

The observed state is the steady phase of the operator benchmark after convergence: JOBS jobs (min 2,
max 24, 1 GPU per worker) on NODES nodes of 4 GPUs, every GPU held by a running, ready worker, each
job Running with a status that matches its pods, its rendezvous pod, Services and NetworkPolicy in
place: a pass that finds nothing to do, which is most passes (every watch event triggers one). Jobs
and nodes go through the real parsing path (ebbflow_devtools.builders). The fair policy decides by
default; goodput and quality decide with no measurements yet (their priors), as after an operator restart.
`--state starting` times the passes of a convergence instead: the same placement with every third
worker bound but not yet running, so that every job has a status to write and no plan is reused;
`--state submitted` the first passes: every job new, without a pod. A pass is `decide` and the
writes built for the plans it applies (`this_pass`, at most 500 writes), as in the operator.

Prints the median pass time per scale (without a memo: the first pass after a relist; and with the
previous pass's memo, `decide.PlanMemo`: a pass woken by an event that changed no job) and its
growth against nodes + pods (log-log slope), and with
--profile the functions that take the most cumulative time at that scale (cProfile). Writes
bench/results/decide_scale_POLICY.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools.builders import NOW, JobBuilder, make_job, make_node, make_rendezvous, make_worker
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.allocator import Policy
from ebbflow_operator.decision.decide import OperatorConfig, decide, this_pass
from ebbflow_operator.decision.model import Job, JobKey, Node, Pod
from ebbflow_operator.policies import POLICIES, policy_named
from ebbflow_operator.policies.history import node_devices

REPO = Path(__file__).resolve().parents[1]

GPUS_PER_NODE = 4
MIN, MAX = 2, 24


def _job(i: int, status: dict[str, Any]) -> Job:
    return make_job(JobBuilder(f"job-{i}").replicas(MIN, MAX), status=status)


def policy(name: str, nodes: list[Node]) -> Policy:
    return policy_named(name, {}, node_devices(nodes), NOW)


def steady_state(jobs: int, nodes: int) -> tuple[list[Node], list[Pod], list[Job]]:
    """Every GPU held: job i gets its max-min fair share of the nodes' GPUs, packed node by node,
    and the status one pass writes for that (so the next pass has nothing to write)."""
    node_list, pods, job_list = _converged(jobs, nodes)
    services, policies = children(job_list)
    result = decide(
        node_list, pods, job_list, services, policies, NOW, OperatorConfig(), policy("fair", node_list)
    )
    settled = [
        _job(i, {**job.status.to_json(), **plan.status_patch})
        for i, (job, plan) in enumerate(zip(job_list, result.plans, strict=True))
    ]
    return node_list, pods, settled


def starting_state(jobs: int, nodes: int) -> tuple[list[Node], list[Pod], list[Job]]:
    """The steady placement while the workers start: every third worker bound to its node but not
    running yet, what the passes of a convergence see (every job's ready count changes)."""
    node_list, pods, job_list = steady_state(jobs, nodes)
    starting = [
        replace(p, phase="Pending", ready=False) if p.role == contract.ROLE_WORKER and i % 3 == 0 else p
        for i, p in enumerate(pods)
    ]
    return node_list, starting, job_list


def submitted_state(jobs: int, nodes: int) -> tuple[list[Node], list[Pod], list[Job]]:
    """The jobs just submitted: no pod yet and no status, what the first passes of the steady phase
    of `operator_bench.py` see (every job's plan creates its workers; most plans wait for later passes)."""
    node_list, _, job_list = _converged(jobs, nodes)
    return node_list, [], [_job(i, {}) for i in range(len(job_list))]


STATES = {"steady": steady_state, "starting": starting_state, "submitted": submitted_state}


def _converged(jobs: int, nodes: int) -> tuple[list[Node], list[Pod], list[Job]]:
    node_list = [make_node(f"gpu-{n}", GPUS_PER_NODE) for n in range(nodes)]
    total = nodes * GPUS_PER_NODE
    shares = [min(MAX, total // jobs + (1 if i < total % jobs else 0)) for i in range(jobs)]
    job_list, pods = [], []
    slot = 0
    for i, share in enumerate(shares):
        status = {
            "phase": "Running",
            "desiredReplicas": share,
            "replicas": share,
            "readyReplicas": share,
            "observedGeneration": 1,
        }
        job = _job(i, status)
        job_list.append(job)
        for w in range(share):
            pods.append(make_worker(job, w, node=f"gpu-{slot // GPUS_PER_NODE}"))
            slot += 1
        pods.append(make_rendezvous(job, node=f"gpu-{i % nodes}"))
    return node_list, pods, job_list


def children(jobs: list[Job]) -> tuple[dict[JobKey, frozenset[str]], dict[JobKey, frozenset[str]]]:
    """Every job's Service and NetworkPolicy, as the cache holds them."""
    services = {j.key: frozenset({manifests.service_name(j.name)}) for j in jobs}
    policies = {j.key: frozenset({manifests.network_policy_name(j.name)}) for j in jobs}
    return services, policies


def time_passes(jobs: int, nodes: int, passes: int, name: str, state: str) -> dict[str, Any]:
    node_list, pods, job_list = STATES[state](jobs, nodes)
    services, policies = children(job_list)
    config = OperatorConfig()
    seconds, remembered, work = [], [], 0
    for _ in range(passes):
        started = time.perf_counter()
        result = decide(node_list, pods, job_list, services, policies, NOW, config, policy(name, node_list))
        this_pass(result.plans, config.max_writes_per_pass, config.planner.trainer_service_accounts)
        seconds.append(time.perf_counter() - started)
        work = sum(1 for p in result.plans if p.has_work)
        started = time.perf_counter()
        memo = result.memo
        decide(node_list, pods, job_list, services, policies, NOW, config, policy(name, node_list), memo)
        remembered.append(time.perf_counter() - started)
    return {
        "scale": f"{jobs}x{nodes}",
        "objects": nodes + len(pods),
        "pass_median_s": round(statistics.median(seconds), 4),
        "pass_min_s": round(min(seconds), 4),
        "memo_pass_median_s": round(statistics.median(remembered), 4),
        "jobs_with_writes": work,
    }


def profile(jobs: int, nodes: int, name: str, state: str, top: int = 25) -> str:
    node_list, pods, job_list = STATES[state](jobs, nodes)
    services, policies = children(job_list)
    profiler = cProfile.Profile()
    profiler.enable()
    config = OperatorConfig()
    result = decide(node_list, pods, job_list, services, policies, NOW, config, policy(name, node_list))
    this_pass(result.plans, config.max_writes_per_pass, config.planner.trainer_service_accounts)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scales", default="100x500,300x1500,1000x5000")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--policy", default="fair", choices=POLICIES)
    parser.add_argument("--profile", default="", help="JOBSxNODES to profile one pass of")
    parser.add_argument("--state", default="steady", choices=sorted(STATES))
    args = parser.parse_args()
    rows = []
    for scale in args.scales.split(","):
        jobs, nodes = (int(part) for part in scale.split("x"))
        rows.append(time_passes(jobs, nodes, args.passes, args.policy, args.state))
        print(json.dumps(rows[-1]), flush=True)
    found: dict[str, Any] = {"policy": args.policy, "state": args.state, "runs": rows}
    if len(rows) > 1:
        found["growth"] = round(slope([r["objects"] for r in rows], [r["pass_median_s"] for r in rows]), 2)
        print(f"growth of a pass against nodes + pods: {found['growth']} (1: linear, 2: quadratic)")
    if args.profile:
        jobs, nodes = (int(part) for part in args.profile.split("x"))
        print(profile(jobs, nodes, args.policy, args.state))
    suffix = "" if args.state == "steady" else f"_{args.state}"
    (REPO / "bench" / "results" / f"decide_scale_{args.policy}{suffix}.json").write_text(
        json.dumps(found, indent=2)
    )


if __name__ == "__main__":
    main()
