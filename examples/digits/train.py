"""Handwritten digits (scikit-learn's bundled 8x8 images, no download) with a small BatchNorm MLP.

Run it elastically (see docs/trainer.md): ``ebbflow-train run examples/digits/train.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ebbflow_trainer import TrainingSpec
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset


def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def build() -> TrainingSpec:
    digits = load_digits()
    images = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.BatchNorm1d(64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return TrainingSpec(
        model=model,
        optimizer=optimizer,
        dataset=TensorDataset(images, labels),
        loss_fn=loss_fn,
        steps=200,
    )
