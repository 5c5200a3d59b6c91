"""Simulator acceptance bench: every policy on 200 jobs / 512 GPUs with spot preemptions, over several seeds.

    .venv/bin/python bench/sim_policies.py [--seeds 5] [--jobs 200] [--gpus 512] [--load 2.0]
        [--elastic-max-factor 1] [--adaptive-batch-fraction 0] [--max-batch-factor 0]
        [--noise-scale-range 0.25:16] [--noise-growth 1] [--policy P ...]

Half the nodes are spot, each preempted at 0.05 per node-hour (5 % of spot nodes per hour) and
replaced after 15 minutes. Prints each policy's average JCT and mean normalised loss at the cutoff
(mean +- standard deviation across seeds) and the per-seed ratios the issue asks for:
goodput/static and goodput/restart average JCT (targets <= 0.6 and <= 0.8) and quality/fair mean
normalised loss (target < 1), for the policies run (`--policy`, repeatable; default all). Prints
the 1-minute load average before and after (the machine may be shared). Writes
bench/results/sim_policies[_maxFx][_abF_mbM_phiLO-HI_growthG].json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ebbflow_sim.allocation import POLICIES
from ebbflow_sim.cli import ratio_range
from ebbflow_sim.cluster import ClusterConfig
from ebbflow_sim.simulation import SimConfig, simulate
from ebbflow_sim.trace import TraceConfig, generate

REPO = Path(__file__).resolve().parents[1]


def one_seed(seed: int, args: argparse.Namespace) -> dict[str, dict[str, float | int | str]]:
    cluster = ClusterConfig(gpus=args.gpus, gpus_per_node=8, spot_fraction=0.5, preempt_rate_per_hour=0.05)
    config = SimConfig(cluster=cluster, seed=seed)
    trace = TraceConfig(
        jobs=args.jobs,
        gpus=args.gpus,
        load=args.load,
        elastic_max_factor=args.elastic_max_factor,
        adaptive_batch_fraction=args.adaptive_batch_fraction,
        max_batch_factor=args.max_batch_factor,
        noise_ratio=args.noise_scale_range,
        noise_growth=args.noise_growth,
    )
    jobs = generate(trace, seed)
    return {policy: simulate(jobs, policy, config).summary() for policy in args.policy or POLICIES}


def _suffix(args: argparse.Namespace) -> str:
    """The results file's name beyond `sim_policies` (none for the default configuration)."""
    suffix = "" if args.elastic_max_factor == 1 else f"_max{args.elastic_max_factor}x"
    if args.adaptive_batch_fraction > 0:
        low, high = args.noise_scale_range
        suffix += f"_ab{args.adaptive_batch_fraction:g}_mb{args.max_batch_factor}_phi{low:g}-{high:g}"
        suffix += f"_growth{args.noise_growth:g}"
    return suffix


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
    p.add_argument("--adaptive-batch-fraction", type=float, default=0.0, help="jobs with maxGlobalBatchSize")
    p.add_argument("--max-batch-factor", type=int, default=0, help="their max B = B0 x this (0: max factor)")
    p.add_argument("--noise-scale-range", type=ratio_range, default=(0.25, 16.0), help="phi / B0, LOW:HIGH")
    p.add_argument("--noise-growth", type=float, default=1.0, help="phi grows as (loss(0) / loss) ** this")
    p.add_argument("--policy", action="append", choices=POLICIES, help="repeatable; default: all")
    args = p.parse_args()
    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}")
    started = time.perf_counter()
    runs = {}
    for seed in range(args.seeds):
        runs[seed] = one_seed(seed, args)
        print(f"seed {seed}: " + ", ".join(f"{k} {v['avg_jct_s']:.0f}s" for k, v in runs[seed].items()))

    def column(policy: str, key: str) -> list[float]:
        return [float(runs[s][policy][key]) for s in runs]

    ran = args.policy or POLICIES
    for policy in ran:
        jct, loss = column(policy, "avg_jct_s"), column(policy, "mean_normalized_loss_at_end")
        print(f"{policy:8s} avg JCT {spread(jct)} s   loss at cutoff {spread(loss)}")
    ratios = {}
    for name, top, bottom, key in (
        ("goodput/static avg JCT", "goodput", "static", "avg_jct_s"),
        ("goodput/restart avg JCT", "goodput", "restart", "avg_jct_s"),
        ("quality/fair mean normalised loss", "quality", "fair", "mean_normalized_loss_at_end"),
    ):
        if top in ran and bottom in ran:
            ratios[name] = [t / b for t, b in zip(column(top, key), column(bottom, key), strict=True)]
    for name, values in ratios.items():
        print(f"{name}: {spread(values)}  (per seed: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"wall {time.perf_counter() - started:.1f} s")
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    out = REPO / "bench" / "results" / f"sim_policies{_suffix(args)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": runs, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
