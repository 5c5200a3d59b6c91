"""Momentum correction (spec.momentumCorrection): the rule, its guard, the velocity it rescales, and
a run whose B changes mid-way against runs that had one B throughout."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ebbflow_api import contract
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT, trainer_config
from ebbflow_trainer.__main__ import main
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import ConfigError, from_environment
from ebbflow_trainer.lr_scaling import (
    MomentumCorrection,
    corrected_momentum,
    momentum_correction_problem,
    momentum_lr_multiplier,
)
from ebbflow_trainer.step.engine import VirtualNodeEngine
from torch.utils.data import TensorDataset


@pytest.mark.parametrize(
    ("base", "factor", "momentum", "multiplier"),
    [
        pytest.param(0.9, 1.0, 0.9, 1.0, id="base-batch-identity"),
        pytest.param(0.9, 4.0, 0.9**4, 4 * (1 - 0.9**4) / 0.1, id="linear-x4"),
        pytest.param(0.9, 2.0, 0.81, 2 * 0.19 / 0.1, id="linear-x2"),
        pytest.param(0.9, 0.5, 0.9**0.5, 0.5 * (1 - 0.9**0.5) / 0.1, id="batch-halved"),
        pytest.param(0.5, 3.0, 0.125, 3 * 0.875 / 0.5, id="low-momentum"),
    ],
)
def test_the_rule(base: float, factor: float, momentum: float, multiplier: float) -> None:
    assert corrected_momentum(base, factor) == pytest.approx(momentum)
    assert momentum_lr_multiplier(base, factor) == pytest.approx(multiplier)
    # What it keeps: the effective learning rate lr / (1 - m) scaled by the factor.
    effective = momentum_lr_multiplier(base, factor) / (1 - corrected_momentum(base, factor))
    assert effective == pytest.approx(factor / (1 - base))


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.mark.parametrize(
    ("optimizer", "problem"),
    [
        pytest.param(lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9), None, id="sgd-momentum"),
        pytest.param(
            lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9, nesterov=True), None, id="nesterov"
        ),
        pytest.param(lambda: torch.optim.SGD(_params(), lr=0.1), "has no momentum", id="sgd-without"),
        pytest.param(lambda: torch.optim.Adam(_params()), "the optimizer is Adam", id="adam"),
    ],
)
def test_only_sgd_with_momentum_can_be_corrected(optimizer: object, problem: str | None) -> None:
    made = optimizer()  # type: ignore[operator]
    found = momentum_correction_problem(made)
    assert (found is None) if problem is None else (problem in (found or ""))
    if problem is not None:
        with pytest.raises(ValueError, match=problem):
            MomentumCorrection(made)


def test_the_velocity_is_rescaled_so_what_momentum_remembers_stays() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.grad = torch.tensor([1.0, -2.0])
    optimizer.step()  # velocity = gradient
    correction = MomentumCorrection(optimizer)
    remembered = (1 - 0.9) * optimizer.state[param]["momentum_buffer"].clone()
    assert correction.apply(4.0) == [pytest.approx(4 * (1 - 0.9**4) / 0.1)]
    momentum = optimizer.param_groups[0]["momentum"]
    assert momentum == pytest.approx(0.9**4)
    torch.testing.assert_close((1 - momentum) * optimizer.state[param]["momentum_buffer"], remembered)
    correction.apply(4.0)
    torch.testing.assert_close((1 - momentum) * optimizer.state[param]["momentum_buffer"], remembered)
    assert correction.apply(1.0) == [1.0] and optimizer.param_groups[0]["momentum"] == 0.9
    torch.testing.assert_close(optimizer.state[param]["momentum_buffer"], torch.tensor([1.0, -2.0]))


def test_the_switch_comes_from_the_contract_and_needs_lr_scaling() -> None:
    def config(**env: str) -> object:
        return from_environment({**VALID_ENVIRONMENT, **env}, spec="s.py", state_dir="/tmp/x")

    on = {contract.ENV_MOMENTUM_CORRECTION: "true", contract.ENV_LR_SCALING: "linear"}
    assert config(**on).momentum_correction is True  # type: ignore[attr-defined]
    assert config().momentum_correction is False  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=f"{contract.ENV_MOMENTUM_CORRECTION}='yes' must be true or false"):
        config(**{**on, contract.ENV_MOMENTUM_CORRECTION: "yes"})
    with pytest.raises(ConfigError, match=r"spec\.momentumCorrection needs spec\.lrScaling"):
        config(**{contract.ENV_MOMENTUM_CORRECTION: "true"})


def test_a_script_without_sgd_momentum_fails_before_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "adam.py"
    script.write_text(
        "import torch\nfrom ebbflow_trainer import TrainingSpec\n"
        "def build():\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(128, 2), torch.randn(128, 1))\n"
        "    return TrainingSpec(model=model, optimizer=torch.optim.Adam(model.parameters()), dataset=data,\n"
        "                        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))\n"
    )
    environment = {
        **VALID_ENVIRONMENT,
        contract.ENV_LR_SCALING: "linear",
        contract.ENV_MOMENTUM_CORRECTION: "true",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(["run", str(script), "--state-dir", str(tmp_path / "state")]) == contract.EXIT_INVALID_CONFIG
    error = capsys.readouterr().err
    assert (
        f"{contract.ENV_MOMENTUM_CORRECTION}=true (spec.momentumCorrection), but the optimizer is Adam"
        in error
    )
    assert "use torch.optim.SGD with momentum" in error


# --- a run whose B changes mid-way ----------------------------------------------------------------

SAMPLES, FEATURES = 1024, 8
B0, B1, V = 8, 64, 4
LR, MOMENTUM = 0.005, 0.9
SWITCH_AT = 2 * SAMPLES  # samples at B0 before the switch (a multiple of B1)
TOTAL = 8 * SAMPLES
# log(loss / reference loss) at every sample count the runs share after the switch: the corrected
# run stays within BAND of both references (measured 0.023 and 0.008), the uncorrected one leaves it
# (0.098 and 0.100).
BAND = 0.05


def _problem() -> tuple[torch.Tensor, torch.Tensor]:
    """Least squares with curvatures from 1 down to 0.01: momentum matters on the slow directions."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(SAMPLES, FEATURES, generator=generator) * torch.logspace(0, -1, FEATURES)
    truth = 3 * torch.randn(FEATURES, generator=generator)
    return features, features @ truth + 0.1 * torch.randn(SAMPLES, generator=generator)


def _spec() -> TrainingSpec:
    features, targets = _problem()
    model = torch.nn.Linear(FEATURES, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    return TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        dataset=TensorDataset(features, targets),
        loss_fn=lambda m, batch: F.mse_loss(m(batch[0]).squeeze(1), batch[1]) / 2,
    )


def _loss_curve(first: int, then: int, corrected: bool) -> dict[int, float]:
    """Full-data loss after every step, by samples seen: B=first until SWITCH_AT, then B=then."""
    torch.manual_seed(0)
    spec = _spec()
    config = trainer_config(virtual_nodes=V, global_batch_size=first, base_batch_size=B0, lr_scaling="linear")
    engine = VirtualNodeEngine(spec, dataclasses.replace(config, momentum_correction=corrected))
    features, targets = _problem()
    curve, seen, step = {}, 0, 0
    while seen < TOTAL:
        if seen == SWITCH_AT and engine.global_batch_size != then:
            engine.switch_batch(step, then)
        seen += engine.global_batch_size
        step_world([engine], step)
        step += 1
        with torch.no_grad():
            curve[seen] = float(F.mse_loss(spec.model(features).squeeze(1), targets)) / 2
    engine.close()
    return curve


def _deviation(run: dict[int, float], reference: dict[int, float]) -> float:
    shared = [s for s in run if s > SWITCH_AT and s in reference]
    assert len(shared) >= (TOTAL - SWITCH_AT) // B1
    return max(abs(math.log(run[s] / reference[s])) for s in shared)


def test_a_mid_run_batch_change_stays_on_the_curve_of_runs_that_had_one_batch() -> None:
    """B 8 -> 64 with linear LR scaling. With the correction, the run's loss by samples seen stays
    within BAND of a run at B=64 from the start and of the tuned run at B=8; without it, momentum
    remembers 8 times as many samples after the switch and the curve leaves the band."""
    at_b1 = _loss_curve(B1, B1, corrected=True)
    at_b0 = _loss_curve(B0, B0, corrected=True)
    corrected = _loss_curve(B0, B1, corrected=True)
    uncorrected = _loss_curve(B0, B1, corrected=False)
    deviations = {
        "corrected vs B1": _deviation(corrected, at_b1),
        "corrected vs B0": _deviation(corrected, at_b0),
        "uncorrected vs B1": _deviation(uncorrected, at_b1),
        "uncorrected vs B0": _deviation(uncorrected, at_b0),
    }
    assert deviations["corrected vs B1"] < BAND and deviations["corrected vs B0"] < BAND, deviations
    assert deviations["uncorrected vs B1"] > BAND and deviations["uncorrected vs B0"] > BAND, deviations
