"""The digits example, held while the file ``DIGITS_HOLD`` names exists (reading a sample waits, see
``features_digits.Held``). A test holds training this way while a newcomer starts, which takes long
on a busy machine, instead of racing it against the end of the run; it does not change what is
trained."""

from __future__ import annotations

import dataclasses
import os

from ebbflow_trainer import TrainingSpec
from ebbflow_trainer.api import load_spec
from torch.utils.data import TensorDataset

from tests.trainer.features_digits import DIGITS, Held


def build() -> TrainingSpec:
    spec = load_spec(DIGITS)
    hold = os.environ.get("DIGITS_HOLD", "")
    assert isinstance(spec.dataset, TensorDataset)
    return dataclasses.replace(spec, dataset=Held(spec.dataset, hold)) if hold else spec
