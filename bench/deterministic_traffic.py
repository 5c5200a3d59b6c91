"""Deterministic mode's traffic and speed against fast mode, measured in the same run.

One process per worker (``--workers``, default 2), gloo on CPU, one torch thread each. For each model
and V in (4, 16, 64) with B = 4·V, each mode trains ``--steps`` timed steps after a warm-up step:

- ``fast``: each worker adds its virtual nodes' gradients in float into one float32 message,
  all-reduced in buckets while the last backward pass runs (``ebbflow_trainer.step.buckets``);
- ``exact``: deterministic mode's exact sums (``ebbflow_trainer.step.exact``): a MAX all-reduce of the grid
  agreement, then one row of int64;
- ``table``: deterministic mode's row table, one float32 row per virtual node (the only method before
  exact sums; deterministic mode still uses it while the V rows take at most ``--row-table-limit``).

The ``default`` column says which of the two deterministic methods the default limit (2 MiB) picks.

Reported per step: bytes all-reduced, seconds (median), the part not hidden behind the slowest
worker's computing (agreement, encoding, all-reduce, decoding and the optimizer step: "exchange"), samples/s,
and each mode's ratios to fast mode (``/ fast``). A JSON copy goes to
``bench/results/deterministic_traffic.json``.

    .venv/bin/python bench/deterministic_traffic.py [--workers 2] [--steps 5] [--models small,medium,large]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import ROW_TABLE_LIMIT
from ebbflow_trainer.launch.collectives import DistCollectives
from ebbflow_trainer.step.engine import VirtualNodeEngine
from engines import sgd_spec, trainer_config, worker_step
from processes import join_world, rank_parser, run_ranks
from torch.utils.data import TensorDataset

RESULTS = Path(__file__).resolve().parent / "results" / "deterministic_traffic.json"
MODES = ("fast", "exact", "table")
VIRTUAL_NODES = (4, 16, 64)
SAMPLES_PER_VIRTUAL_NODE = 4
# small: the digits example's BatchNorm MLP (4.9 k parameters); medium: 69 k; large: 3.2 M.
MODELS = {"small": (64, [64], 10), "medium": (256, [256], 10), "large": (1024, [1024, 1024], 1024)}


def _spec(name: str) -> TrainingSpec:
    inputs, hidden, classes = MODELS[name]
    layers: list[torch.nn.Module] = []
    width = inputs
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.BatchNorm1d(size), torch.nn.ReLU()]
        width = size
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))
    data = torch.Generator().manual_seed(1)
    samples = SAMPLES_PER_VIRTUAL_NODE * max(VIRTUAL_NODES)
    dataset = TensorDataset(
        torch.randn(samples, inputs, generator=data), torch.randint(0, classes, (samples,), generator=data)
    )
    return sgd_spec(model, dataset)


def _engine(model: str, virtual_nodes: int, mode: str, world_size: int) -> VirtualNodeEngine:
    torch.manual_seed(0)
    config = trainer_config(
        min_replicas=world_size,
        max_replicas=world_size,
        virtual_nodes=virtual_nodes,
        global_batch_size=SAMPLES_PER_VIRTUAL_NODE * virtual_nodes,
        mode="fast" if mode == "fast" else "deterministic",
        row_table_limit=2**62 if mode == "table" else 0,
    )
    engine = VirtualNodeEngine(_spec(model), config)
    assert engine.method == {"fast": "sum", "exact": "exact", "table": "table"}[mode]
    return engine


def _measure(model: str, virtual_nodes: int, mode: str, steps: int) -> dict[str, Any]:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    engine = _engine(model, virtual_nodes, mode, world_size)
    take_step = worker_step(engine, rank, world_size, DistCollectives(torch.device("cpu")))
    step_seconds, exchange_seconds = [], []
    for step in range(steps + 1):
        dist.barrier()
        started = time.perf_counter()
        result = take_step(step)
        done = time.perf_counter()
        if step > 0:  # the first step warms up allocations and gloo's buffers
            step_seconds.append(done - started)
            # What the slowest worker's computing did not hide: agreement, encoding, the all-reduce
            # (fast mode overlaps most of it with backward), decoding and the optimizer step.
            exchange_seconds.append(done - started - max(result.compute_seconds))
    engine.close()
    median = statistics.median(step_seconds)
    return {
        "model": model,
        "parameters": engine.num_params,
        "virtual_nodes": virtual_nodes,
        "mode": mode,
        "bytes_per_step": engine.message_bytes(world_size),
        "default": mode == ("table" if engine.table_bytes <= ROW_TABLE_LIMIT else "exact"),
        "step_seconds": median,
        "exchange_seconds": statistics.median(exchange_seconds),
        "samples_per_second": engine.config.global_batch_size / median,
    }


def _worker(rank: int, world_size: int, port: int, args: argparse.Namespace) -> None:
    join_world(rank, world_size, port)
    results = [
        _measure(model, virtual_nodes, mode, args.steps * (1 if model == "large" else 5))
        for model in args.models.split(",")
        for virtual_nodes in VIRTUAL_NODES
        for mode in MODES
    ]
    if rank == 0:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"workers": world_size, "steps": args.steps, "results": results}))
    dist.destroy_process_group()


def _table(results: list[dict[str, Any]]) -> str:
    fast = {(r["model"], r["virtual_nodes"]): r for r in results if r["mode"] == "fast"}
    lines = [
        "| model (params) | V | mode | default | MB/step | / fast | s/step | exchange s | samples/s "
        "| / fast |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = fast[(r["model"], r["virtual_nodes"])]
        lines.append(
            f"| {r['model']} ({r['parameters'] / 1e6:.3g} M) | {r['virtual_nodes']} | {r['mode']} "
            f"| {'yes' if r['default'] else ''} "
            f"| {r['bytes_per_step'] / 1e6:.3g} | {r['bytes_per_step'] / base['bytes_per_step']:.3f} "
            f"| {r['step_seconds']:.4f} | {r['exchange_seconds']:.4f} | {r['samples_per_second']:.0f} "
            f"| {r['samples_per_second'] / base['samples_per_second']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = rank_parser(__doc__.splitlines()[0], workers=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default="small,medium,large")
    args = parser.parse_args()
    if args.rank is not None:
        _worker(args.rank, args.workers, args.port, args)
        return
    arguments = ["--workers", str(args.workers), "--steps", str(args.steps), "--models", args.models]
    run_ranks(__file__, arguments, args.workers)
    report = json.loads(RESULTS.read_text())
    steps = f"median of {args.steps} steps (5x as many for small and medium)"
    print(f"{args.workers} workers, gloo on CPU, {steps}, B = 4·V")
    print(_table(report["results"]))


if __name__ == "__main__":
    main()
