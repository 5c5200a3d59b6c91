"""States on disk (node-local handoffs, checkpoints) load as data only, and the RNG state survives."""

from __future__ import annotations

import copy
import hashlib
import io
import os
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from ebbflow_trainer.launch import state


class _RunsCode:
    """Unpickling this calls os.system: what a hostile checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _hostile_payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"step": 3, "model": _RunsCode(marker)}, buffer)
    return buffer.getvalue()


def _framed(payload: bytes) -> bytes:
    """`payload` with a valid header and checksum: only weights_only stands between it and a worker."""
    return state.MAGIC + hashlib.sha256(payload).digest() + payload


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(lambda payload: payload, "not an Ebbflow state", id="bare-pickle"),
        pytest.param(_framed, "cannot be loaded safely", id="valid-checksum-pickled-callable"),
    ],
)
def test_a_state_that_would_run_code_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, frame: Callable[[bytes], bytes], reason: str
) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "checkpoint.pt"
    hostile.write_bytes(frame(_hostile_payload(marker)))
    assert state.read(hostile) is None
    assert not marker.exists(), "loading the state ran code"
    assert f"refusing the state in {hostile}" in caplog.text and reason in caplog.text


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(lambda data: data[: len(data) // 2], "checksum mismatch", id="truncated"),
        pytest.param(lambda data: data[:20], "not an Ebbflow state", id="header-cut"),
        pytest.param(_flip_last_byte, "checksum mismatch", id="one-bit-flipped"),
        pytest.param(lambda data: b"", "not an Ebbflow state", id="empty"),
    ],
)
def test_a_damaged_state_is_refused_naming_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes], reason: str
) -> None:
    whole = state.to_bytes({"step": 1, "weights": torch.ones(3)})
    assert state.from_bytes(whole)["step"] == 1
    (tmp_path / "bad.pt").write_bytes(damage(whole))
    assert state.read(tmp_path / "bad.pt") is None
    assert reason in caplog.text


def test_a_missing_state_reads_as_none_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert state.read(tmp_path / "absent.pt") is None
    assert not caplog.text


def _checkpoint(step: int) -> bytes:
    return state.to_bytes({"step": step, "weights": torch.full((3,), float(step))})


@pytest.mark.parametrize(
    ("damage_newest", "damage_previous", "resumed"),
    [
        pytest.param(False, False, 2, id="newest"),
        pytest.param(True, False, 1, id="newest-corrupt-previous-used"),
        pytest.param(False, True, 2, id="previous-corrupt-unused"),
        pytest.param(True, True, None, id="both-corrupt-fresh-start"),
    ],
)
def test_checkpoints_keep_the_last_two_and_fall_back(
    tmp_path: Path, damage_newest: bool, damage_previous: bool, resumed: int | None
) -> None:
    path = tmp_path / state.CHECKPOINT_FILE
    for step in (0, 1, 2):  # three writes: the oldest is gone, the last two stay
        state.write_checkpoint(_checkpoint(step), path)
    previous = state.previous_checkpoint(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, previous.name])
    for damaged, file in ((damage_newest, path), (damage_previous, previous)):
        if damaged:
            file.write_bytes(_flip_last_byte(file.read_bytes()))
    found = state.read_checkpoint(path)
    assert (found["step"] if found is not None else None) == resumed


def test_every_rename_is_followed_by_a_sync_of_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    state.write_checkpoint(_checkpoint(1), tmp_path / state.CHECKPOINT_FILE)
    assert synced[-1] == str(tmp_path), synced


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
