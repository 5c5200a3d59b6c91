"""The digits example with a state big enough that uploading it takes a while: the model carries a
uint8 buffer of `BALLAST_MB` MiB (default 32), saved and restored with it but never trained (the
parameters, and so the training, are the example's own)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec

DIGITS = str(Path(__file__).resolve().parents[2] / "examples" / "digits" / "train.py")


def build() -> TrainingSpec:
    spec = load_spec(DIGITS)
    megabytes = int(os.environ.get("BALLAST_MB", "32"))
    spec.model.register_buffer("ballast", torch.zeros(megabytes << 20, dtype=torch.uint8))
    return spec
