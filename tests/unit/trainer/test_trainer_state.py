"""States on disk (node-local handoffs, checkpoints) load as data only, and the RNG state survives."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path

import numpy as np
import torch
from ebbflow_trainer import state


class _RunsCode:
    """Unpickling this calls os.system: what a hostile checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_state_that_would_run_code_is_not_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "checkpoint.pt"
    torch.save({"step": 3, "model": _RunsCode(marker)}, hostile)
    assert state.read(hostile) is None
    assert not marker.exists(), "loading the state ran code"


def test_a_missing_or_truncated_state_reads_as_none(tmp_path: Path) -> None:
    assert state.read(tmp_path / "absent.pt") is None
    whole = state.to_bytes({"step": 1, "weights": torch.ones(3)})
    (tmp_path / "cut.pt").write_bytes(whole[: len(whole) // 2])
    assert state.read(tmp_path / "cut.pt") is None


def test_numpy_and_python_rng_states_round_trip_through_bytes() -> None:
    np.random.seed(7)
    random.seed(7)
    saved = state.from_bytes(state.to_bytes({"numpy": state._numpy_rng_state(), "python": random.getstate()}))
    expected = (np.random.rand(4).tolist(), np.random.randn(2).tolist(), random.random())
    state._set_numpy_rng_state(saved["numpy"])
    random.setstate(saved["python"])
    assert (np.random.rand(4).tolist(), np.random.randn(2).tolist(), random.random()) == expected


def test_the_model_digest_changes_with_any_bit_and_only_then() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    twin = copy.deepcopy(model)
    assert state.model_digest(model) == state.model_digest(twin)
    with torch.no_grad():
        bits = twin[0].weight.view(torch.int32)
        bits[0, 0] ^= 1  # the last bit of one float
    assert state.model_digest(model) != state.model_digest(twin)
