"""The virtual-node step in one process: simulated workers whose messages are summed like an all-reduce."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from ebbflow_devtools.testing.simulated_world import combine_rows, reduce_world, step_world
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import ROW_TABLE_LIMIT
from ebbflow_trainer.launch import state
from ebbflow_trainer.step.engine import ReductionFailed, VirtualNodeEngine
from torch.utils.data import TensorDataset

V, B = 4, 16


def _loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _engine(
    mode: str,
    lr_scaling: str = "none",
    base_batch_size: int | None = None,
    virtual_nodes: int = V,
    bucket_mb: float = 25.0,
) -> VirtualNodeEngine:
    """``mode`` "fast", "deterministic" (a model this small all-reduces one row per virtual node) or
    "exact" (deterministic mode made to use exact sums); ``bucket_mb`` sizes fast mode's buckets."""
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
        max_replicas=virtual_nodes,
        virtual_nodes=virtual_nodes,
        global_batch_size=B // V * virtual_nodes,
        mode="fast" if mode == "fast" else "deterministic",
        row_table_limit=0 if mode == "exact" else ROW_TABLE_LIMIT,
        lr_scaling=lr_scaling,
        base_batch_size=base_batch_size,
        bucket_mb=bucket_mb,
    )
    engine = VirtualNodeEngine(spec, config)
    assert engine.method == {"fast": "sum", "deterministic": "table", "exact": "exact"}[mode]
    return engine


def _train(
    world_size: int, mode: str, steps: int, counts: list[int] | None = None, virtual_nodes: int = V
) -> VirtualNodeEngine:
    """Run ``steps`` steps with ``world_size`` simulated workers, each holding its own model copy."""
    workers = [_engine(mode, virtual_nodes=virtual_nodes) for _ in range(world_size)]
    for step in range(steps):
        step_world(workers, step, counts)
    return workers[0]


def _bits(engine: VirtualNodeEngine) -> list[torch.Tensor]:
    return [t.detach().clone() for t in engine.spec.model.state_dict().values()]


@pytest.mark.parametrize("method", ["deterministic", "exact"])
@pytest.mark.parametrize(
    ("virtual_nodes", "assignments"),
    [
        (V, [(2, None), (4, None), (2, [3, 1]), (3, [1, 1, 2])]),
        (
            12,
            [
                *[(world_size, None) for world_size in (2, 3, 4, 6)],
                (2, [11, 1]),
                (3, [2, 7, 3]),
                (4, [1, 2, 3, 6]),
                (6, [5, 1, 1, 1, 3, 1]),
            ],
        ),
    ],
)
def test_deterministic_steps_are_bitwise_identical_for_any_assignment(
    method: str, virtual_nodes: int, assignments: list[tuple[int, list[int] | None]]
) -> None:
    reference = _bits(_train(1, method, 6, virtual_nodes=virtual_nodes))
    for world_size, counts in assignments:
        ours = _bits(_train(world_size, method, 6, counts, virtual_nodes=virtual_nodes))
        assert all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True)), (world_size, counts)


@pytest.mark.parametrize("method", ["deterministic", "exact"])
def test_batchnorm_statistics_are_the_mean_over_virtual_nodes(method: str) -> None:
    engine = _engine(method)
    bn = engine.spec.model[1]
    assert isinstance(bn, torch.nn.BatchNorm1d)
    start = bn.running_mean.clone()
    rows, _ = engine.compute_rows(0, list(range(V)))
    # Each virtual node updated the running mean from the same start; compute them by hand.
    expected = torch.zeros_like(start)
    for k in range(V):
        offset = engine.num_params
        expected += rows[k][offset : offset + start.numel()]
    engine.apply(combine_rows([engine], [(rows, 0.1)]), 1)
    assert torch.allclose(bn.running_mean, expected / V)
    assert int(bn.num_batches_tracked) == 1


@pytest.mark.parametrize("counts", [None, [3, 1], [1, 3]], ids=["even", "3-1", "1-3"])
def test_fast_mode_and_both_deterministic_methods_are_close(counts: list[int] | None) -> None:
    """Uneven shares (dynamic batching) keep the mean over virtual nodes in fast mode too."""
    fast = _train(2, "fast", 6, counts)
    table, exact = _train(2, "deterministic", 6, counts), _train(2, "exact", 6, counts)
    assert fast.message_size(2) == exact.message_size(2) == fast.row_size + 3
    assert table.message_size(2) == V * table.row_size + 3
    for a, b, c in zip(_bits(fast), _bits(table), _bits(exact), strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
        assert torch.allclose(c.double(), b.double(), rtol=1e-5, atol=1e-6)


def _wide_engine(mode: str, virtual_nodes: int, row_table_limit: int = ROW_TABLE_LIMIT) -> VirtualNodeEngine:
    """A model of 66 k parameters (17 gradient blocks) for traffic figures."""
    model = torch.nn.Linear(256, 256)
    data = TensorDataset(torch.randn(8, 256), torch.randint(0, 256, (8,)))
    spec = TrainingSpec(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), dataset=data, loss_fn=_loss
    )
    config = trainer_config(
        max_replicas=virtual_nodes,
        virtual_nodes=virtual_nodes,
        global_batch_size=virtual_nodes,
        mode=mode,
        row_table_limit=row_table_limit,
    )
    return VirtualNodeEngine(spec, config)


def test_deterministic_traffic_is_independent_of_v_and_twice_fast_mode() -> None:
    """Exact sums: one int64 per value where fast mode sends one float32, plus 8 bytes per block of
    4096 values for the grid agreement. The row table (V float32 rows) is chosen only while it is
    at most ``row_table_limit`` bytes (2 MiB by default)."""
    traffic = {}
    for virtual_nodes in (4, 16, 64):
        fast, deterministic = (
            _wide_engine("fast", virtual_nodes),
            _wide_engine("deterministic", virtual_nodes, row_table_limit=0),
        )
        assert deterministic.method == "exact"
        assert deterministic.message_size(2) == fast.message_size(2) == fast.row_size + 3
        header = 8 * deterministic.layout.num_blocks
        assert deterministic.message_bytes(2) == 2 * fast.message_bytes(2) + header
        assert deterministic.message_bytes(2) <= 2 * fast.message_bytes(2) * 1.001
        assert deterministic.message_bytes(2) < virtual_nodes * fast.row_size * 4
        traffic[virtual_nodes] = deterministic.message_bytes(2)
        table_bytes = virtual_nodes * fast.row_size * 4
        automatic = _wide_engine("deterministic", virtual_nodes)
        assert automatic.method == ("table" if table_bytes <= ROW_TABLE_LIMIT else "exact")
        assert automatic.message_bytes(2) <= max(ROW_TABLE_LIMIT + 12, deterministic.message_bytes(2))
    assert len(set(traffic.values())) == 1, traffic


def test_infinite_buffer_values_average_like_floats_and_do_not_skip_the_step() -> None:
    """Buffers may hold infinities by design (attention masks): they travel beside the grid."""
    engine = _engine("exact")
    rows = engine.compute_rows(0, list(range(V)))[0]
    at = engine.num_params  # the BatchNorm's running mean
    rows[0][at], rows[1][at] = -math.inf, -math.inf
    rows[2][at + 1], rows[3][at + 1] = math.inf, -math.inf
    rows[1][at + 2] = math.nan
    rows[3][at + 3] = math.inf
    computed = [({k: rows[k] for k in (0, 3)}, 1.0), ({k: rows[k] for k in (1, 2)}, 1.0)]
    result = engine.apply(combine_rows([engine, engine], computed), 2)
    assert not result.skipped and math.isfinite(result.loss)
    bn = engine.spec.model[1]
    assert isinstance(bn, torch.nn.BatchNorm1d)
    mean = bn.running_mean
    assert float(mean[0]) == -math.inf and math.isnan(mean[1]) and math.isnan(mean[2])
    assert float(mean[3]) == math.inf and bool(torch.isfinite(mean[4:]).all())


@pytest.mark.parametrize("mode", ["deterministic", "exact", "fast"])
def test_the_message_carries_compute_times_and_the_leave_flag(mode: str) -> None:
    workers = [_engine(mode), _engine(mode)]
    assignment = [[0, 1], [2, 3]]
    reduced, seconds = reduce_world(workers, 0, assignment, leave_rank=1)
    result = workers[0].apply(reduced, 2)
    # Exact sums carry a float64's bits (the times come back exactly), the others the parameters' dtype.
    expected = seconds if mode == "exact" else [float(torch.tensor(t, dtype=torch.float32)) for t in seconds]
    assert result.compute_seconds == expected and all(t > 0 for t in seconds)
    assert result.leave_requested
    result = workers[0].apply(reduce_world(workers, 1, assignment)[0], 2)
    assert not result.leave_requested


@pytest.mark.parametrize("mode", ["deterministic", "exact", "fast"])
def test_a_restored_state_continues_the_exact_sequence(mode: str) -> None:
    straight = _engine(mode)
    for step in range(6):
        step_world([straight], step)

    first = _engine(mode)
    for step in range(3):
        step_world([first], step)
    saved = state.to_bytes(state.capture(first, 3, 0.0))
    resumed = _engine(mode)
    restored = state.from_bytes(saved)
    state.restore(resumed, restored)
    for step in range(restored["step"], 6):
        step_world([resumed], step)
    assert all(torch.equal(a, b) for a, b in zip(_bits(resumed), _bits(straight), strict=True))


def test_linear_lr_scaling_sets_the_optimizer_learning_rate() -> None:
    engine = _engine("deterministic", lr_scaling="linear", base_batch_size=4)
    (result,) = step_world([engine], 0)
    assert result.lr_factor == B / 4
    assert engine.spec.optimizer.param_groups[0]["lr"] == 0.1 * B / 4


def _snapshot(engine: VirtualNodeEngine) -> list[torch.Tensor]:
    """Parameters, buffers and every optimizer state tensor, copied."""
    optimizer_state = [
        t for s in engine.spec.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    return [t.detach().clone() for t in [*_bits(engine), *optimizer_state]]


@pytest.mark.parametrize("mode", ["deterministic", "exact", "fast"])
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
        step_world([engine], step)
    before, lr = _snapshot(engine), engine.spec.optimizer.param_groups[0]["lr"]
    dataset = engine.spec.dataset
    assert isinstance(dataset, TensorDataset)
    features = dataset.tensors[0]
    clean = features.clone()

    features[:, 0] = poison  # every sample: the loss and the gradient are not finite
    for step in (2, 3):
        (result,) = step_world([engine], step)
        assert result.skipped and result.lr_factor is None
        assert engine.nonfinite_streak == step - 1
        after = _snapshot(engine)
        assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True)), "the step changed state"
        assert engine.spec.optimizer.param_groups[0]["lr"] == lr

    features.copy_(clean)
    (result,) = step_world([engine], 4)
    assert not result.skipped and engine.nonfinite_streak == 0
    assert not all(torch.equal(a, b) for a, b in zip(_snapshot(engine), before, strict=True))


@pytest.mark.parametrize("mode", ["deterministic", "exact"])
def test_one_non_finite_gradient_value_skips_the_step(mode: str) -> None:
    engine = _engine(mode)
    step_world([engine], 0)
    before = _snapshot(engine)
    rows, _ = engine.compute_rows(1, list(range(V)))
    rows[1][0] = math.inf  # one gradient value of one virtual node
    result = engine.apply(combine_rows([engine], [(rows, 1.0)]), 1)
    assert result.skipped and math.isfinite(result.loss) and engine.nonfinite_streak == 1
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(engine), before, strict=True))


@pytest.mark.parametrize("mode", ["deterministic", "exact"])
def test_a_non_finite_loss_alone_skips_the_step(mode: str) -> None:
    engine = _engine(mode)
    rows, _ = engine.compute_rows(0, list(range(V)))
    loss_at = engine.num_params + engine.num_float_buffer_values
    rows[2][loss_at] = float("nan")
    result = engine.apply(combine_rows([engine], [(rows, 1.0)]), 1)
    assert result.skipped and math.isnan(result.loss)


def test_the_streak_travels_with_the_handed_over_state() -> None:
    engine = _engine("deterministic")
    engine.nonfinite_streak = 2
    resumed = _engine("deterministic")
    state.restore(resumed, state.from_bytes(state.to_bytes(state.capture(engine, 5, 0.0))))
    assert resumed.nonfinite_streak == 2


# Buckets of about 26 float32 values: the small model's gradients go in two, the first launched from
# inside the last virtual node's backward pass, the second (with the extras) after it.
SMALL_BUCKET_MB = 104 / 2**20


class _Completed:
    def wait(self) -> None:
        return None


class _PeerDied:
    """Collectives of a world whose peer died: the ``fail_at``-th all-reduce launched raises, as
    ``DistCollectives`` does when gloo finds the connection closed (earlier ones complete)."""

    def __init__(self, fail_at: int):
        self.fail_at, self.launched = fail_at, 0

    def all_reduce(self, tensor: torch.Tensor) -> _Completed:
        self.launched += 1
        if self.launched == self.fail_at:
            raise ReductionFailed("Connection closed by peer")
        return _Completed()

    def all_reduce_max(self, tensor: torch.Tensor) -> None:
        raise ReductionFailed("Connection closed by peer")


@pytest.mark.parametrize(
    ("mode", "fail_at"),
    [
        pytest.param("fast", 1, id="fast-first-bucket-inside-backward"),
        pytest.param("fast", 2, id="fast-last-bucket-after-backward"),
        pytest.param("deterministic", 1, id="deterministic"),
    ],
)
def test_a_failed_reduction_leaves_the_state_of_the_step_before(mode: str, fail_at: int) -> None:
    """What a worker hands over after a failed step is exactly the state before it: the BatchNorm
    statistics the step's forward passes moved are put back, whichever collective failed."""
    engine = _engine(mode, bucket_mb=SMALL_BUCKET_MB)
    assert mode != "fast" or len(engine.buckets.plan.buckets) == 2  # type: ignore[union-attr]
    for step in range(2):
        step_world([engine], step)
    before = _snapshot(engine)
    comm = _PeerDied(fail_at)
    with pytest.raises(ReductionFailed):
        engine.reduce_step(2, list(range(V)), rank=0, world_size=2, leave=lambda: False, comm=comm)
    assert comm.launched == fail_at
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(engine), before, strict=True))
    assert all(p.grad is None for p in engine.spec.model.parameters())
    # The engine is usable again: the step, redone in a world of one, matches a run never interrupted.
    step_world([engine], 2)
    straight = _engine(mode, bucket_mb=SMALL_BUCKET_MB)
    for step in range(3):
        step_world([straight], step)
    assert all(torch.equal(a, b) for a, b in zip(_bits(engine), _bits(straight), strict=True))
