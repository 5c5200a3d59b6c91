"""Memory elasticity (spec.bandLimit, ebbflow_trainer.step.memory_budget): the budget choice, the footprint
measurement, the rate request in the step's message, the state, the configuration. The trainer tier
(tests/trainer/test_trainer_memory_budget.py) runs it with real processes."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT, trainer_config
from ebbflow_trainer import projected
from ebbflow_trainer.__main__ import main
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.config import ConfigError, from_environment
from ebbflow_trainer.launch import state
from ebbflow_trainer.step.bandlimit import BandLimitedConv2d
from ebbflow_trainer.step.engine import Requests, VirtualNodeEngine
from ebbflow_trainer.step.memory_budget import (
    MIB,
    RATES,
    Footprint,
    RateRequests,
    allowed_rates,
    budget_mib,
    decode_rate,
    encode_rate,
    smallest_fitting_rate,
)
from torch import nn

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "digits_cnn" / "train.py"
V = 4
# A worker holding 10 MiB between steps whose virtual node adds 120, 95, 70 or 50 MiB by rate.
FOOTPRINT = Footprint(10 * MIB, {0.0: 120 * MIB, 0.25: 95 * MIB, 0.5: 70 * MIB, 0.75: 50 * MIB})


@pytest.mark.parametrize(
    ("budget_mib_", "rates", "chosen", "fits"),
    [
        pytest.param(130, RATES, 0.0, True, id="full-spectrum-fits-exactly"),
        pytest.param(129, RATES, 0.25, True, id="one-step-down"),
        pytest.param(80, RATES, 0.5, True, id="half-the-spectrum"),
        pytest.param(60, RATES, 0.75, True, id="the-most-compressed-fits"),
        pytest.param(59, RATES, 0.75, False, id="nothing-fits-the-largest-rate"),
        pytest.param(60, (0.0, 0.25, 0.5), 0.5, False, id="capped-by-max-compression-rate"),
        pytest.param(10_000, (0.0,), 0.0, True, id="rate-zero-only"),
    ],
)
def test_the_smallest_rate_that_fits_the_budget(
    budget_mib_: int, rates: tuple[float, ...], chosen: float, fits: bool
) -> None:
    assert smallest_fitting_rate(FOOTPRINT, budget_mib_ * MIB, rates) == (chosen, fits)


@pytest.mark.parametrize(
    ("largest", "rates"),
    [
        pytest.param(0.75, RATES, id="default"),
        pytest.param(0.5, (0.0, 0.25, 0.5), id="half"),
        pytest.param(0.3, (0.0, 0.25), id="between-rates"),
        pytest.param(0.0, (0.0,), id="never-compress"),
    ],
)
def test_the_allowed_rates(largest: float, rates: tuple[float, ...]) -> None:
    assert allowed_rates(largest) == rates


def test_a_rate_travels_as_its_index_plus_one() -> None:
    assert [encode_rate(rate, RATES) for rate in RATES] == [1, 2, 3, 4]
    assert [decode_rate(float(code), RATES) for code in (1, 2, 3, 4)] == list(RATES)
    assert encode_rate(None, RATES) == 0 and decode_rate(0.0, RATES) is None
    assert decode_rate(5.0, RATES) is None, "a value past the list asks for nothing"


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        pytest.param("4096", 4096, id="whole"),
        pytest.param(" 512\n", 512, id="whitespace"),
        pytest.param("", None, id="empty"),
        pytest.param("0", None, id="zero"),
        pytest.param("4.5", None, id="fraction"),
        pytest.param("4Gi", None, id="unit"),
    ],
)
def test_the_budget_files_content(text: str, mib: int | None) -> None:
    assert budget_mib(text) == mib


# --- rank 0's reader: the budget file, one measurement, the rate asked for --------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rank_zero_asks_for_the_rate_that_fits_each_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, clock, consulted = tmp_path / "memory-budget-mib", _Clock(), []

    def footprint() -> Footprint:  # the engine's, measured the first time (see below)
        consulted.append(clock.now)
        return FOOTPRINT

    requests = RateRequests(trainer_config(memory_budget_file=str(path)), RATES, footprint, clock)
    assert requests.poll() == 0 and consulted == [], "no budget: nothing asked, nothing measured"
    seen = []
    with caplog.at_level(logging.WARNING, logger="ebbflow_trainer.step.memory_budget"):
        for text in ("80", "80", "1 GiB", "129", "", "40", "40"):
            path.write_text(text)
            clock.now += projected.READ_INTERVAL_SECONDS
            seen.append(requests.poll())
    assert seen == [3, 3, 3, 2, 2, 4, 4], "garbage or an empty file keeps the rate asked for"
    assert consulted == [1.0, 4.0, 6.0], "the footprint is needed for each new budget only"
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"ignoring the memory budget '1 GiB' in {path}: not a whole number of MiB",
        "no compression rate fits the memory budget of 40 MiB (60 MiB needed at rate 0.75): using that rate",
    ]


# --- the engine: conversion, the measurement, the request in the message, the state ----------------------


def _engine(mode: str = "deterministic", band_limit: bool = True, **changes: object) -> VirtualNodeEngine:
    torch.manual_seed(0)
    config = trainer_config(
        max_replicas=V,
        virtual_nodes=V,
        global_batch_size=32,
        mode="fast" if mode == "fast" else "deterministic",
        row_table_limit=0 if mode == "exact" else 2 << 20,
        band_limit=band_limit,
        **changes,
    )
    return VirtualNodeEngine(load_spec(str(EXAMPLE)), config)


def _layers(engine: VirtualNodeEngine) -> list[BandLimitedConv2d]:
    return [m for m in engine.spec.model.modules() if isinstance(m, BandLimitedConv2d)]


def test_a_band_limited_job_starts_at_rate_zero_whatever_the_script_set() -> None:
    engine = _engine()
    assert engine.rates == RATES and engine.compression_rate == 0.0
    layers = _layers(engine)
    assert len(layers) == 3 and not any(type(m) is nn.Conv2d for m in engine.spec.model.modules())
    assert {m.compression_rate for m in layers} == {0.0}, (
        "the example builds at 0.5; the trainer owns the rate"
    )


def test_a_job_without_band_limit_keeps_its_model_and_its_message() -> None:
    off, on = _engine(band_limit=False), _engine()
    assert off.rates == () and off.message_size(2) == on.message_size(2) - 1
    assert {m.compression_rate for m in _layers(off)} == {0.5}, "the script's own rate, untouched"


def _generators() -> tuple[object, ...]:
    return bytes(torch.get_rng_state().numpy()), random.getstate(), np.random.get_state()[1].tobytes()


def test_the_footprint_falls_with_the_rate_and_measuring_changes_nothing() -> None:
    engine = _engine()
    random.seed(3)
    np.random.seed(3)
    before = (state.model_digest(engine.spec.model), _generators())
    footprint = engine.measured_footprint()
    assert (state.model_digest(engine.spec.model), _generators()) == before
    assert engine.compression_rate == 0.0 and {m.compression_rate for m in _layers(engine)} == {0.0}
    assert all(p.grad is None for p in engine.spec.model.parameters())
    peaks = [footprint.peaks[rate] for rate in RATES]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks), peaks
    assert peaks[2] <= 0.75 * peaks[0], f"rate 0.5 keeps a quarter of each 2-D spectrum: {peaks}"
    parameters = sum(p.numel() * 4 for p in engine.spec.model.parameters())
    assert footprint.resident == 2 * parameters, "parameters and gradients (no momentum buffer yet)"
    assert engine.measured_footprint() is footprint, "measured once"


@pytest.mark.parametrize("mode", ["deterministic", "exact", "fast"])
def test_rank_zeros_rate_reaches_every_worker_in_the_steps_message(mode: str) -> None:
    workers = [_engine(mode), _engine(mode)]
    code = encode_rate(0.5, RATES)
    results = step_world(workers, 0, requests=[Requests(rate=code), Requests()])
    assert [r.requests for r in results] == [Requests(rate=code)] * 2
    assert [r.requests for r in step_world(workers, 1)] == [Requests()] * 2


def test_the_state_carries_the_rate_and_the_footprint() -> None:
    engine = _engine()
    engine.footprint = FOOTPRINT
    engine.switch_rate(0.75)
    saved = state.from_bytes(state.to_bytes(state.capture(engine, 5, 0.0)))
    newcomer = _engine()
    state.restore(newcomer, saved)
    assert newcomer.compression_rate == 0.75 and newcomer.footprint == FOOTPRINT
    assert {m.compression_rate for m in _layers(newcomer)} == {0.75}
    capped = _engine(max_compression_rate=0.5)
    state.restore(capped, saved)
    assert capped.compression_rate == 0.0, "a rate the job no longer allows goes back to 0"


# --- configuration ---------------------------------------------------------------------------------


def test_the_switch_and_the_largest_rate_come_from_the_contract() -> None:
    environment = {
        **VALID_ENVIRONMENT,
        contract.ENV_BAND_LIMIT: "true",
        contract.ENV_MAX_COMPRESSION_RATE: "0.5",
        contract.ENV_MEMORY_BUDGET_FILE: "/etc/ebbflow/memory-budget/memory-budget-mib",
    }
    config = from_environment(environment, gpus=0, spec="train.py")
    assert (config.band_limit, config.max_compression_rate) == (True, 0.5)
    assert config.memory_budget_file == "/etc/ebbflow/memory-budget/memory-budget-mib"
    assert not from_environment(VALID_ENVIRONMENT, gpus=0, spec="train.py").band_limit
    with pytest.raises(ConfigError, match=f"{contract.ENV_MAX_COMPRESSION_RATE}=1.0 .*less than 1"):
        from_environment({**environment, contract.ENV_MAX_COMPRESSION_RATE: "1"}, gpus=0, spec="train.py")
    with pytest.raises(ConfigError, match=f"{contract.ENV_MAX_COMPRESSION_RATE}='half' is not a number"):
        from_environment({**environment, contract.ENV_MAX_COMPRESSION_RATE: "half"}, gpus=0, spec="train.py")


def test_a_model_without_convolutions_fails_before_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "linear.py"
    script.write_text(
        "import torch\nfrom ebbflow_trainer import TrainingSpec\n"
        "def build():\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(128, 2), torch.randn(128, 1))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    return TrainingSpec(model=model, optimizer=optimizer, dataset=data,\n"
        "                        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))\n"
    )
    for name, value in {**VALID_ENVIRONMENT, contract.ENV_BAND_LIMIT: "true"}.items():
        monkeypatch.setenv(name, value)
    assert main(["run", str(script), "--state-dir", str(tmp_path / "state")]) == contract.EXIT_INVALID_CONFIG
    assert "has no torch.nn.Conv2d layer to band-limit" in capsys.readouterr().err


def test_the_switch_is_true_or_false() -> None:
    with pytest.raises(ConfigError, match=f"{contract.ENV_BAND_LIMIT}='yes' must be true or false"):
        from_environment({**VALID_ENVIRONMENT, contract.ENV_BAND_LIMIT: "yes"}, gpus=0, spec="train.py")
