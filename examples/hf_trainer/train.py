"""A Hugging Face ``Trainer`` script, the way teams write them, made elastic by three lines of
``ebbflow_trainer.hf`` (marked ``# Ebbflow``): the causal LM of examples/hf_lm (GPT-2 from a small
config, random initialisation, nothing downloaded) on the same generated text.

    ebbflow-train torchrun examples/hf_trainer/train.py --output-dir /checkpoints/hf --max-steps 200

Under stock torchrun it runs as well (the three lines then keep the script's own batch and
checkpoints). Rank 0 writes one JSON line per event to stdout and to ``--events``: ``start`` (world,
step resumed from and where from, accumulation), ``step`` (step, loss, world, time), ``done``.
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
from ebbflow_trainer.hf import ElasticCallback, elastic_arguments, resume_point
from transformers import Trainer, TrainerCallback, TrainingArguments


def _hf_lm() -> Any:
    """examples/hf_lm/train.py beside this directory: its model, text and tokenizer."""
    path = Path(__file__).resolve().parents[1] / "hf_lm" / "train.py"
    location = importlib.util.spec_from_file_location("hf_lm_train", path)
    assert location is not None and location.loader is not None
    module = importlib.util.module_from_spec(location)
    location.loader.exec_module(module)
    return module


EVAL_SEQUENCES = 48  # held-out sequences, a few seconds of evaluation on a CPU


class Sequences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Rows of bytes as a causal LM's inputs; the model shifts the labels itself."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index], "labels": self.rows[index]}


class Events(TrainerCallback):
    """Rank 0's JSON lines (stdout and ``path``): what the tests and the bench read."""

    def __init__(self, path: Path | None, source: str):
        self.path, self.source = path, source

    def emit(self, state: Any, event: str, **fields: Any) -> None:
        if not state.is_world_process_zero:
            return
        world = dist.get_world_size() if dist.is_initialized() else 1
        line = json.dumps({"event": event, "time": time.time(), "world": world, **fields})
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as journal:
                journal.write(line + "\n")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        accumulation = args.gradient_accumulation_steps
        self.emit(state, "start", step=state.global_step, source=self.source, accumulation=accumulation)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.emit(state, "step", step=state.global_step, loss=logs["loss"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.emit(state, "done", step=state.global_step)


class SimulatedDeviceTime(TrainerCallback):
    """A pause per sample this rank trained in the step, so that a CPU run takes a device's time."""

    def __init__(self, sample_seconds: float):
        self.sample_seconds = sample_seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        time.sleep(self.sample_seconds * samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="the Trainer's checkpoints (a shared volume)")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--per-device-batch", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--eval-steps", type=int, default=20, help="evaluate on held-out text every N steps")
    parser.add_argument("--events", type=Path)
    parser.add_argument(
        "--simulated-sample-seconds", type=float, default=0.0, help="device time per sample (CPU runs)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lm = _hf_lm()
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_batch,
        learning_rate=3e-3,
        warmup_steps=20,
        lr_scheduler_type="cosine",
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        per_device_eval_batch_size=args.per_device_batch,
        use_cpu=not torch.cuda.is_available(),
        report_to=[],
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    training = elastic_arguments(training)  # Ebbflow: the job's global batch in every world
    torch.manual_seed(0)
    trainer = Trainer(
        model=lm.make_model(),
        args=training,
        train_dataset=Sequences(lm.corpus(lm.SEQUENCES, seed=1234)),
        eval_dataset=Sequences(lm.corpus(EVAL_SEQUENCES, seed=4321)),
        callbacks=[ElasticCallback()],  # Ebbflow: progress, and a stop at a step boundary
    )
    resume = resume_point(training)  # Ebbflow: the state handed over, else the newest checkpoint
    source = "none" if resume is None else ("memory" if "hf-resume" in resume else "checkpoint")
    trainer.add_callback(Events(args.events, source))
    if args.simulated_sample_seconds > 0:
        trainer.add_callback(SimulatedDeviceTime(args.simulated_sample_seconds))
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
