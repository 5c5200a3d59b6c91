"""The user API: a training script defines ``build() -> TrainingSpec`` and Ebbflow does the rest
(``examples/digits/train.py``; docs/trainer.md).

``build`` is called in every worker after seeding torch with the job's seed, so all workers start
from the same parameters. It must not touch ``torch.distributed`` (the trainer owns communication)
and must not start threads or processes: it also runs once in the forkserver workers are forked from.
The loss must be the mean over the batch, so a virtual node's gradient is its samples' mean gradient.

Invariants: everything a step depends on beyond the parameters (optimizer, LR scheduler, loss scale,
the user's ``extra_state``) is part of the state handed over at every membership change, so a run
with workers killed, leaving or joining ends exactly where a calm run does; ``TrainingSpec.validate``
checks the settings when the script is loaded, every error naming the field and the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import default_collate

PRECISIONS = ("fp32", "bf16", "fp16")
Precision = Literal["fp32", "bf16", "fp16"]
SHARDINGS = ("none", "fsdp")
Sharding = Literal["none", "fsdp"]
SHARD_GATHERS = ("per_pass", "per_step")
ShardGather = Literal["per_pass", "per_step"]
ExtraState = tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]]


class SpecError(ValueError):
    """A TrainingSpec setting is invalid; the message names the field and how to fix it."""


class SizedDataset(Protocol):
    """Anything indexable by sample number with a length, e.g. a ``torch.utils.data.Dataset``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclass
class LossScaling:
    """The fp16 dynamic loss scale, with ``torch.amp.GradScaler``'s parameters and defaults.

    The loss is multiplied by the scale before backward; a step whose combined gradient overflows
    is skipped and the scale multiplied by ``backoff_factor``; after ``growth_interval`` good steps
    in a row it is multiplied by ``growth_factor``.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass
class TrainingSpec:
    """What a training script provides: model, optimizer, data, loss and how long to train.

    Required: ``model``, ``optimizer``, ``dataset`` (``__len__`` and ``__getitem__(int)``) and
    ``loss_fn(model, batch)`` returning the mean loss over the batch. Optional:

    - ``steps``: global steps to train (``--steps`` overrides).
    - ``collate_fn``: turns a virtual node's list of samples into the batch ``loss_fn`` receives.
    - ``scheduler``: a ``torch.optim.lr_scheduler.LRScheduler`` on ``optimizer`` (not
      ``ReduceLROnPlateau``), stepped once after every global step, skipped steps included, so its
      position is always the step count. It sets the step's base LR; LR scaling
      (``EBBFLOW_LR_SCALING``) multiplies that base for the optimizer step only.
    - ``clip_grad_norm``: clip the combined gradient (mean over all virtual nodes, so the same for
      every world size) to this global L2 norm, like ``torch.nn.utils.clip_grad_norm_``.
    - ``precision``: ``"fp32"``, ``"bf16"`` or ``"fp16"``: ``torch.autocast`` around ``loss_fn``
      (and ``eval_fn``) on the parameters' device; parameters, gradients and the optimizer stay in
      their own dtype. fp16 adds a dynamic loss scale (``loss_scaling``); a step whose gradient
      overflows is skipped without counting toward ``spec.maxNonFiniteSteps``.
    - ``loss_scaling``: the fp16 loss scale's settings (:class:`LossScaling`).
    - ``eval_fn(model) -> {name: number}``: called after every ``eval_every`` steps and after the
      last step, on every worker (the others would only wait for rank 0), in ``model.eval()``
      under ``torch.no_grad()``, with the RNG state restored afterwards. It must not change the
      model. The metrics go to the journal, the ``ebbflow_trainer_eval{metric=...}`` gauge and the
      progress report. ``eval_every=None`` evaluates after the last step only.
    - ``extra_state``: ``(state_dict, load_state_dict)``: the script's own state (a dict),
      captured and restored with the training state. It must be the same on every worker: change
      it in ``eval_fn`` or from the step count, never from one worker's share of the batch.
    - ``sharding``: ``"none"`` (every worker holds the whole model and optimizer state) or ``"fsdp"``
      (each parameter, its gradient and its optimizer state are split over the world with PyTorch's
      FSDP2, applied to each module of ``shard_modules``, e.g. the transformer blocks, and to the
      model; docs/trainer.md says what a sharded job supports and how it resizes).
    - ``buddy_every``: with ``sharding="fsdp"``, every how many steps each worker copies its shard
      into another worker's host memory, so that a crashed worker's shard is rebuilt from that copy
      (losing the steps since); 0: no copies, a crash resumes from the durable checkpoint.
    - ``shard_gather``: with ``sharding="fsdp"``, how a step's passes (one per virtual node a worker
      owns) use the shards: ``"per_pass"`` gathers each unit's parameters for every pass and
      reduce-scatters every pass's gradient (one unit whole at a time: the least memory);
      ``"per_step"`` gathers once and reduce-scatters once per step, as plain FSDP2 does, holding the
      whole parameters and gradient through the step's passes (the optimizer state stays sharded).
    - ``loader_workers``: background processes building virtual-node batches (0: in the training
      process), forked from the worker; ``prefetch``: batches each loader process builds ahead.
      Batches and their samples do not depend on this setting.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: SizedDataset
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    steps: int = 100
    collate_fn: Callable[[list[Any]], Any] = field(default=default_collate)
    scheduler: LRScheduler | None = None
    clip_grad_norm: float | None = None
    precision: Precision = "fp32"
    loss_scaling: LossScaling = field(default_factory=LossScaling)
    eval_fn: Callable[[torch.nn.Module], Mapping[str, float]] | None = None
    eval_every: int | None = None
    extra_state: ExtraState | None = None
    loader_workers: int = 0
    prefetch: int = 2
    sharding: Sharding = "none"
    shard_modules: Sequence[torch.nn.Module] = ()
    buddy_every: int = 1
    shard_gather: ShardGather = "per_pass"

    def __post_init__(self) -> None:
        self.validate()

    def batch(self, indices: torch.Tensor) -> Any:
        return self.collate_fn([self.dataset[int(i)] for i in indices])

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first invalid field and the fix."""
        _check_core(self)
        _check_update(self)
        _check_hooks(self)
        _check_sharding(self)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_count(field: str, value: Any, least: int, must: str) -> None:
    """A whole-number field (a bool is not one) of at least ``least``; the error names it and the fix."""
    if not _is_int(value) or value < least:
        raise SpecError(f"TrainingSpec.{field}={value!r} must {must}.")


def _check_between(field: str, value: Any, above: float, must: str, below: float = math.inf) -> None:
    """A finite number field strictly between ``above`` and ``below``; the error names it and the fix."""
    if not (_is_number(value) and above < value < below):
        raise SpecError(f"TrainingSpec.{field}={value!r} must {must}.")


def _check_core(spec: TrainingSpec) -> None:
    _check_count("steps", spec.steps, 1, "be a positive whole number of steps")
    if not callable(spec.loss_fn):
        raise SpecError("TrainingSpec.loss_fn must be a function (model, batch) -> mean loss tensor.")
    if not callable(spec.collate_fn):
        raise SpecError("TrainingSpec.collate_fn must be a function (list of samples) -> batch.")
    _check_count(
        "loader_workers",
        spec.loader_workers,
        0,
        "be 0 (build batches in the training process) or a positive number of background loader processes",
    )
    _check_count(
        "prefetch",
        spec.prefetch,
        1,
        "be a positive number of batches each loader process builds ahead (default 2)",
    )


def _check_update(spec: TrainingSpec) -> None:
    scheduler = spec.scheduler
    if scheduler is not None:
        if not isinstance(scheduler, LRScheduler) or isinstance(scheduler, ReduceLROnPlateau):
            raise SpecError(
                f"TrainingSpec.scheduler is a {type(scheduler).__name__}: pass a "
                "torch.optim.lr_scheduler.LRScheduler stepped once per step (e.g. CosineAnnealingLR); "
                "ReduceLROnPlateau needs a metric and is not supported."
            )
        if scheduler.optimizer is not spec.optimizer:
            raise SpecError(
                "TrainingSpec.scheduler was built on another optimizer: build it on TrainingSpec.optimizer."
            )
    if spec.clip_grad_norm is not None:
        _check_between(
            "clip_grad_norm",
            spec.clip_grad_norm,
            0,
            "be a positive finite norm, or None for no clipping",
        )
    if spec.precision not in PRECISIONS:
        raise SpecError(f"TrainingSpec.precision={spec.precision!r} must be one of {PRECISIONS}.")
    _check_loss_scaling(spec.loss_scaling)


def _check_loss_scaling(scaling: LossScaling) -> None:
    if not isinstance(scaling, LossScaling):
        raise SpecError("TrainingSpec.loss_scaling must be a LossScaling(...).")
    _check_between("loss_scaling.init_scale", scaling.init_scale, 0, "be positive")
    _check_between("loss_scaling.growth_factor", scaling.growth_factor, 1, "be greater than 1")
    _check_between(
        "loss_scaling.backoff_factor", scaling.backoff_factor, 0, "lie strictly between 0 and 1", below=1
    )
    _check_count("loss_scaling.growth_interval", scaling.growth_interval, 1, "be a positive number of steps")


def _check_hooks(spec: TrainingSpec) -> None:
    if spec.eval_fn is not None and not callable(spec.eval_fn):
        raise SpecError("TrainingSpec.eval_fn must be a function (model) -> {metric name: number}.")
    if spec.eval_every is not None:
        _check_count(
            "eval_every",
            spec.eval_every,
            1,
            "be a positive number of steps, or None to evaluate after the last step only",
        )
        if spec.eval_fn is None:
            raise SpecError(
                "TrainingSpec.eval_every is set but eval_fn is not: set eval_fn or drop eval_every."
            )
    extra = spec.extra_state
    if extra is not None and not (
        isinstance(extra, tuple) and len(extra) == 2 and all(callable(f) for f in extra)
    ):
        raise SpecError(
            "TrainingSpec.extra_state must be a pair (state_dict, load_state_dict): a function returning "
            "a dict and a function taking that dict back."
        )


def _check_sharding(spec: TrainingSpec) -> None:
    if spec.sharding not in SHARDINGS:
        raise SpecError(f"TrainingSpec.sharding={spec.sharding!r} must be one of {SHARDINGS}.")
    modules = list(spec.shard_modules)
    if modules and spec.sharding == "none":
        raise SpecError(
            'TrainingSpec.shard_modules is set but sharding is "none": set sharding="fsdp" or drop '
            "shard_modules."
        )
    if not _is_int(spec.buddy_every) or spec.buddy_every < 0:
        raise SpecError(
            f"TrainingSpec.buddy_every={spec.buddy_every!r} must be a whole number of steps >= 0 "
            "(0: no buddy copies)."
        )
    if spec.shard_gather not in SHARD_GATHERS:
        raise SpecError(
            f"TrainingSpec.shard_gather={spec.shard_gather!r} must be one of {SHARD_GATHERS} "
            '("per_pass": least memory; "per_step": fewest collectives).'
        )
    if spec.shard_gather != "per_pass" and spec.sharding == "none":
        raise SpecError(
            f'TrainingSpec.shard_gather={spec.shard_gather!r} needs sharding="fsdp": set it or drop '
            "shard_gather."
        )
    submodules = {id(module) for module in spec.model.modules()}
    for index, module in enumerate(modules):
        if not isinstance(module, torch.nn.Module) or id(module) not in submodules:
            raise SpecError(
                f"TrainingSpec.shard_modules[{index}] is not a submodule of TrainingSpec.model: list the "
                "model's own modules (e.g. its transformer blocks)."
            )
        if module is spec.model:
            raise SpecError(
                f"TrainingSpec.shard_modules[{index}] is the model itself, which is always sharded: "
                "list its submodules only."
            )


def import_script(reference: str) -> ModuleType:
    """The module of ``path/to/script.py[:function]`` or ``package.module[:function]``, executed."""
    target = reference.partition(":")[0]
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"training script {target!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"ebbflow_user_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import training script {target!r}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_spec(reference: str) -> TrainingSpec:
    """Import ``script.py[:function]`` or ``package.module[:function]`` and call it (default ``build``)."""
    function = reference.partition(":")[2] or "build"
    factory = getattr(import_script(reference), function, None)
    if not callable(factory):
        raise AttributeError(f"{reference!r} defines no function {function!r} returning a TrainingSpec")
    spec = factory()
    if not isinstance(spec, TrainingSpec):
        raise TypeError(f"{reference!r} returned {type(spec).__name__}, not a TrainingSpec")
    spec.validate()  # again: a script may change fields after constructing the spec
    return spec
