"""Sharded training's settings: the spec's fields (checked when the script loads) and the job
settings a sharded job cannot honour yet (refused before joining), each naming the field and the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import SpecError, TrainingSpec
from ebbflow_trainer.step.fsdp import raised_by_a_collective
from ebbflow_trainer.step.selection import sharding_problem
from torch.utils.data import TensorDataset


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _spec(model: torch.nn.Module | None = None, **options: Any) -> TrainingSpec:
    model = model or _model()
    return TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)),
        loss_fn=lambda m, batch: m(batch[0]).sum(),
        **options,
    )


def test_a_spec_shards_the_modules_it_names() -> None:
    model = _model()
    spec = _spec(model, sharding="fsdp", shard_modules=[model[0], model[2]])
    assert spec.sharding == "fsdp" and list(spec.shard_modules) == [model[0], model[2]]


@pytest.mark.parametrize(
    ("options", "field", "fix"),
    [
        pytest.param({"sharding": "zero3"}, "sharding", "one of", id="unknown-sharding"),
        pytest.param(
            {"shard_modules": "first"}, "shard_modules", 'sharding="fsdp"', id="modules-without-sharding"
        ),
        pytest.param(
            {"sharding": "fsdp", "shard_modules": [torch.nn.Linear(2, 2)]},
            "shard_modules[0]",
            "model's own modules",
            id="a-module-of-another-model",
        ),
        pytest.param(
            {"sharding": "fsdp", "shard_modules": "model"}, "shard_modules[0]", "submodules", id="root"
        ),
        pytest.param(
            {"sharding": "fsdp", "buddy_every": -1}, "buddy_every", ">= 0", id="negative-buddy-every"
        ),
        pytest.param(
            {"sharding": "fsdp", "buddy_every": 1.5}, "buddy_every", "whole number", id="fractional"
        ),
        pytest.param(
            {"sharding": "fsdp", "shard_gather": "per_unit"}, "shard_gather", "per_step", id="unknown-gather"
        ),
        pytest.param({"shard_gather": "per_step"}, "shard_gather", 'sharding="fsdp"', id="gather-unsharded"),
    ],
)
def test_invalid_sharding_settings_name_the_field_and_the_fix(
    options: dict[str, Any], field: str, fix: str
) -> None:
    model = _model()
    if options.get("shard_modules") == "first":
        options["shard_modules"] = [model[0]]
    if options.get("shard_modules") == "model":
        options["shard_modules"] = [model]
    with pytest.raises(SpecError, match=re.escape(f"TrainingSpec.{field}")) as raised:
        _spec(model, **options)
    assert fix in str(raised.value)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        pytest.param({"mode": "deterministic"}, "--mode=fast", id="deterministic-mode"),
        pytest.param({"batching": "dynamic"}, contract.ENV_BATCHING, id="dynamic-batching"),
        pytest.param({"lr_scaling": "adascale"}, contract.ENV_LR_SCALING, id="adascale"),
        pytest.param({"band_limit": True}, contract.ENV_BAND_LIMIT, id="band-limit"),
        pytest.param({"checkpoint_path": ""}, contract.ENV_CHECKPOINT_PATH, id="no-durable-checkpoint"),
    ],
)
def test_settings_a_sharded_job_cannot_honour_are_named(changes: dict[str, Any], named: str) -> None:
    settings: dict[str, Any] = {"mode": "fast", "checkpoint_path": "/checkpoints", **changes}
    problem = sharding_problem(_spec(sharding="fsdp"), trainer_config(**settings))
    assert problem is not None and named in problem


@pytest.mark.parametrize("lr_scaling", ["none", "linear", "sqrt"])
def test_a_sharded_job_in_fast_mode_with_a_checkpoint_is_accepted(lr_scaling: str) -> None:
    config = trainer_config(mode="fast", checkpoint_path="/checkpoints", lr_scaling=lr_scaling)
    assert sharding_problem(_spec(sharding="fsdp"), config) is None


def test_a_replicated_job_has_no_sharding_problem() -> None:
    assert sharding_problem(_spec(), trainer_config(mode="deterministic")) is None


def test_only_errors_out_of_a_collective_re_form_the_world() -> None:
    def users_bug() -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError) as raised:
        users_bug()
    assert not raised_by_a_collective(raised.value)
    assert raised_by_a_collective(torch.distributed.DistBackendError("peer gone"))


def test_a_replicated_worker_and_the_spec_check_never_import_fsdp() -> None:
    # FSDP's import costs every worker's and launcher's start about 3 s of CPU (selection's docstring).
    probe = (
        "import sys, ebbflow_trainer.__main__, ebbflow_trainer.launch.worker, ebbflow_trainer.step.selection;"
        "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.fsdp')))"
    )
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]", imported.stdout
