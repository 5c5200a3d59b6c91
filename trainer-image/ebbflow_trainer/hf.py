"""A Hugging Face ``Trainer`` script under ``ebbflow-train torchrun``, made elastic by three additions
(usage: docs/trainer.md, "A Hugging Face Trainer script"; example: examples/hf_trainer/train.py):

- `elastic_arguments`: the gradient accumulation that keeps the job's global batch (per-device batch
  x accumulation x world size) in the current world.
- `ElasticCallback`: progress and evaluation metrics (``eval_`` prefix dropped) to the operator;
  when any rank got SIGTERM, every rank stops after the same optimizer step, the Trainer saves a
  checkpoint, every rank that sees it whole hands it over in node-local memory, and all exit.
- `resume_point` (collective): the freshest handed-over checkpoint, as a directory, if at least as new
  as the newest in ``output_dir``; else that one; else None.

Invariant: with B fixed, global step s covers positions [sB, (s+1)B) of the sampler's permutation for
any world size, and the Trainer's resume skips s x accumulation batches per rank, the same sB samples:
no sample is skipped or repeated across a change of world size.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ebbflow_trainer import elastic

log = logging.getLogger(__name__)
# Where a rank writes the checkpoint the next world resumes from (under its node-local directory).
RESUME_DIR = "hf-resume"


def elastic_arguments(args: TrainingArguments) -> TrainingArguments:
    """``args`` with the gradient accumulation that makes the job's global batch in this world."""
    args.gradient_accumulation_steps = elastic.accumulation_steps(args.per_device_train_batch_size)
    return args


class ElasticCallback(TrainerCallback):
    """Progress for the operator; a stop at a step boundary, with the state handed over, when the
    world must change."""

    def __init__(self) -> None:
        self._stopping = False
        self._last_step_end = time.monotonic()
        self._step_seconds = 0.0

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        now = time.monotonic()
        self._step_seconds, self._last_step_end = now - self._last_step_end, now
        if elastic.should_stop():  # collective: every rank calls it after the same optimizer step
            self._stopping = True
            control.should_save = True  # the Trainer saves, then calls on_save
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "loss" in logs:
            elastic.report(
                state.global_step,
                loss=logs["loss"],
                step_seconds=self._step_seconds,
                per_device_batch=args.per_device_train_batch_size,
                accumulation=args.gradient_accumulation_steps,
                last=state.global_step >= state.max_steps,
            )

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if metrics:
            elastic.evaluated(state.global_step, {k.removeprefix("eval_"): v for k, v in metrics.items()})

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._stopping:
            return
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # process zero has written the whole checkpoint
        checkpoint = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        # Process zero writes the model, optimizer and trainer state: a rank that sees them (all of
        # them, when output_dir is a shared volume) hands the checkpoint over, so that the next world
        # finds it even if process zero's node is the one leaving.
        if (checkpoint / TRAINER_STATE_NAME).is_file():
            elastic.save_directory(state.global_step, checkpoint)
        elastic.stop()


def resume_point(args: TrainingArguments) -> str | None:
    """The checkpoint directory to resume from: the freshest one handed over in memory, if at least as
    new as the newest in ``args.output_dir`` (memory is read faster than a shared volume); else that
    one; else None. Collective: every rank calls it."""
    output = str(args.output_dir)
    own: str | None = get_last_checkpoint(output) if os.path.isdir(output) else None  # type: ignore[no-untyped-call]
    own_step = int(own.rsplit("-", 1)[1]) if own else 0
    local = elastic.local_directory()
    if local is None:
        return own
    target = local / RESUME_DIR
    older = max(0, own_step - 1)  # a handoff of own_step itself is taken
    step = elastic.restore_directory(older, target)
    if step > older:
        log.info("resuming from the checkpoint of step %d handed over in memory", step)
        return str(target)
    return own
