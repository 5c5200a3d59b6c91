"""The digits example as it trains today without Ebbflow: stock ``torchrun`` (what Kubeflow's
PyTorchJob runs), ``DistributedDataParallel`` and a checkpoint to resume from after every restart.

The same model, data, optimizer and global batch as ``train.py`` (its ``build()``); what differs is
how the job survives a change of its world. torchrun's elastic agent restarts every worker process
whenever a node leaves or joins; each restart resumes from the newest checkpoint (written by rank 0
every ``--checkpoint-every`` steps to ``--checkpoint-dir``, a volume every pod shares), so the steps
since then are done again. The global batch stays ``--global-batch``, split evenly over the world.

One JSON line per event on rank 0's stdout, for the Kubeflow comparison: ``start`` (world, restart count, step
resumed from and where from), ``step`` (step, world, wall time), ``done``; with ``--events FILE`` appended
to that file too (on a shared volume it outlives the pod: bench/vs_kubeflow.py).

    torchrun --nnodes=2:4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        examples/digits/torchrun_ddp.py --checkpoint-dir /shared/digits --steps 1000

Unchanged, it runs as an ElasticTrainingJob under ``ebbflow-train torchrun`` (examples/jobs/
digits-torchrun.yaml). ``--elastic`` turns on Ebbflow's opt-ins (``ebbflow_trainer.elastic``, the
lines under ``if args.elastic``): a stop at a step boundary when the world changes and the state
handed to the next world in memory, so a join or a leave loses no step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT = "checkpoint.pt"


def build_spec() -> Any:
    """``build()`` of train.py beside this file (an example directory, not a package)."""
    location = importlib.util.spec_from_file_location("digits_train", Path(__file__).with_name("train.py"))
    assert location is not None and location.loader is not None
    module = importlib.util.module_from_spec(location)
    location.loader.exec_module(module)
    return module.build()


def emit(events: Path | None, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "time": time.time(), **fields})
    print(line, flush=True)
    if events is not None:
        events.parent.mkdir(parents=True, exist_ok=True)
        with events.open("a") as journal:
            journal.write(line + "\n")


def load_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step to resume from: the checkpoint's, or 0 without one."""
    path = directory / CHECKPOINT
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Write, then rename: a restart never finds half a checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"{CHECKPOINT}.partial"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    os.replace(partial, directory / CHECKPOINT)


def batch_indices(step: int, global_batch: int, samples: int, rank: int, world: int) -> torch.Tensor:
    """This rank's share of the step's global batch: a permutation seeded by the step, so the batch is
    the same whatever the world size and however often the job restarted."""
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(step))[:global_batch]
    return order.tensor_split(world)[rank]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--global-batch", type=int, default=384)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument(
        "--simulated-sample-seconds", type=float, default=0.0, help="device time per sample (CPU runs)"
    )
    parser.add_argument("--events", type=Path, help="also append rank 0's events to this file")
    parser.add_argument("--elastic", action="store_true", help="use ebbflow_trainer.elastic's opt-ins")
    args = parser.parse_args()
    if args.elastic:
        from ebbflow_trainer import elastic

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = build_spec()
    model = DistributedDataParallel(spec.model)
    step = load_checkpoint(args.checkpoint_dir, spec.model, spec.optimizer)
    source = "checkpoint" if step else "none"
    if args.elastic:
        restored = elastic.restore(after=step, model=spec.model, optimizer=spec.optimizer)
        source, step = ("memory" if restored > step else source), restored
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if rank == 0:  # one process writes: torchrun interleaves its processes' output
        emit(args.events, "start", world=world, restart=restart, step=step, source=source)
    samples = len(spec.dataset)
    while step < args.steps:
        indices = batch_indices(step, args.global_batch, samples, rank, world)
        images, labels = spec.dataset[indices]
        spec.optimizer.zero_grad()
        spec.loss_fn(model, [images, labels]).backward()  # DDP averages the gradients over the world
        spec.optimizer.step()
        time.sleep(args.simulated_sample_seconds * len(indices))
        step += 1
        if rank == 0:
            emit(args.events, "step", step=step, world=world)
            if step % args.checkpoint_every == 0 or step == args.steps:
                save_checkpoint(args.checkpoint_dir, spec.model, spec.optimizer, step)
        if args.elastic:
            elastic.save(step, model=spec.model, optimizer=spec.optimizer)
            if elastic.should_stop():
                elastic.stop()
    if rank == 0:
        with torch.no_grad():
            emit(args.events, "done", step=step, world=world, **spec.eval_fn(spec.model.eval()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
