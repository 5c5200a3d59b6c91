"""The digits example with every optional TrainingSpec feature on, for the trainer tier.

Cosine LR schedule, gradient clipping (active early in the run), mixed precision
(``FEATURES_PRECISION``: fp16 by default, with a loss scale that starts too high and grows every 5
good steps, so steps overflow now and then; or bf16), an evaluation every 10 steps on the last 200
digits, the script's own state (how many evaluations ran and the best accuracy so far; changed only
in ``eval_fn``, so it is the same on every worker) and one background loader process
(``FEATURES_LOADER_WORKERS``).

``FEATURES_HOLD=path``: while ``path`` exists, reading a sample waits. A test holds training this
way while a newcomer starts (which takes long on a busy machine), instead of racing it against the
end of the run; it does not change what is trained.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F
from ebbflow_devtools.testing.held_digits import DIGITS, Held
from ebbflow_trainer import LossScaling, TrainingSpec
from ebbflow_trainer.api import load_spec
from torch.utils.data import TensorDataset

STEPS = 80
EVAL_EVERY = 10
CLIP = 1.0


def build() -> TrainingSpec:
    spec = load_spec(DIGITS)
    assert isinstance(spec.dataset, TensorDataset)
    images, labels = (tensor[-200:] for tensor in spec.dataset.tensors)
    record = {"evaluations": 0, "best_accuracy": 0.0}

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        logits = model(images).float()
        accuracy = float((logits.argmax(dim=1) == labels).float().mean())
        record["evaluations"] += 1
        record["best_accuracy"] = max(record["best_accuracy"], accuracy)
        return {"accuracy": accuracy, "loss": float(F.cross_entropy(logits, labels))}

    def restore(saved: dict[str, float]) -> None:
        record.update(saved)

    hold = os.environ.get("FEATURES_HOLD", "")
    return dataclasses.replace(
        spec,
        dataset=Held(spec.dataset, hold) if hold else spec.dataset,
        steps=STEPS,
        scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(spec.optimizer, T_max=STEPS),
        clip_grad_norm=CLIP,
        precision=os.environ.get("FEATURES_PRECISION", "fp16"),  # type: ignore[arg-type]
        loss_scaling=LossScaling(init_scale=2.0**20, growth_interval=5),
        eval_fn=evaluate,
        eval_every=EVAL_EVERY,
        extra_state=(lambda: dict(record), restore),
        loader_workers=int(os.environ.get("FEATURES_LOADER_WORKERS", "1")),
    )
