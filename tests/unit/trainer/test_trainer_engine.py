"""The virtual-node step in one process: simulated workers whose messages are summed like an all-reduce."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from ebbflow_trainer import state
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.engine import VirtualNodeEngine
from ebbflow_trainer.sharding import even_counts, ranges_from_counts
from torch.utils.data import TensorDataset

from tests.trainer_config import trainer_config

V, B = 4, 16


def _loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _engine(mode: str, lr_scaling: str = "none", base_batch_size: int | None = None) -> VirtualNodeEngine:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    features, labels = torch.randn(96, 6, generator=data), torch.randint(0, 3, (96,), generator=data)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 3)
    )
    spec = TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        dataset=TensorDataset(features, labels),
        loss_fn=_loss,
    )
    config = trainer_config(
        max_replicas=V,
        virtual_nodes=V,
        global_batch_size=B,
        mode=mode,
        lr_scaling=lr_scaling,
        base_batch_size=base_batch_size,
    )
    return VirtualNodeEngine(spec, config)


def _train(world_size: int, mode: str, steps: int, counts: list[int] | None = None) -> VirtualNodeEngine:
    """Run ``steps`` steps with ``world_size`` simulated workers, each holding its own model copy."""
    workers = [_engine(mode) for _ in range(world_size)]
    assignment = ranges_from_counts(counts or even_counts(V, world_size))
    for step in range(steps):
        messages = []
        for rank, engine in enumerate(workers):
            rows, seconds = engine.compute_rows(step, assignment[rank])
            messages.append(
                engine.pack(rows, rank=rank, world_size=world_size, compute_seconds=seconds, leave=False)
            )
        reduced = torch.stack(messages).sum(0)
        for engine in workers:
            engine.apply(reduced.clone(), world_size)
    return workers[0]


def _bits(engine: VirtualNodeEngine) -> list[torch.Tensor]:
    return [t.detach().clone() for t in engine.spec.model.state_dict().values()]


def test_deterministic_steps_are_bitwise_identical_for_any_assignment() -> None:
    reference = _bits(_train(1, "deterministic", 6))
    for world_size, counts in [(2, None), (4, None), (2, [3, 1]), (3, [1, 1, 2])]:
        ours = _bits(_train(world_size, "deterministic", 6, counts))
        assert all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True)), (world_size, counts)


def test_batchnorm_statistics_are_the_mean_over_virtual_nodes() -> None:
    engine = _engine("deterministic")
    bn = engine.spec.model[1]
    assert isinstance(bn, torch.nn.BatchNorm1d)
    start = bn.running_mean.clone()
    rows, _ = engine.compute_rows(0, list(range(V)))
    # Each virtual node updated the running mean from the same start; compute them by hand.
    expected = torch.zeros_like(start)
    for k in range(V):
        offset = engine.num_params
        expected += rows[k][offset : offset + start.numel()]
    message = engine.pack(rows, rank=0, world_size=1, compute_seconds=0.1, leave=False)
    engine.apply(message, 1)
    assert torch.allclose(bn.running_mean, expected / V)
    assert int(bn.num_batches_tracked) == 1


def test_fast_mode_is_close_but_reduces_one_row() -> None:
    fast, deterministic = _train(2, "fast", 6), _train(2, "deterministic", 6)
    assert fast.message_size(2) == fast.row_size + 3
    assert deterministic.message_size(2) == V * deterministic.row_size + 3
    for a, b in zip(_bits(fast), _bits(deterministic), strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)


def test_the_message_carries_compute_times_and_the_leave_flag() -> None:
    engine = _engine("deterministic")
    rows, _ = engine.compute_rows(0, [0, 1])
    mine = engine.pack(rows, rank=0, world_size=2, compute_seconds=0.25, leave=False)
    rows, _ = engine.compute_rows(0, [2, 3])
    theirs = engine.pack(rows, rank=1, world_size=2, compute_seconds=0.75, leave=True)
    result = engine.apply(mine + theirs, 2)
    assert result.compute_seconds == [0.25, 0.75]
    assert result.leave_requested


def test_a_restored_state_continues_the_exact_sequence() -> None:
    straight = _engine("deterministic")
    for step in range(6):
        rows, _ = straight.compute_rows(step, list(range(V)))
        straight.apply(straight.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)

    first = _engine("deterministic")
    for step in range(3):
        rows, _ = first.compute_rows(step, list(range(V)))
        first.apply(first.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    saved = state.to_bytes(state.capture(first, 3, 0.0))
    resumed = _engine("deterministic")
    restored = state.from_bytes(saved)
    state.restore(resumed, restored)
    for step in range(restored["step"], 6):
        rows, _ = resumed.compute_rows(step, list(range(V)))
        resumed.apply(resumed.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    assert all(torch.equal(a, b) for a, b in zip(_bits(resumed), _bits(straight), strict=True))


def test_linear_lr_scaling_sets_the_optimizer_learning_rate() -> None:
    engine = _engine("deterministic", lr_scaling="linear", base_batch_size=4)
    rows, _ = engine.compute_rows(0, list(range(V)))
    result = engine.apply(engine.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    assert result.lr_factor == B / 4
    assert engine.spec.optimizer.param_groups[0]["lr"] == 0.1 * B / 4


def _snapshot(engine: VirtualNodeEngine) -> list[torch.Tensor]:
    """Parameters, buffers and every optimizer state tensor, copied."""
    optimizer_state = [
        t for s in engine.spec.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    return [t.detach().clone() for t in [*_bits(engine), *optimizer_state]]


@pytest.mark.parametrize("mode", ["deterministic", "fast"])
@pytest.mark.parametrize(
    "poison",
    [
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
    ],
)
def test_a_non_finite_step_changes_nothing_and_the_streak_counts_it(mode: str, poison: float) -> None:
    engine = _engine(mode)
    for step in range(2):  # some optimizer state (momentum) to keep
        rows, _ = engine.compute_rows(step, list(range(V)))
        engine.apply(engine.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    before, lr = _snapshot(engine), engine.spec.optimizer.param_groups[0]["lr"]

    for step in (2, 3):
        rows, _ = engine.compute_rows(step, list(range(V)))
        rows[1][0] = poison  # one gradient value of one virtual node
        result = engine.apply(engine.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
        assert result.skipped and result.lr_factor is None
        assert engine.nonfinite_streak == step - 1
        after = _snapshot(engine)
        assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True)), "the step changed state"
        assert engine.spec.optimizer.param_groups[0]["lr"] == lr

    rows, _ = engine.compute_rows(4, list(range(V)))
    result = engine.apply(engine.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    assert not result.skipped and engine.nonfinite_streak == 0
    assert not all(torch.equal(a, b) for a, b in zip(_snapshot(engine), before, strict=True))


def test_a_non_finite_loss_alone_skips_the_step() -> None:
    engine = _engine("deterministic")
    rows, _ = engine.compute_rows(0, list(range(V)))
    loss_at = engine.num_params + engine.num_float_buffer_values
    rows[2][loss_at] = float("nan")
    result = engine.apply(engine.pack(rows, rank=0, world_size=1, compute_seconds=1.0, leave=False), 1)
    assert result.skipped and math.isnan(result.loss)


def test_the_streak_travels_with_the_handed_over_state() -> None:
    engine = _engine("deterministic")
    engine.nonfinite_streak = 2
    resumed = _engine("deterministic")
    state.restore(resumed, state.from_bytes(state.to_bytes(state.capture(engine, 5, 0.0))))
    assert resumed.nonfinite_streak == 2
