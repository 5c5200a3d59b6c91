"""Fast mode against PyTorch DDP on the same model, per-process batch and processes, in one run.

``--workers`` processes (default 4), gloo on CPU, one torch thread each; every process trains the same
MLP (``--depth`` layers of ``--width``, float32) on its ``--batch`` samples per step, split into
``--per-worker`` virtual nodes. Three ways to train, each ``--steps`` timed steps after a warm-up, in
``--rounds`` rounds (the order rotates every round, so machine noise falls on every configuration):

- ``ddp``: ``DistributedDataParallel`` (bucket_cap_mb 25) with a ``DistributedSampler`` DataLoader;
  with several virtual nodes per worker, one micro-batch each and ``no_sync`` on all but the last;
- ``ebbflow``: ``VirtualNodeEngine`` in fast mode, as a worker drives it (``reduce_step``, ``apply``),
  its buckets reduced while the last virtual node's backward runs;
- ``flat``: the same steps with one all-reduce of every gradient after the backward pass (no overlap,
  what fast mode did before its buckets), as the lower reference.

Reported: samples/s per configuration (median over rounds) and, pair by pair in each round, the
ratio to ``ddp`` (median, min-max). A JSON copy goes to ``bench/results/fast_vs_ddp.json``.

    .venv/bin/python bench/fast_vs_ddp.py [--workers 4] [--per-worker 1] [--rounds 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ebbflow_trainer.launch.collectives import DistCollectives
from ebbflow_trainer.step.engine import StepResult, VirtualNodeEngine
from engines import sgd, sgd_spec, trainer_config, worker_step
from processes import join_world, rank_parser, run_ranks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

RESULTS = Path(__file__).resolve().parent / "results" / "fast_vs_ddp.json"
CONFIGURATIONS = ("ddp", "ebbflow", "flat")
FEATURES, CLASSES = 256, 1000


def _model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, args.width), torch.nn.ReLU()]
    for _ in range(args.depth - 2):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, CLASSES))


def _dataset(args: argparse.Namespace, world_size: int) -> TensorDataset:
    data = torch.Generator().manual_seed(1)
    samples = world_size * args.batch * 4
    return TensorDataset(
        torch.randn(samples, FEATURES, generator=data), torch.randint(0, CLASSES, (samples,), generator=data)
    )


def _micro_batches(args: argparse.Namespace) -> Iterator[list[torch.Tensor]]:
    """This rank's micro-batches, endlessly, as DDP's ``DistributedSampler`` deals them (the baselines)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = _dataset(args, world_size)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch // args.per_worker, sampler=sampler)
    return itertools.chain.from_iterable(itertools.repeat(loader))


def _ddp_steps(args: argparse.Namespace) -> Callable[[int], None]:
    model = DistributedDataParallel(_model(args), bucket_cap_mb=25)
    optimizer = sgd(model.parameters())
    batches = _micro_batches(args)

    def step(_: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        for position in range(args.per_worker):
            features, labels = next(batches)
            last = position == args.per_worker - 1
            with model.no_sync() if not last else _nothing():
                F.cross_entropy(model(features), labels).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def _ebbflow_steps(args: argparse.Namespace) -> Callable[[int], StepResult]:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    config = trainer_config(
        min_replicas=world_size,
        max_replicas=world_size,
        virtual_nodes=world_size * args.per_worker,
        global_batch_size=world_size * args.batch,
        mode="fast",
    )
    engine = VirtualNodeEngine(sgd_spec(_model(args), _dataset(args, world_size)), config)
    return worker_step(engine, rank, world_size, DistCollectives(torch.device("cpu")))


def _flat_steps(args: argparse.Namespace) -> Callable[[int], None]:
    world_size = dist.get_world_size()
    model = _model(args)
    params = list(model.parameters())
    optimizer = sgd(params)
    batches = _micro_batches(args)

    def step(_: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.per_worker):
            features, labels = next(batches)
            F.cross_entropy(model(features), labels).backward()  # type: ignore[no-untyped-call]
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        dist.all_reduce(flat)
        flat /= world_size * args.per_worker
        offset = 0
        for p in params:
            assert p.grad is not None
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()

    return step


BUILDERS = {"ddp": _ddp_steps, "ebbflow": _ebbflow_steps, "flat": _flat_steps}


def _samples_per_second(name: str, args: argparse.Namespace) -> float:
    step = BUILDERS[name](args)
    for number in range(args.warmup):
        step(number)
    dist.barrier()
    started = time.perf_counter()
    for number in range(args.warmup, args.warmup + args.steps):
        step(number)
    dist.barrier()
    return dist.get_world_size() * args.batch * args.steps / (time.perf_counter() - started)


def _worker(rank: int, args: argparse.Namespace) -> None:
    join_world(rank, args.workers, args.port)
    rounds = []
    for number in range(args.rounds):
        order = CONFIGURATIONS[number % 3 :] + CONFIGURATIONS[: number % 3]
        rounds.append({name: _samples_per_second(name, args) for name in order})
    if rank == 0:
        RESULTS.parent.mkdir(exist_ok=True)
        parameters = sum(p.numel() for p in _model(args).parameters())
        settings = {k: v for k, v in vars(args).items() if k not in ("rank", "port")}
        RESULTS.write_text(json.dumps({"settings": settings, "parameters": parameters, "rounds": rounds}))
    dist.destroy_process_group()


def _report(report: dict[str, Any]) -> str:
    rounds, settings = report["rounds"], report["settings"]
    lines = [
        f"{settings['workers']} workers, gloo on CPU, MLP of {report['parameters'] / 1e6:.2f} M parameters, "
        f"{settings['batch']} samples per worker in {settings['per_worker']} virtual node(s), "
        f"{settings['rounds']} rounds of {settings['steps']} steps",
        "| configuration | samples/s (median) | / ddp, pair by pair: median (min-max) |",
        "|---|---|---|",
    ]
    for name in CONFIGURATIONS:
        rates = [r[name] for r in rounds]
        ratios = [r[name] / r["ddp"] for r in rounds]
        lines.append(
            f"| {name} | {statistics.median(rates):.0f} | {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = rank_parser(__doc__.splitlines()[0], workers=4)
    parser.add_argument("--per-worker", type=int, default=1, help="virtual nodes (micro-batches) per worker")
    parser.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.batch % args.per_worker:
        parser.error("--batch must be a multiple of --per-worker")
    if args.rank is not None:
        _worker(args.rank, args)
        return
    forwarded = ["--workers", str(args.workers), "--per-worker", str(args.per_worker)]
    forwarded += ["--batch", str(args.batch), "--width", str(args.width), "--depth", str(args.depth)]
    forwarded += ["--rounds", str(args.rounds), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    run_ranks(__file__, forwarded, args.workers)
    print(_report(json.loads(RESULTS.read_text())))


if __name__ == "__main__":
    main()
