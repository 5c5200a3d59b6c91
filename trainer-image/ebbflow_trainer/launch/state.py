"""The training state that survives membership changes: capture, restore, serialize, write atomically.

A state is everything needed to continue the exact sample sequence: model, optimizer, the next step
and the data position with the current global batch B, RNG states, the batch the learning rate was
tuned for, the gradient-noise estimates, the run of skipped steps, the LR scheduler and loss scale,
the last evaluation and the training script's own ``extra_state``.

Invariants: on disk and on the wire a state is ``MAGIC`` + the payload's SHA-256 + the payload, both
checked before ``torch.load(weights_only=True)``, so a truncated, altered or code-carrying file is
refused (with a log line naming it and why), never loaded; checkpoints keep the previous one
(``checkpoint.prev.pt``) to fall back to; every rename is followed by an fsync of the directory, so a
crash after a write never loses the file's name.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import logging
import os
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ebbflow_trainer.config import batch_violation
from ebbflow_trainer.sharding import DataPosition
from ebbflow_trainer.step.engine import VirtualNodeEngine
from ebbflow_trainer.step.memory_budget import Footprint

if TYPE_CHECKING:  # step.fsdp imports FSDP2, which only sharded jobs load
    from ebbflow_trainer.step.fsdp import ShardedEngine

log = logging.getLogger("ebbflow_trainer.launch.state")


HANDOFF_FILE = "handoff.pt"
CHECKPOINT_FILE = "checkpoint.pt"
# The worker writes this file in its state directory once it has left after SIGTERM; the launcher
# reads it to exit 0 instead of restarting the worker.
LEFT_MARKER = "left"
MAGIC = b"EBBFST01"  # format 1: MAGIC + SHA-256(payload) + torch.save payload
DIGEST_BYTES = 32
# The launcher writes this before it passes the pod's SIGTERM on to the workers (a restart into the
# next world sends them SIGTERM too): a sharded worker that finds it gives its shard to an heir.
LEAVING_MARKER = "leaving"
# Present while this node's worker is inside a step: from the start of training until train() returns
# at a step boundary with the state handed over or saved. A launcher SIGTERMed without it (between
# worlds, in a rendezvous, after a re-form stop) loses nothing by leaving, so it exits 0 as well.
TRAINING_MARKER = "training"


def local_dir(state_dir: Path, local_rank: int) -> Path:
    """The handoff file and markers of one training process of the pod (``--nproc-per-node``)."""
    return state_dir / f"local-{local_rank}"


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor on the CPU: a state loads anywhere (CUDA or not, any device index)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        converted = {key: _to_cpu(item) for key, item in value.items()}
        if type(value) is dict:
            return converted
        typed = type(value)(converted)  # an OrderedDict keeps its load_state_dict _metadata
        if hasattr(value, "_metadata"):
            typed._metadata = value._metadata  # type: ignore[attr-defined]
        return typed
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu(item) for item in value)
    return value


def model_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the model's parameters and buffers (names, dtypes, shapes, bytes), in state_dict
    order: two runs that end bitwise equal print the same digest, so runs on different clusters
    (a disturbed one and a calm one) compare without copying their checkpoints out."""
    return state_digest(model.state_dict())


def state_digest(values: Mapping[str, torch.Tensor]) -> str:
    """``model_digest`` of a state dict of whole tensors (a sharded model's, gathered)."""
    digest = hashlib.sha256()
    for name, tensor in values.items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def capture(engine: VirtualNodeEngine, step: int, last_step_wall_time: float) -> dict[str, Any]:
    """A self-contained copy of the state after ``step`` completed steps (collective when sharded)."""
    return {
        **_shared_state(engine, step, last_step_wall_time),
        "model": _to_cpu(engine.model_state()),
        "optimizer": _to_cpu(engine.optimizer_state()),
    }


def capture_shard(engine: ShardedEngine, step: int, last_step_wall_time: float) -> dict[str, Any]:
    """``capture`` with this worker's pieces of the sharded tensors in place of whole ones (no
    collective): what a buddy copy holds. ``"sharded"`` names the entries that are pieces."""
    model, optimizer, sharded = engine.shard_state()
    return {
        **_shared_state(engine, step, last_step_wall_time),
        "model": model,
        "optimizer": optimizer,
        "sharded": sharded,
    }


def _shared_state(engine: VirtualNodeEngine, step: int, last_step_wall_time: float) -> dict[str, Any]:
    """Everything of a state but the model and the optimizer."""
    return {
        "step": step,
        "last_step_wall_time": last_step_wall_time,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": _numpy_rng_state(),
        },
        "base_batch_size": engine.base_batch_size,
        "base_lrs": engine.base_lrs,
        "noise": vars(engine.noise).copy(),
        "nonfinite_streak": engine.nonfinite_streak,
        "update": copy.deepcopy(engine.update.state_dict()),
        "evaluation": copy.deepcopy(engine.evaluation.last),
        "extra": _extra_state(engine),
        "virtual_nodes": engine.config.virtual_nodes,
        "global_batch_size": engine.global_batch_size,
        "position": dataclasses.asdict(engine.position),
        "seed": engine.config.seed,
        "compression_rate": engine.compression_rate,
        "footprint": engine.footprint.to_state() if engine.footprint is not None else None,
    }


def restore(engine: VirtualNodeEngine, state: dict[str, Any]) -> None:
    """Load ``state`` into ``engine``: whole tensors, or this worker's pieces when the state says which
    entries are pieces (``"sharded"``: rebuilt from buddy copies for this world's layout)."""
    if "sharded" in state:
        cast("ShardedEngine", engine).load_shard_state(state["model"], state["optimizer"], state["sharded"])
    else:
        engine.load_model_state(state["model"])
        engine.load_optimizer_state(state["optimizer"])
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    _set_numpy_rng_state(rng["numpy"])
    engine.base_batch_size = int(state["base_batch_size"])
    engine.position = _position(engine, state)
    engine.base_lrs = [float(lr) for lr in state["base_lrs"]]
    for name, value in state["noise"].items():
        setattr(engine.noise, name, value)
    engine.nonfinite_streak = int(state.get("nonfinite_streak", 0))
    engine.update.load_state_dict(state.get("update", {}))
    engine.evaluation.last = copy.deepcopy(state.get("evaluation"))
    _restore_compression(engine, state)
    extra = engine.spec.extra_state
    if extra is not None and state.get("extra") is not None:
        extra[1](copy.deepcopy(state["extra"]))


def _restore_compression(engine: VirtualNodeEngine, state: dict[str, Any]) -> None:
    """A band-limited job continues at the state's rate (when it still allows it) with the footprint
    measured before; a job without spec.bandLimit ignores both."""
    if not engine.rates:
        return
    rate = float(state.get("compression_rate") or 0.0)
    engine.switch_rate(rate if rate in engine.rates else 0.0)
    footprint = state.get("footprint")
    engine.footprint = Footprint.from_state(footprint) if footprint is not None else None


def _position(engine: VirtualNodeEngine, state: dict[str, Any]) -> DataPosition:
    """The state's data position and global batch. A B this job's spec does not allow (a job resumed
    from a checkpoint with another spec) goes back to spec.globalBatchSize at the state's step; a
    state from before B could change holds no position: it trained at the spec's B from step 0."""
    config = engine.config
    saved = state.get("position")
    if saved is None:
        return DataPosition(config.global_batch_size)
    position = DataPosition(**saved)
    batch = position.global_batch_size
    why = None if batch == config.global_batch_size else batch_violation(config, batch)
    if why is None:
        return position
    log.warning(
        "the state's global batch size %s is not allowed by this job (%s): from step %s on the "
        "global batch is %s, spec.globalBatchSize",
        batch,
        why,
        state["step"],
        config.global_batch_size,
    )
    return position.switched(int(state["step"]), config.global_batch_size, engine.num_samples)


def _numpy_rng_state() -> tuple[str, torch.Tensor, int, int, float]:
    """numpy's global RNG state in types ``torch.load(weights_only=True)`` accepts (no numpy arrays)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    words = np.asarray(keys, dtype=np.int64)
    return str(kind), torch.from_numpy(words), int(position), int(has_gauss), float(cached)


def _set_numpy_rng_state(saved: tuple[str, torch.Tensor, int, int, float]) -> None:
    kind, keys, position, has_gauss, cached = saved
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))


def _extra_state(engine: VirtualNodeEngine) -> dict[str, Any] | None:
    """A copy of the script's own state (its dict may be live), or None when it keeps none."""
    extra = engine.spec.extra_state
    if extra is None:
        return None
    saved = extra[0]()
    if not isinstance(saved, dict):
        raise TypeError(f"TrainingSpec.extra_state's state_dict returned {type(saved).__name__}, not a dict")
    return copy.deepcopy(saved)


class StateFileError(ValueError):
    """A state's bytes were refused: not a state, truncated, altered, or carrying other types."""


def to_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return frame(buffer.getvalue())


def frame(payload: bytes) -> bytes:
    """A state's bytes from what `torch.save` wrote: MAGIC, the payload's SHA-256, the payload."""
    return MAGIC + hashlib.sha256(payload).digest() + payload


def from_bytes(data: bytes) -> dict[str, Any]:
    """A state from its bytes, checked (magic, checksum) and then loaded with ``weights_only``, so a
    file on the checkpoint volume or in node-local memory cannot make a worker run code."""
    header = len(MAGIC) + DIGEST_BYTES
    if len(data) < header or not data.startswith(MAGIC):
        raise StateFileError("not an Ebbflow state (no header; truncated, or written by something else)")
    digest, payload = data[len(MAGIC) : header], data[header:]
    if hashlib.sha256(payload).digest() != digest:
        raise StateFileError("checksum mismatch: the file was truncated or altered")
    try:
        state: dict[str, Any] = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, pickle.UnpicklingError) as error:
        raise StateFileError(f"holds something that cannot be loaded safely: {error}") from error
    return state


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomic(data: bytes, path: Path) -> None:
    """Write-then-rename, so a reader (or a crash) never sees half a state; the directory is synced
    so the new name survives a crash too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_directory(path.parent)


def read(path: Path) -> dict[str, Any] | None:
    """The state at ``path``, or None when there is none or it is refused (logged with the reason)."""
    try:
        return from_bytes(path.read_bytes())
    except FileNotFoundError:
        return None
    except (StateFileError, OSError) as error:
        log.warning("refusing the state in %s: %s", path, error)
        return None


def previous_checkpoint(path: Path) -> Path:
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def write_checkpoint(data: bytes, path: Path) -> None:
    """The newest checkpoint becomes the previous one, then ``data`` the newest: the last two are kept."""
    if path.exists():
        os.replace(path, previous_checkpoint(path))
    write_atomic(data, path)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads: ``path``, else the previous one (both refusals are logged)."""
    for candidate in (path, previous_checkpoint(path)):
        found = read(candidate)
        if found is not None:
            if candidate != path:
                log.warning(
                    "resuming from the previous checkpoint %s (step %s)", candidate, found.get("step")
                )
            return found
    return None
