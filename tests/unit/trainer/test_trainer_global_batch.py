"""Batch-size co-adaptation (spec.maxGlobalBatchSize), in-process: the configuration, the requested B
read from the file, its trip through the step's message, the data position across a switch, the
AdaScale gain at the new B and the state that carries it."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ebbflow_api import contract
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT, trainer_config
from ebbflow_trainer import global_batch, projected
from ebbflow_trainer.__main__ import main
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import ROW_TABLE_LIMIT, ConfigError, TrainerConfig, from_environment
from ebbflow_trainer.data import VirtualNodeLoader
from ebbflow_trainer.global_batch import Request, RequestFile, requested_batch
from ebbflow_trainer.launch import state
from ebbflow_trainer.lr_scaling import adascale_gain
from ebbflow_trainer.sharding import DataPosition, derived_seed, virtual_node_indices
from ebbflow_trainer.step.engine import Requests, StepResult, VirtualNodeEngine
from torch.utils.data import TensorDataset

V, B, MAX = 4, 16, 32
DIGITS = str(Path(__file__).resolve().parents[3] / "examples" / "digits" / "train.py")
# VALID_ENVIRONMENT: V=8, B=64, replicas 1-4; co-adaptation needs adascale.
ADAPTIVE = {contract.ENV_LR_SCALING: "adascale", contract.ENV_MAX_GLOBAL_BATCH_SIZE: "128"}
FILE = {contract.ENV_GLOBAL_BATCH_SIZE_FILE: "/etc/ebbflow/global-batch-size"}


def _from_environment(**overrides: str) -> TrainerConfig:
    return from_environment({**VALID_ENVIRONMENT, **overrides}, spec="s.py", state_dir="/tmp/x")


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({}, (None, ""), id="absent-feature-off"),
        pytest.param({contract.ENV_MAX_GLOBAL_BATCH_SIZE: ""}, (None, ""), id="empty-feature-off"),
        pytest.param(
            FILE, (None, FILE[contract.ENV_GLOBAL_BATCH_SIZE_FILE]), id="file-without-max-never-read"
        ),
        pytest.param(ADAPTIVE, (128, ""), id="max-without-file-b-stays"),
        pytest.param(
            {**ADAPTIVE, **FILE}, (128, FILE[contract.ENV_GLOBAL_BATCH_SIZE_FILE]), id="max-and-file"
        ),
        pytest.param({**ADAPTIVE, contract.ENV_MAX_GLOBAL_BATCH_SIZE: "64"}, (64, ""), id="max-equal-to-b"),
    ],
)
def test_the_largest_batch_and_its_file_are_read(
    overrides: dict[str, str], expected: tuple[Any, str]
) -> None:
    config = _from_environment(**overrides)
    assert (config.max_global_batch_size, config.global_batch_size_file) == expected
    assert config.global_batch_size == 64, "the spec's B stays the starting B and the AdaScale base"
    assert TrainerConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    ("max_value", "lr_scaling", "named", "advice"),
    [
        pytest.param(
            "lots", "adascale", [contract.ENV_MAX_GLOBAL_BATCH_SIZE], "whole number", id="not-a-number"
        ),
        pytest.param(
            "0", "adascale", [contract.ENV_MAX_GLOBAL_BATCH_SIZE], "greater than or equal to 1", id="zero"
        ),
        pytest.param(
            "32",
            "adascale",
            [contract.ENV_MAX_GLOBAL_BATCH_SIZE, contract.ENV_GLOBAL_BATCH_SIZE],
            "raise it or leave it unset",
            id="below-b",
        ),
        pytest.param(
            "100", "adascale", [contract.ENV_MAX_GLOBAL_BATCH_SIZE], "round it to a multiple", id="not-mod-v"
        ),
        pytest.param(
            "128",
            "sqrt",
            [contract.ENV_MAX_GLOBAL_BATCH_SIZE, contract.ENV_LR_SCALING],
            "set lrScaling: adascale",
            id="without-adascale",
        ),
        pytest.param(
            "128",
            "",
            [contract.ENV_MAX_GLOBAL_BATCH_SIZE, contract.ENV_LR_SCALING],
            "adascale",
            id="lr-default",
        ),
    ],
)
def test_an_invalid_largest_batch_is_named_with_a_fix(
    max_value: str, lr_scaling: str, named: list[str], advice: str
) -> None:
    overrides = {contract.ENV_MAX_GLOBAL_BATCH_SIZE: max_value, contract.ENV_LR_SCALING: lr_scaling}
    with pytest.raises(ConfigError) as error:
        _from_environment(**overrides, **FILE)
    assert all(name in str(error.value) for name in named) and advice in str(error.value), error.value


def test_a_largest_batch_beyond_the_dataset_fails_before_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The digits example holds 1437 training images: no step could take 2048 of them."""
    for name, value in {**VALID_ENVIRONMENT, **ADAPTIVE, contract.ENV_MAX_GLOBAL_BATCH_SIZE: "2048"}.items():
        monkeypatch.setenv(name, value)
    code = main(["run", DIGITS, "--state-dir", str(tmp_path / "state")])
    assert code == contract.EXIT_INVALID_CONFIG
    error = capsys.readouterr().err
    assert f"{contract.ENV_MAX_GLOBAL_BATCH_SIZE}=2048 exceeds the 1437 samples" in error, error


# --- the requested B -----------------------------------------------------------------------------

CONFIG = trainer_config(
    max_replicas=V, virtual_nodes=V, global_batch_size=B, lr_scaling="adascale", max_global_batch_size=MAX
)


@pytest.mark.parametrize(
    ("text", "batch", "ignored"),
    [
        pytest.param("", None, None, id="empty-no-request"),
        pytest.param(" \n", None, None, id="blank-no-request"),
        pytest.param("24", 24, None, id="allowed"),
        pytest.param("32\n", 32, None, id="max-with-newline"),
        pytest.param("16", 16, None, id="back-to-spec-b"),
        pytest.param("18", None, "multiple of spec.virtualNodes", id="not-a-multiple-of-v"),
        pytest.param("12", None, "outside [spec.globalBatchSize", id="below-spec-b"),
        pytest.param("36", None, "outside [spec.globalBatchSize", id="above-max"),
        pytest.param("0", None, "outside [spec.globalBatchSize", id="zero"),
        pytest.param("-24", None, "whole number", id="negative"),
        pytest.param("+24", None, "whole number", id="signed"),
        pytest.param("2.4e1", None, "whole number", id="float"),
        pytest.param("2_4", None, "whole number", id="underscore"),
        pytest.param("many", None, "whole number", id="words"),
    ],
)
def test_the_requested_batch_is_checked_against_the_spec(
    text: str, batch: int | None, ignored: str | None
) -> None:
    request = requested_batch(text, CONFIG)
    assert request.batch == batch
    assert (request.ignored is None) == (ignored is None)
    assert ignored is None or ignored in str(request.ignored), request.ignored


def test_without_a_largest_batch_every_request_is_ignored() -> None:
    off = trainer_config(max_replicas=V, virtual_nodes=V, global_batch_size=B)
    assert requested_batch("16", off) == Request(None, requested_batch("16", off).ignored)
    assert "maxGlobalBatchSize is unset" in str(requested_batch("16", off).ignored)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rank_zero_reads_the_file_at_most_once_a_second_and_logs_an_ignored_value_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "global-batch-size"
    clock = _Clock()
    reader = RequestFile(dataclasses.replace(CONFIG, global_batch_size_file=str(path)), clock)
    assert reader.poll() == 0, "a missing file asks for nothing"
    path.write_text("24")
    assert reader.poll() == 0, "read again only after the interval"
    clock.now += projected.READ_INTERVAL_SECONDS
    assert reader.poll() == 24
    path.write_text("18")
    with caplog.at_level(logging.WARNING, logger="ebbflow_trainer.global_batch"):
        for _ in range(5):
            clock.now += projected.READ_INTERVAL_SECONDS
            assert reader.poll() == 0, "an ignored value asks for nothing"
    ignored = [r for r in caplog.records if "ignoring the global batch size" in r.getMessage()]
    assert len(ignored) == 1 and "'18'" in ignored[0].getMessage() and str(path) in ignored[0].getMessage()
    path.write_text("")
    clock.now += projected.READ_INTERVAL_SECONDS
    assert reader.poll() == 0


def test_an_unreadable_or_garbled_file_asks_for_nothing_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "global-batch-size"
    path.mkdir()  # reading it fails with an OSError
    clock = _Clock()
    reader = RequestFile(dataclasses.replace(CONFIG, global_batch_size_file=str(path)), clock)
    with caplog.at_level(logging.WARNING, logger="ebbflow_trainer.global_batch"):
        for _ in range(3):
            clock.now += projected.READ_INTERVAL_SECONDS
            assert reader.poll() == 0
        path.rmdir()
        path.write_bytes(b"\xff\xfe" * 100)
        clock.now += projected.READ_INTERVAL_SECONDS
        assert reader.poll() == 0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "cannot read the global batch size" in messages[0]
    assert "not a whole number" in messages[1] and len(messages[1]) < 300, "the content is cut short"


@pytest.mark.parametrize(
    ("largest", "digits"),
    [(None, 0), (1, 1), (255, 1), (256, 2), (65_535, 2), (65_536, 3), (2**24, 4)],
    ids=["off", "1", "255", "256", "65535", "65536", "2^24"],
)
def test_the_request_takes_enough_base_256_digits(largest: int | None, digits: int) -> None:
    assert global_batch.digits(trainer_config(max_global_batch_size=largest)) == digits
    for batch in {0, 1, largest, largest // 3} if largest else {0}:
        encoded = global_batch.encode(batch, digits)
        assert len(encoded) == digits and all(0 <= d < 256 for d in encoded)
        # Exact even in bfloat16 (8 significant bits), a model's message dtype at its smallest.
        as_bf16 = torch.tensor(encoded, dtype=torch.bfloat16).tolist()
        assert global_batch.decode(as_bf16) == batch


def test_a_batch_beyond_the_digits_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        global_batch.encode(256, 1)


# --- the data position -----------------------------------------------------------------------------

N = 100


def _indices(position: DataPosition, step: int, virtual_nodes: int = V) -> torch.Tensor:
    return torch.cat(
        [
            virtual_node_indices(
                seed=5,
                step=step,
                virtual_node=k,
                num_samples=N,
                virtual_nodes=virtual_nodes,
                position=position,
            )
            for k in range(virtual_nodes)
        ]
    )


def _permutation(epoch: int) -> torch.Tensor:
    return torch.randperm(N, generator=torch.Generator().manual_seed(derived_seed(5, epoch)))


def test_a_constant_batch_keeps_the_step_arithmetic() -> None:
    """Step s at B: epoch s // (N // B), offset (s mod (N // B)) x B, as before B could change."""
    position = DataPosition(B)
    for step in range(20):
        epoch, in_epoch = divmod(step, N // B)
        assert position.start(step, N) == (epoch, in_epoch * B)
        assert torch.equal(_indices(position, step), _permutation(epoch)[in_epoch * B : (in_epoch + 1) * B])
        assert position.samples_at(step) == step * B


@pytest.mark.parametrize(
    ("switch_at", "batches"),
    [
        pytest.param(2, [16, 32], id="grow-mid-epoch"),
        pytest.param(3, [32, 16], id="shrink-mid-epoch"),
        pytest.param(5, [16, 24], id="grow-where-the-rest-no-longer-fits"),
        pytest.param(6, [16, 32, 24, 16], id="several-switches-across-epochs"),
    ],
)
def test_a_switch_continues_the_sample_stream_without_a_gap_or_a_repeat(
    switch_at: int, batches: list[int]
) -> None:
    """The samples of every epoch are its permutation's prefix, in order; only an epoch's tail that no
    longer holds a whole batch is skipped, and samples_at counts what was trained on."""
    position, taken, total = DataPosition(batches[0]), [], 0
    for step in range(24):
        due = step // switch_at if step else 0
        if step and step % switch_at == 0 and due < len(batches):
            position = position.switched(step, batches[due], N)
        epoch, offset = position.start(step, N)
        indices = _indices(position, step)
        assert indices.numel() == position.global_batch_size and position.samples_at(step) == total
        taken.append((epoch, offset, indices))
        total += position.global_batch_size
    for epoch in {e for e, _, _ in taken}:
        steps = [(offset, indices) for e, offset, indices in taken if e == epoch]
        consumed = torch.cat([indices for _, indices in steps])
        assert steps[0][0] == 0 and torch.equal(consumed, _permutation(epoch)[: consumed.numel()])
        if epoch + 1 in {e for e, _, _ in taken}:
            next_batch = next(indices.numel() for e, _, indices in taken if e == epoch + 1)
            assert N - consumed.numel() < next_batch, "an epoch ended while a whole batch still fitted"


def test_a_switch_at_the_positions_own_step_only_changes_the_batch() -> None:
    position = DataPosition(B, step=7, epoch=1, offset=48, samples=160)
    assert position.switched(7, MAX, N) == DataPosition(MAX, step=7, epoch=1, offset=48, samples=160)
    with pytest.raises(ValueError, match="before"):
        position.start(6, N)


# --- the engine: the request in the message, the switch, AdaScale, the state -------------------------


def _loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _engine(mode: str = "deterministic", largest: int | None = MAX, **changes: Any) -> VirtualNodeEngine:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    features, labels = torch.randn(96, 6, generator=data), torch.randint(0, 3, (96,), generator=data)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    spec = TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        dataset=TensorDataset(features, labels),
        loss_fn=_loss,
        **changes,
    )
    config = trainer_config(
        max_replicas=V,
        virtual_nodes=V,
        global_batch_size=B,
        lr_scaling="adascale",
        max_global_batch_size=largest,
        mode="fast" if mode == "fast" else "deterministic",
        row_table_limit=0 if mode == "exact" else ROW_TABLE_LIMIT,
    )
    return VirtualNodeEngine(spec, config)


def _step(workers: list[VirtualNodeEngine], step: int, requests: list[int]) -> list[StepResult]:
    """One step of two simulated workers (virtual nodes split evenly), worker r asking for requests[r]."""
    return step_world(workers, step, requests=[Requests(batch=b) for b in requests])


@pytest.mark.parametrize("mode", ["deterministic", "exact", "fast"])
def test_rank_zeros_request_reaches_every_worker_in_the_steps_message(mode: str) -> None:
    workers = [_engine(mode), _engine(mode)]
    assert workers[0].message_size(2) == _engine(mode, largest=None).message_size(2) + 1, (
        "one digit for B <= 255"
    )
    results = _step(workers, 0, [24, 0])
    assert [r.requests.batch for r in results] == [24, 24]
    assert [r.requests.batch for r in _step(workers, 1, [0, 0])] == [0, 0]


def test_without_a_largest_batch_the_message_is_unchanged() -> None:
    off = _engine(largest=None)
    assert off.request_digits == 0 and off.message_size(2) == V * off.row_size + 3


@pytest.mark.parametrize("mode", ["deterministic", "fast"])
def test_the_switch_applies_from_the_next_step_with_the_gain_at_the_new_batch(mode: str) -> None:
    engine = _engine(mode)
    (first,) = _step([engine], 0, [MAX])
    assert first.lr_factor == 1.0 and engine.global_batch_size == B, "step 0 was computed at B"
    engine.switch_batch(1, MAX)
    assert (engine.global_batch_size, engine.samples_per_virtual_node) == (MAX, MAX // V)
    (second,) = _step([engine], 1, [0])
    noise = engine.noise
    assert noise.updates == 2
    expected = adascale_gain(noise.variance, noise.sq_norm, batch=MAX, base_batch=B)
    assert second.lr_factor == pytest.approx(expected) and expected > 1.0
    assert engine.spec.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * expected)
    assert engine.base_batch_size == B, "the base stays the batch the learning rate was tuned for"


def test_the_new_batch_travels_in_the_state_and_a_spec_without_it_goes_back_to_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _engine()
    _step([engine], 0, [0])
    engine.switch_batch(1, 24)
    _step([engine], 1, [0])
    saved = state.from_bytes(state.to_bytes(state.capture(engine, 2, 0.0)))
    assert saved["global_batch_size"] == 24
    newcomer = _engine()
    state.restore(newcomer, saved)
    assert newcomer.position == engine.position and newcomer.global_batch_size == 24
    assert newcomer.position.samples_at(2) == B + 24

    without = _engine(largest=None)
    with caplog.at_level(logging.WARNING, logger="ebbflow_trainer.launch.state"):
        state.restore(without, saved)
    assert without.global_batch_size == B and without.position.samples_at(2) == B + 24
    assert without.position.start(2, 96) == engine.position.start(2, 96), (
        "the stream goes on where it stopped"
    )
    assert "not allowed by this job" in caplog.text

    legacy = {key: value for key, value in saved.items() if key != "position"}
    state.restore(newcomer, legacy)
    assert newcomer.position == DataPosition(B), "a state from before B could change ran at B from step 0"


def test_the_loader_processes_restart_when_the_batch_changes() -> None:
    engine = _engine(loader_workers=1, prefetch=2)
    loader: VirtualNodeLoader = engine.loader
    dataset = engine.spec.dataset
    assert isinstance(dataset, TensorDataset)
    labels = dataset.tensors[1]
    try:
        position = DataPosition(B)
        for step in range(4):
            if step == 2:
                position = position.switched(2, MAX, 96)
            loader.prepare(step, [0, 1], position)
            for k in (0, 1):
                got = loader.batch(step, k)
                indices = virtual_node_indices(
                    seed=0, step=step, virtual_node=k, num_samples=96, virtual_nodes=V, position=position
                )
                assert torch.equal(got[1], labels[indices]), (step, k)
        assert loader.restarts == 2
    finally:
        loader.close()
