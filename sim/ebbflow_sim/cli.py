"""`ebbflow-sim`: flags in, one simulation per policy over the same trace and node schedule, figures out.
(`ebbflow-sim recommend ...` is the time/cost recommender: `recommend_cli.py`.)

Bad flags fail before anything runs, with a message naming the flag (exit 2, argparse's
convention). `--json` prints one JSON object per policy and line; otherwise a table. `--plot DIR`
writes the raw series as CSV (jct_<policy>.csv, utilization_<policy>.csv) and, when matplotlib is
installed, PNGs (a JCT CDF per policy, utilisation over time); without it, it says so on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .allocation import POLICIES
from .cluster import ClusterConfig, GpuType
from .simulation import Result, SimConfig, simulate, unschedulable
from .trace import SimJob, TraceConfig, generate, read_csv, write_csv

COLUMNS = (
    "policy",
    "avg_jct_s",
    "p99_jct_s",
    "makespan_s",
    "gpu_utilization",
    "preemptions",
    "rescales",
    "mean_normalized_loss_at_end",
)


def _number(kind: Callable[[str], float], low: float, high: float = float("inf")) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{raw!r} is outside [{low}, {high}]")
        return value

    return parse


def _gpu_types(raw: str) -> tuple[GpuType, ...]:
    """``NAME:SHARE:SPEED[,...]``, e.g. ``A100:0.75:1,T4:0.25:0.3``: the nodes' GPU products, the share
    of nodes with each and its true compute speed."""
    types = []
    for item in raw.split(","):
        name, _, rest = item.partition(":")
        share, _, speed = rest.partition(":")
        try:
            gpu_type = GpuType(name, float(share), float(speed))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME:SHARE:SPEED, e.g. A100:0.5:1") from None
        if not name or gpu_type.share <= 0 or gpu_type.speed <= 0:
            raise argparse.ArgumentTypeError(f"{item!r}: needs a name, a share > 0 and a speed > 0")
        types.append(gpu_type)
    return tuple(types)


def ratio_range(raw: str) -> tuple[float, float]:
    """``LOW:HIGH`` with 0 < LOW <= HIGH."""
    low, _, high = raw.partition(":")
    try:
        bounds = float(low), float(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not LOW:HIGH, e.g. 0.25:16") from None
    if not 0.0 < bounds[0] <= bounds[1] < float("inf"):
        raise argparse.ArgumentTypeError(f"{raw!r}: need 0 < LOW <= HIGH")
    return bounds


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ebbflow-sim", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--policy", action="append", choices=POLICIES, help="repeatable; default: all")
    add("--jobs", type=_number(int, 1), default=200, help="jobs the generator makes")
    add("--gpus", type=_number(int, 1), default=512, help="physical GPUs (a multiple of --gpus-per-node)")
    add("--gpus-per-node", type=_number(int, 1), default=8)
    add("--replicas", type=_number(int, 1), default=1, help="time-slicing replicas per physical GPU")
    add(
        "--gpu-types",
        type=_gpu_types,
        default=(GpuType(""),),
        help="NAME:SHARE:SPEED[,...]: the nodes' GPU products, share of nodes and true speed (default: one)",
    )
    add("--seed", type=_number(int, 0), default=0)
    add("--spot-fraction", type=_number(float, 0.0, 1.0), default=0.5)
    add("--spot-preempt-rate", type=_number(float, 0.0), default=0.05, help="per spot node-hour")
    add(
        "--replace-delay-s",
        type=_number(float, 0.0),
        default=900.0,
        help="until a preempted node is replaced",
    )
    add("--load", type=_number(float, 0.01), default=2.0, help="generator's offered load")
    add(
        "--elastic-max-factor",
        type=int,
        choices=(1, 2, 4, 8, 16, 32),
        default=1,
        help="generator: an elastic job's max is this times the size it requests (the rigid "
        "baselines' size); 1: elastic jobs can only shrink",
    )
    add(
        "--adaptive-batch-fraction",
        type=_number(float, 0.0, 1.0),
        default=0.0,
        help="generator: fraction of jobs that set maxGlobalBatchSize (goodput may change their batch)",
    )
    add(
        "--max-batch-factor",
        type=_number(int, 0),
        default=0,
        help="generator: such a job's max batch is B0 x this (a multiple of V); 0: --elastic-max-factor",
    )
    add(
        "--noise-scale-range",
        type=ratio_range,
        default=(0.25, 16.0),
        help="LOW:HIGH, generator: each job's gradient noise scale / B0, log-uniform (default 0.25:16)",
    )
    add(
        "--noise-growth",
        type=_number(float, 0.0, 4.0),
        default=1.0,
        help="generator: phi grows as loss(0) / loss to this power as a job trains (default 1; 0: constant)",
    )
    add("--rescale-pause-s", type=_number(float, 0.0), default=5.0)
    add("--restart-s", type=_number(float, 0.0), default=60.0, help="cost of a restart from checkpoint")
    add("--checkpoint-s", type=_number(float, 1.0), default=1800.0, help="checkpoint interval")
    add(
        "--preemption-notice",
        action="store_true",
        help="preemptions give notice: an elastic job losing every worker hands over a checkpoint",
    )
    add("--tick-s", type=_number(float, 1.0), default=60.0, help="periodic reallocation")
    add("--debounce-s", type=_number(float, 0.0), default=0.0, help="coalesce events into one pass")
    add("--trace", type=Path, help="CSV trace instead of the generator (see docs/simulator.md)")
    add("--write-trace", type=Path, help="write the trace used as CSV")
    add("--json", action="store_true", help="one JSON object per policy")
    add("--plot", type=Path, help="directory for plots and their CSV series")
    return p


def _jobs(args: argparse.Namespace, p: argparse.ArgumentParser) -> list[SimJob]:
    if args.trace is None:
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
        return generate(trace, args.seed)
    try:
        return read_csv(args.trace.read_text())
    except (OSError, ValueError) as error:
        p.error(f"argument --trace: {error}")
    raise AssertionError("unreachable")


def _config(args: argparse.Namespace, p: argparse.ArgumentParser) -> SimConfig:
    if args.gpus % args.gpus_per_node:
        p.error(f"argument --gpus: {args.gpus} is not a multiple of --gpus-per-node {args.gpus_per_node}")
    cluster = ClusterConfig(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        replicas=args.replicas,
        spot_fraction=args.spot_fraction,
        preempt_rate_per_hour=args.spot_preempt_rate,
        replace_delay_s=args.replace_delay_s,
        gpu_types=args.gpu_types,
    )
    return SimConfig(
        cluster=cluster,
        seed=args.seed,
        rescale_pause_s=args.rescale_pause_s,
        restart_s=args.restart_s,
        checkpoint_s=args.checkpoint_s,
        preemption_notice=args.preemption_notice,
        tick_s=args.tick_s,
        debounce_s=args.debounce_s,
    )


def run(argv: Sequence[str] | None = None) -> list[Result]:
    """Parses `argv`, runs every policy, prints; returns the results (for tests and benches)."""
    p = parser()
    args = p.parse_args(argv)
    config = _config(args, p)
    jobs = _jobs(args, p)
    if args.write_trace is not None:
        args.write_trace.write_text(write_csv(jobs))
    results = []
    for policy in args.policy or POLICIES:
        skipped = {j.name for j in unschedulable(jobs, config.cluster, policy)}
        if skipped:
            print(f"{policy}: {len(skipped)} jobs can never fit, left out", file=sys.stderr)
        results.append(simulate([j for j in jobs if j.name not in skipped], policy, config))
    _print(results, args.json)
    if args.plot is not None:
        from .plots import write_plots

        write_plots(results, args.plot)
    return results


def _print(results: Sequence[Result], as_json: bool) -> None:
    rows = [r.summary() for r in results]
    if as_json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return
    widths = [max(len(c), *(len(str(row[c])) for row in rows)) for c in COLUMNS]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))


def main(argv: Sequence[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["recommend"]:
        from .recommend_cli import run as recommend

        recommend(arguments[1:])
        return
    run(arguments)


if __name__ == "__main__":
    main()
