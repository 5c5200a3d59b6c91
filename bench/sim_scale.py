"""Simulator scale bench: wall time of one policy's run at 10,000 jobs on 4,096 GPUs (target < 5 min).

    .venv/bin/python bench/sim_scale.py [--jobs 10000] [--gpus 4096] [--policy fair ...] [--profile]

Same cluster shape as sim_policies.py (8 GPUs per node, half spot, 0.05 preemptions per spot
node-hour). Prints per policy the wall time, the process's CPU time (on a shared machine the wall
time is inflated by contention, the CPU time much less), the 1-minute load average before and after,
the passes (`decide()` calls) and the seconds per pass, and whether the simulator's native build
ran (`make sim-native`, then `PYTHONPATH=build/sim-native` before this command: the same modules
compiled with mypyc, checked to decide exactly as the source does);
`--profile` prints the top functions by cumulative time. Writes bench/results/sim_scale.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

from ebbflow_operator import policies
from ebbflow_sim.allocation import POLICIES
from ebbflow_sim.cluster import ClusterConfig
from ebbflow_sim.simulation import SimConfig, Simulation
from ebbflow_sim.trace import TraceConfig, generate

REPO = Path(__file__).resolve().parents[1]


def run(policy: str, args: argparse.Namespace) -> dict[str, float | int | str]:
    cluster = ClusterConfig(gpus=args.gpus, gpus_per_node=8, spot_fraction=0.5, preempt_rate_per_hour=0.05)
    config = SimConfig(cluster=cluster, seed=args.seed, tick_s=args.tick_s, debounce_s=args.debounce_s)
    jobs = generate(TraceConfig(jobs=args.jobs, gpus=args.gpus, load=args.load), args.seed)
    sim = Simulation(jobs, policy, config)
    load_before = _load()
    started, cpu_started = time.perf_counter(), time.process_time()
    if args.profile:
        profile = cProfile.Profile()
        result = profile.runcall(sim.run)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(18)
    else:
        result = sim.run()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        **result.summary(),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "load_1min_before_after": [load_before, _load()],
        "passes": sim.passes,
        "native": policies.__file__ is not None and not policies.__file__.endswith(".py"),
        "s_per_pass": round(wall / max(1, sim.passes), 4),
    }


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--gpus", type=int, default=4096)
    p.add_argument("--load", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-s", type=float, default=60.0)
    p.add_argument("--debounce-s", type=float, default=0.0)
    p.add_argument("--policy", action="append", choices=POLICIES)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    results = {}
    for policy in args.policy or POLICIES:
        results[policy] = run(policy, args)
        print(json.dumps(results[policy]), flush=True)
    out = REPO / "bench" / "results" / "sim_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
