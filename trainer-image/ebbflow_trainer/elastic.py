"""Opt-ins for a script run by ``ebbflow-train torchrun``, each usable alone and each doing its torchrun
meaning (or nothing) elsewhere; the usage and what each keeps: docs/trainer.md, "Opt-ins".

- `should_stop` (collective, once per step): True on every rank once any rank got SIGTERM (its pod
  deleted, or the agent stopping the world for a newcomer); from its first call SIGTERM is a flag.
- `stop`: exit at the step boundary, 0 when asked to leave (the launcher then leaves gracefully).
- `save` / `restore` (collective): state dicts in node-local memory; the next world loads the
  freshest any rank holds, broadcast from that rank, if newer than the script's own checkpoint.
  `save_directory` / `restore_directory` do the same for a framework's checkpoint directory.
- `accumulation_steps`: micro-batches per step that keep the job's global batch in this world.
- `report`: rank 0's progress for the operator's policies; `evaluated` adds the last evaluation's
  metrics to the reports that follow it.

Invariant: every rank stops after the same step (the flag is agreed over the world), so a stop never
leaves a rank inside a collective its peers have left.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol

import torch
import torch.distributed as dist
from ebbflow_api import contract

from ebbflow_trainer import metrics
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.script import ENV_TRAINER_CONFIG
from ebbflow_trainer.launch.worker import EXIT_REFORM

SCRIPT_HANDOFF_FILE = "script-handoff.pt"
log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


@functools.cache
def config() -> TrainerConfig | None:
    """The launcher's configuration, or None when the script does not run under ``ebbflow-train``."""
    text = os.environ.get(ENV_TRAINER_CONFIG)
    return TrainerConfig.from_json(text) if text else None


def local_directory() -> Path | None:
    """This process's node-local directory (the pod's /dev/shm), None outside ``ebbflow-train``."""
    settings = config()
    if settings is None:
        return None
    return state.local_dir(Path(settings.state_dir), int(os.environ.get("LOCAL_RANK", "0")))


def _collective_device() -> torch.device:
    """Where a collective's tensors must live: the process's GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _StopSignal:
    """SIGTERM sets the flag instead of killing the process, from the first `should_stop` on."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        directory = local_directory()
        if directory is not None:  # the launcher reads it: inside a step, leaving must wait for the stop
            directory.mkdir(parents=True, exist_ok=True)
            (directory / state.TRAINING_MARKER).touch()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


_signal: _StopSignal | None = None


def should_stop() -> bool:
    """Whether this world stops after the step just taken: True on every rank once any rank was sent
    SIGTERM. A collective when a process group is up: every rank calls it once per step."""
    global _signal
    if _signal is None:
        _signal = _StopSignal()
    asked = _signal.requested
    if dist.is_available() and dist.is_initialized():
        flag = torch.tensor([1 if asked else 0], device=_collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    return asked


def stop() -> NoReturn:
    """Exit at this step boundary: 0 when this process was asked to stop (the launcher then leaves,
    or the agent starts the next world), the re-form code when only a peer was."""
    asked = _signal is not None and _signal.requested
    directory = local_directory()
    if directory is not None:
        if asked:
            (directory / state.LEFT_MARKER).touch()
        (directory / state.TRAINING_MARKER).unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(contract.EXIT_SUCCESS if asked else EXIT_REFORM)


def save(step: int, **objects: Stateful) -> None:
    """Leave the state dicts of ``objects`` after ``step`` in node-local memory for the next world
    (under ``ebbflow-train`` only; elsewhere a no-op). Every rank may save; the next world loads the
    freshest (`restore`)."""
    directory = local_directory()
    if directory is None:
        return
    snapshot = {"step": step, "state": {name: value.state_dict() for name, value in objects.items()}}
    state.write_atomic(state.to_bytes(snapshot), directory / SCRIPT_HANDOFF_FILE)


def _freshest_rank(step: int) -> tuple[int, int]:
    """The newest step any rank holds and the lowest rank holding it."""
    rank, world = _world()
    if world == 1:
        return step, rank
    device = _collective_device()
    steps = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([step], device=device))
    newest = max(int(s.item()) for s in steps)
    return newest, min(r for r, s in enumerate(steps) if int(s.item()) == newest)


def _load_freshest(after: int) -> dict[str, Any] | None:
    """Collective: the freshest snapshot any rank of this world saved, if newer than step ``after``,
    sent by the lowest rank holding it to every other; None when there is none."""
    directory = local_directory()
    saved = state.read(directory / SCRIPT_HANDOFF_FILE) if directory is not None else None
    step, source = _freshest_rank(int(saved["step"]) if saved is not None else -1)
    if step <= after:
        return None
    rank, world = _world()
    if world > 1:
        payload = [state.to_bytes(saved) if rank == source and saved is not None else None]
        dist.broadcast_object_list(payload, src=source)
        assert payload[0] is not None, "the freshest rank broadcast nothing"
        saved = state.from_bytes(payload[0])
    assert saved is not None
    log.info("restoring the state of step %d from rank %d's node-local handoff", step, source)
    return saved


def restore(after: int = 0, **objects: Stateful) -> int:
    """Load into ``objects`` the freshest state any rank of this world saved, if it is newer than step
    ``after`` (what the script restored already, from its own checkpoint), and return its step; else
    leave them and return ``after`` (the first world, or a restart of the whole job). A collective
    when a process group is up, called by every rank with the same ``after``."""
    saved = _load_freshest(after)
    if saved is None:
        return after
    held = saved.get("state", {})
    missing = sorted(set(objects) - set(held))
    if missing:
        raise KeyError(
            f"the saved state of step {saved['step']} holds no {missing}: save them under the same names"
        )
    for name, target in objects.items():
        target.load_state_dict(held[name])
    return int(saved["step"])


def save_directory(step: int, directory: Path) -> None:
    """Leave the files under ``directory`` (a framework's checkpoint) in node-local memory as the state
    of ``step``; a no-op outside ``ebbflow-train``."""
    local = local_directory()
    if local is None:
        return
    files = {
        str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()
    }
    state.write_atomic(state.to_bytes({"step": step, "files": files}), local / SCRIPT_HANDOFF_FILE)


def restore_directory(after: int, target: Path) -> int:
    """Write the freshest directory any rank saved (`save_directory`), if newer than step ``after``,
    to ``target`` (replacing what was there) and return its step; else return ``after``. Collective."""
    saved = _load_freshest(after)
    if saved is None:
        return after
    if "files" not in saved:
        raise KeyError(f"the saved state of step {saved['step']} holds state dicts, not a directory")
    shutil.rmtree(target, ignore_errors=True)
    for name, data in saved["files"].items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return int(saved["step"])


def accumulation_steps(per_device_batch: int, global_batch: int | None = None) -> int:
    """Micro-batches each rank accumulates per step so that per-device batch x steps x world size is
    the global batch (default: the job's spec.globalBatchSize), whatever the world's size."""
    if global_batch is None:
        settings = config()
        if settings is None:
            raise ValueError(
                "no global batch: pass global_batch=, or run the script with `ebbflow-train torchrun`, "
                "which takes it from the job's spec.globalBatchSize"
            )
        global_batch = settings.global_batch_size
    _, world = _world()
    share = per_device_batch * world
    if per_device_batch < 1 or global_batch % share:
        raise ValueError(
            f"global batch {global_batch} is not a multiple of per-device batch {per_device_batch} x world "
            f"size {world}: choose a per-device batch that divides globalBatchSize / world size for every "
            "world size the job may have (a divisor of globalBatchSize / replicas.max)"
        )
    return global_batch // share


_reporter: metrics.ProgressReporter | None = None
_last_evaluation: dict[str, Any] | None = None
_last_report: dict[str, Any] | None = None


def evaluated(step: int, results: dict[str, float]) -> None:
    """Record an evaluation at ``step`` (metric name -> value; non-finite values dropped, JSON has
    no NaN): rank 0 reports it at once with its last progress, and every later `report` carries it
    until the next evaluation."""
    global _last_evaluation
    numbers = {name: float(v) for name, v in results.items() if isinstance(v, int | float)}
    _last_evaluation = {"step": step, "metrics": {k: v for k, v in numbers.items() if math.isfinite(v)}}
    if _reporter is not None and _last_report is not None:
        _reporter.maybe_report({**_last_report, "eval": _last_evaluation}, force=True)


def report(
    step: int,
    *,
    loss: float | None,
    step_seconds: float,
    per_device_batch: int,
    accumulation: int = 1,
    last: bool = False,
) -> None:
    """Rank 0's progress for the operator's policies (the pod's progress annotation), at most every
    few seconds, and always for the ``last`` step; best effort and a no-op outside
    ``ebbflow-train`` or on other ranks."""
    global _reporter, _last_report
    settings = config()
    rank, world = _world()
    if settings is None or rank != 0:
        return
    if _reporter is None:
        _reporter = metrics.ProgressReporter(settings)
    samples = per_device_batch * accumulation * world
    shape = metrics.StepShape(
        world_size=world,
        micro_batch=per_device_batch,
        micro_batches=accumulation,
        step_seconds=step_seconds,
        compute_seconds=step_seconds,
    )
    finite = loss if loss is not None and math.isfinite(loss) else None  # JSON has no NaN
    throughput = samples / max(step_seconds, 1e-9)
    body = _reporter.report(step, step * samples, finite, throughput, _last_evaluation, shape)
    _last_report = body
    _reporter.maybe_report(body, force=last)
