"""Micro-benchmark: one allocation decision of each policy for 100 jobs on 1,000 GPUs.

    .venv/bin/python bench/policy_speed.py [--jobs 100] [--nodes 250] [--gpus-per-node 4] [--repeat 5]

250 nodes x 4 physical GPUs advertised as 8 time-sliced replicas (2,000 replicas, 1,000 devices);
jobs min 1..4, max 8..64, three priority levels, half already running, each with 20 throughput
measurements and 30 loss reports (fits included in the timing; the throughput fit is memoised
across passes, so the first pass is reported apart). Prints and writes bench/results/policy_speed.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from ebbflow_operator.decision.allocator import Demand, Policy, PriorityFairShare
from ebbflow_operator.decision.model import JobKey
from ebbflow_operator.policies import GoodputPolicy, JobMetrics, NodeDevices, QualityPolicy
from ebbflow_operator.policies.loss_curve import LossCurve
from ebbflow_operator.policies.throughput import Measurement, Placement, ThroughputParams, fit_cached

REPO = Path(__file__).resolve().parents[1]


def _metrics(rnd: random.Random) -> JobMetrics:
    truth = ThroughputParams(
        0.005, 0.001 * rnd.uniform(0.5, 2), 0.01, 0.002, 0.05 * rnd.uniform(0.2, 5), 0.005, 2.0
    )
    shots = []
    for _ in range(20):
        k, nodes, m = rnd.choice([1, 2, 4, 8, 16]), rnd.choice([1, 2]), rnd.choice([16.0, 32.0])
        step = truth.step_s(Placement(k, nodes), m, 1) * rnd.uniform(0.98, 1.02)
        shots.append(Measurement(k, m, step, truth.compute_s(m), nodes, 1))
    curve = LossCurve(rnd.uniform(1, 10), rnd.uniform(10, 500), rnd.uniform(0, 1))
    losses = tuple((float(k), curve.loss(k) * rnd.uniform(0.99, 1.01)) for k in range(0, 3000, 100))
    return JobMetrics(
        global_batch=512, virtual_nodes=64, measurements=tuple(shots), losses=losses, rescales=1
    )


Scene = tuple[list[Demand], dict[str, int], dict[JobKey, JobMetrics], dict[str, NodeDevices]]


def _scene(jobs: int, nodes: int, per_node: int, seed: int = 0) -> Scene:
    rnd = random.Random(seed)
    names = [f"n{i:04d}" for i in range(nodes)]
    free = {n: 2 * per_node for n in names}
    devices = {n: NodeDevices(physical=per_node, replicas=2 * per_node) for n in names}
    demands: list[Demand] = []
    metrics: dict[JobKey, JobMetrics] = {}
    for i in range(jobs):
        current = tuple(rnd.choice(names) for _ in range(rnd.randint(1, 8))) if i % 2 else ()
        key = ("bench", f"job{i:03d}")
        demands.append(
            Demand(
                key,
                rnd.randint(1, 4),
                rnd.choice([8, 16, 32, 64]),
                1,
                frozenset(names),
                priority=i % 3,
                created=float(i),
                current_nodes=current,
            )
        )
        metrics[key] = _metrics(rnd)
    return demands, free, metrics, devices


def _time(policy: Policy, demands: list[Demand], free: dict[str, int], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        policy.allocate(demands, free)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    demands, free, metrics, devices = _scene(args.jobs, args.nodes, args.gpus_per_node)
    results: dict[str, object] = {"jobs": args.jobs, "gpus": args.nodes * args.gpus_per_node}
    fit_cached.cache_clear()
    policies: dict[str, Policy] = {
        "priority-fair": PriorityFairShare(),
        "goodput": GoodputPolicy(metrics, devices, now=10_000.0),
        "quality": QualityPolicy(metrics, devices, now=10_000.0),
    }
    for name, policy in policies.items():
        first = _time(policy, demands, free, 1)[0]
        rest = _time(policy, demands, free, args.repeat)
        median = statistics.median(rest)
        allocation = policy.allocate(demands, free)
        granted = sum(allocation.values())
        waiting = sum(1 for count in allocation.values() if count == 0)
        results[name] = {
            "first_s": round(first, 4),
            "median_s": round(median, 4),
            "workers": granted,
            "jobs_at_zero": waiting,
        }
        print(
            f"{name:14s} first pass {first * 1000:7.1f} ms   median of {args.repeat} {median * 1000:7.1f} ms"
            f"   {granted} workers, {waiting} jobs at 0"
        )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy_speed.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
