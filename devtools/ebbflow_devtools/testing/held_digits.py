"""The digits example, held while the file ``DIGITS_HOLD`` names exists (reading a sample waits). A
test holds training this way while a newcomer starts, which takes long on a busy machine, instead of
racing it against the end of the run; it does not change what is trained. `Held` also serves other
test scripts (the trainer tier's ``features_digits.py``)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec
from torch.utils.data import Dataset, TensorDataset

DIGITS = str(Path(__file__).resolve().parents[3] / "examples" / "digits" / "train.py")


class Held(Dataset[Any]):
    """``base``, except that reading a sample waits while the file ``hold`` exists."""

    def __init__(self, base: TensorDataset, hold: str):
        self.base = base
        self.hold = hold

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        while os.path.exists(self.hold):
            time.sleep(0.05)
        return self.base[index]


def build() -> TrainingSpec:
    spec = load_spec(DIGITS)
    hold = os.environ.get("DIGITS_HOLD", "")
    assert isinstance(spec.dataset, TensorDataset)
    return dataclasses.replace(spec, dataset=Held(spec.dataset, hold)) if hold else spec
