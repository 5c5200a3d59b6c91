"""`ebbflow-train torchrun` and the opt-ins (`ebbflow_trainer.elastic`) without processes: the command
line, what a script finds in its environment, its exit status, the accumulation count, and the
in-memory handoff in one process (the trainer tier runs them across real worlds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT
from ebbflow_trainer import elastic
from ebbflow_trainer.__main__ import _parser, main
from ebbflow_trainer.config import TrainerConfig, from_environment
from ebbflow_trainer.launch.script import (
    ENV_TRAINER_CONFIG,
    ScriptExit,
    exit_code_of,
    fatal_exit,
    run_path,
    script_environment,
)


@pytest.fixture(autouse=True)
def _keep_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_path gives the script its command line, as the worker process it runs in does."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def test_the_script_and_its_own_flags_follow_the_launchers_flags() -> None:
    args = _parser().parse_args(
        ["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1", "--nproc-per-node", "9"]
    )
    assert (args.spec, args.nproc_per_node) == ("train.py", 2)
    assert args.script_args == ["--lr", "0.1", "--nproc-per-node", "9"], "the script's flags stay its own"


def test_a_missing_script_fails_before_joining_with_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in VALID_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    message = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_MESSAGE_PATH, str(message))
    code = main(["torchrun", "--state-dir", str(tmp_path / "state"), str(tmp_path / "absent.py"), "--x"])
    assert code == contract.EXIT_INVALID_CONFIG
    assert "absent.py' is not a file in this container" in capsys.readouterr().err
    assert "mounted volume" in message.read_text()


def _config(tmp_path: Path, **overrides: object) -> TrainerConfig:
    return from_environment(
        VALID_ENVIRONMENT, spec="train.py", state_dir=str(tmp_path / "state"), **overrides
    )


def test_the_script_meets_its_worlds_store_and_counts_worlds_as_restarts(tmp_path: Path) -> None:
    config = _config(tmp_path, script_args=("--lr", "0.1"))
    env = script_environment(config, generation=4, host="10.0.0.7", port=41234)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "41234")
    # Every rank is a client of the store rank 0 serves there, as torch's workers of an agent's store.
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "3", "three worlds before the fourth"
    assert env[contract.ENV_WORLD_GENERATION] == "4"
    assert TrainerConfig.from_json(env[ENV_TRAINER_CONFIG]) == config


@pytest.mark.parametrize(
    ("source", "status"),
    [
        pytest.param("pass", 0, id="returns"),
        pytest.param("import sys; sys.exit()", 0, id="sys-exit-none"),
        pytest.param("import sys; sys.exit(3)", 3, id="sys-exit-code"),
        pytest.param("import sys; sys.exit('bad flag')", 1, id="sys-exit-message"),
        pytest.param("raise ValueError('boom')", 1, id="raises"),
    ],
)
def test_a_scripts_exit_status_is_what_python_would_give(tmp_path: Path, source: str, status: int) -> None:
    script = tmp_path / "script.py"
    script.write_text(f"assert __name__ == '__main__'\n{source}\n")
    assert run_path(str(script), ("--a",)).code == status


def test_a_raised_exception_is_named_for_the_termination_message(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("raise ModuleNotFoundError(\"No module named 'wandb'\")\n")
    assert run_path(str(script), ()) == ScriptExit(1, "ModuleNotFoundError: No module named 'wandb'")


FAILED, DONE = ScriptExit(1, "ValueError: bad"), ScriptExit(0, "returned")


@pytest.mark.parametrize(
    ("ended", "world", "store_used", "code"),
    [
        pytest.param(FAILED, 2, False, contract.EXIT_SCRIPT_FAILED, id="failed-before-any-group"),
        pytest.param(FAILED, 1, False, contract.EXIT_SCRIPT_FAILED, id="failed-alone-before-its-group"),
        pytest.param(FAILED, 2, True, None, id="failed-in-a-group-a-peer-may-have-broken"),
        pytest.param(FAILED, 2, None, None, id="failed-and-rank-0-gone"),
        pytest.param(DONE, 2, False, contract.EXIT_INVALID_CONFIG, id="trained-alone-in-a-world-of-two"),
        pytest.param(DONE, 1, False, None, id="alone-in-a-world-of-one"),
        pytest.param(DONE, 2, True, None, id="trained-together"),
    ],
)
def test_only_a_scripts_own_failure_ends_the_job(
    ended: ScriptExit, world: int, store_used: bool | None, code: int | None
) -> None:
    fatal = fatal_exit(ended, world, store_used)
    assert (fatal and fatal[0]) == code
    if code == contract.EXIT_SCRIPT_FAILED:
        assert fatal is not None and "ValueError: bad" in fatal[1] and "fix the script" in fatal[1]
    if code == contract.EXIT_INVALID_CONFIG:
        assert fatal is not None and "init_process_group()" in fatal[1]


def test_a_scripts_arguments_are_its_command_line(tmp_path: Path) -> None:
    script, seen = tmp_path / "script.py", tmp_path / "argv.json"
    script.write_text(f"import json, sys\nopen({str(seen)!r}, 'w').write(json.dumps(sys.argv))\n")
    assert run_path(str(script), ("--steps", "5")).code == 0
    assert json.loads(seen.read_text()) == [str(script), "--steps", "5"]


def test_exit_code_of_a_message_is_one() -> None:
    assert exit_code_of(SystemExit("usage: ...")) == 1


@pytest.mark.parametrize(
    ("per_device", "global_batch", "steps"),
    [pytest.param(8, 64, 8, id="divides"), pytest.param(64, 64, 1, id="one-micro-batch")],
)
def test_accumulation_keeps_the_global_batch(per_device: int, global_batch: int, steps: int) -> None:
    assert elastic.accumulation_steps(per_device, global_batch) == steps


def test_an_accumulation_that_cannot_make_the_global_batch_names_the_fix() -> None:
    with pytest.raises(ValueError, match="not a multiple of per-device batch 12 x world size 1"):
        elastic.accumulation_steps(12, 64)


def test_outside_ebbflow_the_accumulation_needs_a_global_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TRAINER_CONFIG, raising=False)
    elastic.config.cache_clear()
    with pytest.raises(
        ValueError, match="pass global_batch=, or run the script with `ebbflow-train torchrun`"
    ):
        elastic.accumulation_steps(8)


def test_the_handoff_restores_only_a_newer_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_TRAINER_CONFIG, _config(tmp_path).to_json())
    elastic.config.cache_clear()
    model = torch.nn.Linear(3, 2)
    elastic.save(12, model=model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    assert elastic.restore(after=12, model=model) == 12, "the script's own checkpoint is as new"
    assert not torch.equal(model.weight, saved["weight"])
    assert elastic.restore(after=5, model=model) == 12
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    with pytest.raises(KeyError, match="holds no \\['optimizer'\\]"):
        elastic.restore(after=5, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    elastic.config.cache_clear()
