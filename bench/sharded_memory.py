"""What sharding saves per worker, and what it costs per step: the replicated engine against the sharded
one (``TrainingSpec.sharding="fsdp"``) on the same causal transformer LM, worlds of 1 to ``--workers``.

Every rank of a world of N (gloo on CPU, one torch thread) builds the model (``--width``,
``--layers`` transformer blocks, vocabulary ``--vocab``) with AdamW, trains ``--steps`` fast-mode
steps of V = 12 virtual nodes (B = 48 sequences of 64 tokens) in each engine, and counts the bytes of
the live tensors it holds after a step: parameters, the step's gradient (the replicated engine's
reduced message, the sharded engine's gradient pieces) and the optimizer state (AdamW's two moments),
its own pieces only when sharded. Also timed: the median step, sharded against replicated in the
same world (both engines run in the same processes, one after the other), and the sharded engine's
buddy copy after each step (``TrainingSpec.buddy_every=1``: each rank's shard serialized, swapped
with its buddies, kept), with the bytes of the copies a rank keeps; and the baseline without
elasticity, plain FSDP2 (each rank's B/N sequences in one pass, the optimizer built over the
sharded parameters), whose step the sharded engine's is reported against, in both of its gathers
(``shard_gather``: every pass, or once per step). And a durable checkpoint written whole (gathered)
against one written in pieces (``launch/durable.py``), in a temporary folder.

Reported per world size: MiB per worker for each part, the sharded/replicated ratio of the total,
and the step-time ratio. A JSON copy goes to ``bench/results/sharded_memory.json``.

    .venv/bin/python bench/sharded_memory.py [--workers 4] [--width 512] [--layers 4] [--steps 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.collectives import DistCollectives
from ebbflow_trainer.launch.durable import DurableCheckpoints
from ebbflow_trainer.launch.journal import Journal
from ebbflow_trainer.launch.shard_copies import ShardCopies
from ebbflow_trainer.sharding import even_counts, ranges_from_counts
from ebbflow_trainer.step.engine import VirtualNodeEngine
from ebbflow_trainer.step.fsdp import ShardedEngine
from engines import trainer_config, worker_step
from processes import join_world, rank_parser, run_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset

RESULTS = Path(__file__).resolve().parent / "results" / "sharded_memory.json"
V, B, CONTEXT = 12, 48, 64
MIB = 1 << 20


class LM(torch.nn.Module):
    def __init__(self, args: argparse.Namespace):
        super().__init__()
        self.embed = torch.nn.Embedding(args.vocab, args.width)
        layer = torch.nn.TransformerEncoderLayer(
            args.width, 8, dim_feedforward=4 * args.width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(args.width, args.vocab)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(CONTEXT)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.embed(tokens), mask=self.mask, is_causal=True)
        logits: torch.Tensor = self.head(hidden)
        return logits


def _loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    (tokens,) = batch
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _spec(args: argparse.Namespace, sharded: bool, gather: str = "per_pass") -> TrainingSpec:
    torch.manual_seed(0)
    model = LM(args)
    tokens = torch.randint(0, args.vocab, (4 * B, CONTEXT + 1), generator=torch.Generator().manual_seed(1))
    spec = TrainingSpec(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        dataset=TensorDataset(tokens),
        loss_fn=_loss,
    )
    if sharded:
        spec.sharding = "fsdp"
        spec.shard_modules = list(model.blocks.layers)
        spec.shard_gather = gather  # type: ignore[assignment]
    return spec


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _held(engine: VirtualNodeEngine, message: torch.Tensor, sharded: bool) -> dict[str, float]:
    """MiB of this rank's parameters, step gradient and optimizer state after ``reduce_step``."""
    spec = engine.spec
    params = sum(_local_bytes(p) for p in spec.model.parameters())
    if sharded:
        gradient = sum(_local_bytes(p.grad) for p in spec.model.parameters() if p.grad is not None)
    else:
        gradient = message.numel() * message.element_size()
    optimizer = sum(
        _local_bytes(value)
        for state in spec.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    return {"parameters": params / MIB, "gradient": gradient / MIB, "optimizer": optimizer / MIB}


def _measure(args: argparse.Namespace, sharded: bool, gather: str = "per_pass") -> dict[str, Any]:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    config = trainer_config(
        max_replicas=args.workers,
        virtual_nodes=V,
        global_batch_size=B,
        mode="fast",
        checkpoint_path="/unused",
    )
    spec = _spec(args, sharded, gather)
    engine: VirtualNodeEngine = (ShardedEngine if sharded else VirtualNodeEngine)(spec, config)
    engine.join_world(world_size)
    comm = DistCollectives(torch.device("cpu"))
    worker_step(engine, rank, world_size, comm)(0)  # warm-up: the optimizer state exists from here on
    mine = ranges_from_counts(even_counts(V, world_size))[rank]
    copies = ShardCopies(engine, rank, world_size, 1, 1, torch.device("cpu")) if sharded else None  # type: ignore[arg-type]
    seconds, copy_seconds, held = [], [], {}
    for number in range(1, args.steps + 1):
        dist.barrier()
        started = time.perf_counter()
        message, _ = engine.reduce_step(
            number, mine, rank=rank, world_size=world_size, leave=lambda: False, comm=comm
        )
        held = _held(engine, message, sharded)
        engine.apply(message, world_size)
        seconds.append(time.perf_counter() - started)
        if copies is not None and copies.every:
            dist.barrier()
            started = time.perf_counter()
            copies.exchange(number, 0.0)
            copy_seconds.append(time.perf_counter() - started)
            copies.settle()
    measured: dict[str, Any] = {"held": held, "step_seconds": statistics.median(seconds)}
    if sharded:
        measured["checkpoint"] = _measure_checkpoints(args, engine, config, number)
    engine.close()
    if copy_seconds and copies is not None:
        kept = sum(len(data) for data in copies.book.copies().values())
        measured["buddy"] = {"seconds": statistics.median(copy_seconds), "kept_mib": kept / MIB}
    return measured


def _measure_checkpoints(
    args: argparse.Namespace, engine: VirtualNodeEngine, config: Any, step: int
) -> dict[str, float]:
    """A durable checkpoint on a volume both ways, the median of three: whole (every rank gathers the
    state, rank 0 writes it) and in pieces (each rank writes its shard, rank 0 commits); seconds of
    the slowest rank and the bytes this rank wrote."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    root = Path(args.checkpoints) / f"world-{world_size}"
    config = dataclasses.replace(config, checkpoint_path=str(root))
    durable = DurableCheckpoints(config, engine, rank, world_size, torch.device("cpu"), Journal(""))
    timings: dict[str, list[float]] = {"whole": [], "pieces": []}
    for _ in range(3):
        for way in timings:
            dist.barrier()
            started = time.perf_counter()
            if way == "whole":
                durable.write(step, 0.0, state.capture(engine, step, 0.0))
            else:
                durable.write(step, 0.0)
            dist.barrier()
            timings[way].append(time.perf_counter() - started)
    written = {
        "whole": (root / state.CHECKPOINT_FILE).stat().st_size if rank == 0 else 0,
        "pieces": sum(p.stat().st_size for p in root.glob(f"shards-*/shard-{rank}-of-{world_size}.pt")),
    }
    return {
        **{f"{way}_seconds": statistics.median(values) for way, values in timings.items()},
        **{f"{way}_written_mib": size / MIB for way, size in written.items()},
    }


def _measure_plain_fsdp2(args: argparse.Namespace) -> dict[str, Any]:
    """The baseline without elasticity: the same model under ``fully_shard`` as a user writes it, the
    optimizer built over the sharded parameters, each rank's B/N sequences in one forward/backward."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    spec = _spec(args, sharded=True)
    mesh = init_device_mesh("cpu", (world_size,))
    for module in spec.shard_modules:
        fully_shard(module, mesh=mesh)
    fully_shard(spec.model, mesh=mesh)
    optimizer = torch.optim.AdamW(spec.model.parameters(), lr=1e-3)
    (tokens,) = spec.dataset.tensors  # type: ignore[attr-defined]
    share = B // world_size
    seconds = []
    for number in range(args.steps + 1):  # the first step builds the optimizer state: not timed
        batch = tokens[(number * B + rank * share) % len(tokens) :][:share]
        dist.barrier()
        started = time.perf_counter()
        _loss(spec.model, [batch]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if number:
            seconds.append(time.perf_counter() - started)
    return {"step_seconds": statistics.median(seconds)}


def _rank(args: argparse.Namespace) -> None:
    join_world(args.rank, args.workers, args.port)
    rows = {
        "replicated": _measure(args, sharded=False),
        "sharded": _measure(args, sharded=True),
        "sharded_per_step": _measure(args, sharded=True, gather="per_step"),
        "plain_fsdp2": _measure_plain_fsdp2(args),
    }
    gathered: list[Any] = [None] * args.workers
    dist.all_gather_object(gathered, rows)
    if args.rank == 0:
        with open(args.out, "a") as out:
            print(json.dumps({"world": args.workers, "ranks": gathered}), file=out)
    dist.destroy_process_group()
    # As the trainer's workers do (multiprocessing ends them with os._exit): after the whole state
    # was gathered (DTensor.full_tensor), the interpreter's teardown sometimes aborts in C++
    # ("terminate called without an active exception") once the results are written.
    sys.stdout.flush()
    os._exit(0)


def _report(lines: list[dict[str, Any]]) -> dict[str, Any]:
    table = []
    print(f"{'N':>2} {'engine':>10} {'params':>8} {'grad':>8} {'optim':>8} {'total MiB':>10} {'step s':>7}")
    for line in lines:
        world, ranks = line["world"], line["ranks"]
        totals = {}
        for engine in ("replicated", "sharded"):
            # The largest rank: torch.chunk gives the first ranks the larger pieces.
            held = max((r[engine]["held"] for r in ranks), key=lambda h: sum(h.values()))
            step = max(r[engine]["step_seconds"] for r in ranks)
            totals[engine] = (sum(held.values()), step)
            print(
                f"{world:>2} {engine:>10} {held['parameters']:>8.2f} {held['gradient']:>8.2f} "
                f"{held['optimizer']:>8.2f} {totals[engine][0]:>10.2f} {step:>7.3f}"
            )
        memory_ratio = totals["sharded"][0] / totals["replicated"][0]
        time_ratio = totals["sharded"][1] / totals["replicated"][1]
        print(f"   sharded/replicated: memory {memory_ratio:.3f}, step time {time_ratio:.2f}")
        row = {"world": world, "ranks": ranks, "memory_ratio": memory_ratio, "time_ratio": time_ratio}
        plain = max(r["plain_fsdp2"]["step_seconds"] for r in ranks)
        row["over_plain_fsdp2"] = totals["sharded"][1] / plain
        print(
            f"   plain FSDP2 (no virtual nodes, no elasticity): step {plain:.3f} s; the sharded engine's "
            f"step {row['over_plain_fsdp2']:.2f} of it"
        )
        per_step = max(r["sharded_per_step"]["step_seconds"] for r in ranks)
        whole = sum(ranks[0]["replicated"]["held"][part] for part in ("parameters", "gradient"))
        row["per_step_over_plain_fsdp2"] = per_step / plain
        print(
            f"   shard_gather=per_step: step {per_step:.3f} s, {row['per_step_over_plain_fsdp2']:.2f} of "
            f"plain FSDP2's (whole parameters and gradient held through the step: {whole:.2f} MiB)"
        )
        checkpoints = [r["sharded"]["checkpoint"] for r in ranks]
        whole_s = max(c["whole_seconds"] for c in checkpoints)
        pieces_s = max(c["pieces_seconds"] for c in checkpoints)
        row["checkpoint_pieces_over_whole"] = pieces_s / whole_s
        print(
            f"   checkpoint: whole {whole_s:.3f} s (rank 0 writes "
            f"{max(c['whole_written_mib'] for c in checkpoints):.2f} MiB), in pieces {pieces_s:.3f} s "
            f"({row['checkpoint_pieces_over_whole']:.2f} of it; each rank writes at most "
            f"{max(c['pieces_written_mib'] for c in checkpoints):.2f} MiB)"
        )
        buddies = [r["sharded"]["buddy"] for r in ranks if "buddy" in r["sharded"]]
        if buddies:
            copy_seconds = max(b["seconds"] for b in buddies)
            kept = max(b["kept_mib"] for b in buddies)
            row["buddy_copy_ratio"] = copy_seconds / totals["sharded"][1]
            print(
                f"   buddy copy: {copy_seconds:.3f} s a step ({row['buddy_copy_ratio']:.2f} of the sharded "
                f"step), {kept:.2f} MiB of copies kept in host memory"
            )
        table.append(row)
    return {"worlds": table}


def main() -> None:
    parser = rank_parser(__doc__.splitlines()[0], workers=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--checkpoints", default="", help="where the ranks write checkpoints (a temporary folder)"
    )
    args = parser.parse_args()
    if args.rank is not None:
        _rank(args)
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    lines_file = RESULTS.with_suffix(".jsonl")
    lines_file.unlink(missing_ok=True)
    shape = ["--width", str(args.width), "--layers", str(args.layers), "--vocab", str(args.vocab)]
    with tempfile.TemporaryDirectory(prefix="ebbflow-sharded-checkpoints-") as checkpoints:
        for world in range(1, args.workers + 1):
            arguments = [
                *shape,
                "--steps",
                str(args.steps),
                "--workers",
                str(world),
                "--out",
                str(lines_file),
            ]
            run_ranks(__file__, [*arguments, "--checkpoints", checkpoints], world)
    lines = [json.loads(line) for line in lines_file.read_text().splitlines()]
    report = _report(lines)
    RESULTS.write_text(json.dumps({"arguments": vars(args), **report}, indent=2))


if __name__ == "__main__":
    main()
