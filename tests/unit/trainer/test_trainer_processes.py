"""Several training processes per pod: the settings that allow it, and each process's own state files."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT, trainer_config
from ebbflow_trainer.config import ConfigError, TrainerConfig, from_environment
from ebbflow_trainer.data import to_device
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.collectives import resolve_backend, training_device
from ebbflow_trainer.launch.launcher import Markers

# VALID_ENVIRONMENT: max 4 replicas, V=8, B=64.


def _config(gpus: int = 0, **flags: object) -> TrainerConfig:
    return from_environment(VALID_ENVIRONMENT, gpus=gpus, spec="train.py", state_dir="/tmp/x", **flags)


def test_processes_per_pod_default_to_the_visible_gpus_else_one() -> None:
    assert _config(gpus=0).nproc_per_node == 1
    assert _config(gpus=2).nproc_per_node == 2
    assert _config(gpus=2, nproc_per_node=1).nproc_per_node == 1
    assert _config(gpus=0, nproc_per_node=2).nproc_per_node == 2  # CPU processes: tests, debugging
    assert _config(nproc_per_node=None).backend == "auto"


def test_every_process_of_the_largest_world_needs_a_virtual_node() -> None:
    with pytest.raises(ConfigError) as error:
        _config(nproc_per_node=4)  # 4 replicas x 4 processes = 16 > V=8
    message = str(error.value)
    assert contract.ENV_VIRTUAL_NODES in message and contract.ENV_MAX_REPLICAS in message
    assert "--nproc-per-node=4" in message and "at least 16" in message
    env = {**VALID_ENVIRONMENT, contract.ENV_VIRTUAL_NODES: "16"}
    config = from_environment(env, gpus=4, spec="train.py", state_dir="/tmp/x")
    assert (config.nproc_per_node, config.virtual_nodes) == (4, 16)


@pytest.mark.parametrize(
    ("gpus", "flags", "advice"),
    [
        (0, {"nproc_per_node": 0}, "--nproc-per-node=0 must be at least 1"),
        (0, {"backend": "mpi"}, "--backend='mpi' must be one of"),
        (0, {"backend": "nccl"}, "--backend=nccl needs CUDA GPUs"),
        (1, {"nproc_per_node": 2}, "exceeds the 1 GPUs visible"),
    ],
)
def test_invalid_process_and_backend_settings_are_named(
    gpus: int, flags: dict[str, object], advice: str
) -> None:
    with pytest.raises(ConfigError, match=advice):
        _config(gpus=gpus, **flags)


def test_the_backend_and_device_follow_cuda_unless_overridden() -> None:
    cuda = torch.cuda.is_available()
    assert resolve_backend(trainer_config()) == ("nccl" if cuda else "gloo")
    assert resolve_backend(trainer_config(backend="gloo")) == "gloo"
    assert training_device(0) == (torch.device("cuda", 0) if cuda else torch.device("cpu"))


def test_each_local_process_has_its_own_handoff_and_markers(tmp_path: Path) -> None:
    assert state.local_dir(tmp_path, 1) == tmp_path / "local-1"
    markers = Markers(tmp_path, 2)
    assert [m.parent.name for m in markers.left] == ["local-0", "local-1"]
    assert markers.graceful()  # nobody inside a step
    for marker in markers.training:
        marker.touch()
    assert not markers.graceful()
    markers.left[0].touch()
    assert not markers.graceful(), "local rank 1 is still inside a step"
    markers.left[1].touch()
    assert markers.graceful()
    markers.training[0].unlink()
    markers.left[0].unlink()
    assert markers.graceful(), "local rank 0 was between steps, local rank 1 left"
    markers.mark_leaving()
    assert all(m.exists() for m in markers.leaving)
    markers.clear()
    assert not any(m.exists() for m in (*markers.left, *markers.training, *markers.leaving))


def test_a_new_launcher_finds_no_marker_an_earlier_process_left(tmp_path: Path) -> None:
    """A leaving marker left on the volume would make the next launcher's workers give their shards away."""
    Markers(tmp_path, 1).mark_leaving()
    markers = Markers(tmp_path, 1)
    assert not any(m.exists() for m in (*markers.left, *markers.training, *markers.leaving))


def test_a_captured_state_holds_cpu_tensors_and_keeps_the_state_dict_metadata() -> None:
    model = torch.nn.BatchNorm1d(3)
    captured = state._to_cpu(model.state_dict())
    assert isinstance(captured, OrderedDict) and hasattr(captured, "_metadata")
    assert all(t.device.type == "cpu" for t in captured.values())
    nested = state._to_cpu({"a": [torch.ones(1), (torch.zeros(1), 3)], "b": "x"})
    assert nested["b"] == "x" and nested["a"][1][1] == 3
    model.load_state_dict(state.from_bytes(state.to_bytes({"m": captured}))["m"])


def test_batches_move_to_the_device_in_any_structure() -> None:
    batch = {"x": [torch.ones(2)], "y": (torch.zeros(1), "label")}
    assert to_device(batch, torch.device("cpu")) is batch
    moved = to_device(batch, torch.device("meta"))
    assert moved["x"][0].device.type == "meta" and moved["y"][1] == "label"
