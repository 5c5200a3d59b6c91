"""Step time with background batch loading (``loader_workers``, ``prefetch``) against in-process loading.

One process drives the trainer's engine as a worker of a world of one does (``VirtualNodeEngine``:
``compute_rows``, ``pack``, ``apply``) on a dataset whose ``__getitem__`` costs ``--sample-ms`` per
sample: a sleep by default (reading and decoding from storage: the training process could do
something else meanwhile), or ``--work compute``, a busy loop that needs a core of its own. The
accelerator is modelled as on CPU elsewhere (``--simulated-vnode-seconds``): each virtual node's
forward and backward take ``--device-ms`` more than the small MLP's own CPU time, during which the
training process's CPU is idle, as it is while a GPU computes. Three configurations run in turn, round
after round, so that drift in the machine's speed hits them alike:

- ``free``: the same steps with ``__getitem__`` costing nothing: the step time without data loading;
- ``in-process``: ``loader_workers=0``: every batch is built in the training process, on the critical
  path, before its virtual node's forward pass;
- ``prefetch``: ``loader_workers=--workers`` (default 2), ``prefetch=--prefetch`` (default 2): loader
  processes forked from the worker build the next batches while the current ones train.

Each round builds a fresh spec and engine per configuration, runs ``--warmup`` steps that are not
timed (the loader processes start on the first) and times ``--steps`` steps. Reported: the median step
time of each configuration over all rounds, the ratios ``in-process / prefetch`` and
``prefetch / free`` (1.0: loading is entirely off the critical path), the same ratios round by round
(their median), and the load average before and after. A JSON copy goes to
``bench/results/data_loading.json``.

    .venv/bin/python bench/data_loading.py [--rounds 5] [--steps 20] [--sample-ms 2] [--work sleep|compute]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from ebbflow_trainer.step.engine import VirtualNodeEngine
from engines import sgd_spec, trainer_config, worker_step

RESULTS = Path(__file__).resolve().parent / "results" / "data_loading.json"
CONFIGURATIONS = ("free", "in-process", "prefetch")
FEATURES, CLASSES, SAMPLES = 64, 10, 4096


class CostlyDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed random samples; fetching one costs ``seconds`` of sleep (``work="sleep"``) or of CPU."""

    def __init__(self, seconds: float, work: str):
        generator = torch.Generator().manual_seed(0)
        self.features = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.labels = torch.randint(CLASSES, (SAMPLES,), generator=generator)
        self.seconds = seconds
        self.work = work

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seconds > 0:
            if self.work == "sleep":
                time.sleep(self.seconds)
            else:
                deadline = time.perf_counter() + self.seconds
                while time.perf_counter() < deadline:
                    pass
        return self.features[index], self.labels[index]


def make_engine(name: str, args: argparse.Namespace) -> VirtualNodeEngine:
    """A fresh model, spec and engine for one configuration, seeded alike."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, CLASSES)
    )
    background = name == "prefetch"
    spec = sgd_spec(
        model,
        CostlyDataset(0.0 if name == "free" else args.sample_ms / 1000, args.work),
        lr=0.05,
        loader_workers=args.workers if background else 0,
        prefetch=args.prefetch,
    )
    config = trainer_config(
        virtual_nodes=args.virtual_nodes,
        global_batch_size=args.virtual_nodes * args.vnode_batch,
        simulated_vnode_seconds=args.device_ms / 1000,
    )
    return VirtualNodeEngine(spec, config)


def time_steps(engine: VirtualNodeEngine, warmup: int, steps: int) -> list[float]:
    """Seconds of each timed step (after ``warmup`` untimed ones), all virtual nodes on this worker."""
    take_step = worker_step(engine)
    seconds = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        take_step(step)
        if step >= warmup:
            seconds.append(time.perf_counter() - started)
    return seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All rounds; each round times every configuration once, in turn."""
    times: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    rounds: list[dict[str, float]] = []
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        medians = {}
        for name in CONFIGURATIONS:
            engine = make_engine(name, args)
            try:
                seconds = time_steps(engine, args.warmup, args.steps)
            finally:
                engine.close()
            times[name] += seconds
            medians[name] = statistics.median(seconds)
        rounds.append(medians)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "settings": vars(args),
        "median_step_seconds": medians,
        "in_process_over_prefetch": medians["in-process"] / medians["prefetch"],
        "prefetch_over_free": medians["prefetch"] / medians["free"],
        "per_round_in_process_over_prefetch": statistics.median(
            r["in-process"] / r["prefetch"] for r in rounds
        ),
        "per_round_prefetch_over_free": statistics.median(r["prefetch"] / r["free"] for r in rounds),
        "rounds": rounds,
    }


def report(result: dict[str, Any]) -> str:
    """The figures as the Markdown table bench/README.md quotes."""
    args = result["settings"]
    load_ms = args["sample_ms"] * args["vnode_batch"] * args["virtual_nodes"]
    lines = [
        f"{result['date']}, {result['machine']}, load average {result['load_average_before']} before, "
        f"{result['load_average_after']} after; V={args['virtual_nodes']}, {args['vnode_batch']} samples "
        f"per virtual node, {args['sample_ms']} ms per sample ({args['work']}): {load_ms:g} ms of loading "
        f"per step; {args['device_ms']} ms device time per virtual node; {args['rounds']} rounds of "
        f"{args['steps']} steps",
        "",
        "| configuration | median step (ms) |",
        "| --- | ---: |",
    ]
    for name in CONFIGURATIONS:
        lines.append(f"| {name} | {1000 * result['median_step_seconds'][name]:.1f} |")
    lines += [
        "",
        f"in-process / prefetch: {result['in_process_over_prefetch']:.2f}x "
        f"(per round, median: {result['per_round_in_process_over_prefetch']:.2f}x); "
        f"prefetch / free: {result['prefetch_over_free']:.2f} "
        f"(per round: {result['per_round_prefetch_over_free']:.2f})",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (loader start-up)")
    parser.add_argument("--sample-ms", type=float, default=2.0, help="cost of one __getitem__")
    parser.add_argument("--work", choices=("sleep", "compute"), default="sleep")
    parser.add_argument("--virtual-nodes", type=int, default=4)
    parser.add_argument("--vnode-batch", type=int, default=8, help="samples per virtual node")
    parser.add_argument("--device-ms", type=float, default=12.0, help="simulated accelerator time per vnode")
    parser.add_argument("--workers", type=int, default=2, help="loader_workers of the prefetch run")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # as every worker does (run_worker)
    output = args.output
    args.output = str(output)
    result = run(args)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))


if __name__ == "__main__":
    main()
