"""Simulator acceptance bench: every policy on 200 jobs / 512 GPUs with spot preemptions, over several seeds.

    .venv/bin/python bench/sim_policies.py [--seeds 5] [--jobs 200] [--gpus 512] [--load 2.0]
        [--elastic-max-factor 1]

Half the nodes are spot, each preempted at 0.05 per node-hour (5 % of spot nodes per hour) and
replaced after 15 minutes. Prints each policy's average JCT and mean normalised loss at the cutoff
(mean +- standard deviation across seeds) and the per-seed ratios the issue asks for:
goodput/static and goodput/restart average JCT (targets <= 0.6 and <= 0.8) and quality/fair mean
normalised loss (target < 1). Writes bench/results/sim_policies.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ebbflow_operator.sim.allocation import POLICIES
from ebbflow_operator.sim.cluster import ClusterConfig
from ebbflow_operator.sim.engine import SimConfig, simulate
from ebbflow_operator.sim.trace import TraceConfig, generate

REPO = Path(__file__).resolve().parents[1]


def one_seed(seed: int, args: argparse.Namespace) -> dict[str, dict[str, float | int | str]]:
    cluster = ClusterConfig(gpus=args.gpus, gpus_per_node=8, spot_fraction=0.5, preempt_rate_per_hour=0.05)
    config = SimConfig(cluster=cluster, seed=seed)
    trace = TraceConfig(
        jobs=args.jobs, gpus=args.gpus, load=args.load, elastic_max_factor=args.elastic_max_factor
    )
    jobs = generate(trace, seed)
    return {policy: simulate(jobs, policy, config).summary() for policy in POLICIES}


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} +- {sd:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--gpus", type=int, default=512)
    p.add_argument("--load", type=float, default=2.0)
    p.add_argument("--elastic-max-factor", type=int, default=1, help="max workers = requested x this")
    args = p.parse_args()
    started = time.perf_counter()
    runs = {}
    for seed in range(args.seeds):
        runs[seed] = one_seed(seed, args)
        print(f"seed {seed}: " + ", ".join(f"{k} {v['avg_jct_s']:.0f}s" for k, v in runs[seed].items()))

    def column(policy: str, key: str) -> list[float]:
        return [float(runs[s][policy][key]) for s in runs]

    for policy in POLICIES:
        jct, loss = column(policy, "avg_jct_s"), column(policy, "mean_normalized_loss_at_end")
        print(f"{policy:8s} avg JCT {spread(jct)} s   loss at cutoff {spread(loss)}")
    ratios = {
        "goodput/static avg JCT": [
            g / s for g, s in zip(column("goodput", "avg_jct_s"), column("static", "avg_jct_s"), strict=True)
        ],
        "goodput/restart avg JCT": [
            g / r for g, r in zip(column("goodput", "avg_jct_s"), column("restart", "avg_jct_s"), strict=True)
        ],
        "quality/fair mean normalised loss": [
            q / f
            for q, f in zip(
                column("quality", "mean_normalized_loss_at_end"),
                column("fair", "mean_normalized_loss_at_end"),
                strict=True,
            )
        ],
    }
    for name, values in ratios.items():
        print(f"{name}: {spread(values)}  (per seed: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"wall {time.perf_counter() - started:.1f} s")
    suffix = "" if args.elastic_max_factor == 1 else f"_max{args.elastic_max_factor}x"
    out = REPO / "bench" / "results" / f"sim_policies{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": runs, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
