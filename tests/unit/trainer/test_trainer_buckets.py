"""Fast mode's buckets: the layout, the order they are reduced in, and that they overlap backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.step.buckets import FIRST_BUCKET_BYTES, Bucket, plan_buckets
from ebbflow_trainer.step.engine import VirtualNodeEngine, WorldOfOne
from torch.utils.data import TensorDataset

MiB = 2**20


@pytest.mark.parametrize(
    ("sizes", "bucket_bytes", "offsets", "buckets"),
    [
        pytest.param([10], 25 * MiB, [0], [Bucket(0, None, 2)], id="one-parameter"),
        pytest.param(
            [3, 5, 7], 25 * MiB, [12, 7, 0], [Bucket(0, None, 4)], id="small-model-one-bucket-reversed"
        ),
        pytest.param(
            [4, 4, 4, 4],
            8 * 4,
            [12, 8, 4, 0],
            [Bucket(0, 8, 2), Bucket(8, None, 3)],
            id="cut-when-full-last-holds-extras",
        ),
        pytest.param(
            [FIRST_BUCKET_BYTES // 4, 1, FIRST_BUCKET_BYTES // 4],
            25 * MiB,
            [FIRST_BUCKET_BYTES // 4 + 1, FIRST_BUCKET_BYTES // 4, 0],
            [Bucket(0, FIRST_BUCKET_BYTES // 4, 1), Bucket(FIRST_BUCKET_BYTES // 4, None, 3)],
            id="first-bucket-small-as-in-ddp",
        ),
    ],
)
def test_plan_lays_parameters_out_in_reverse_and_cuts_buckets(
    sizes: list[int], bucket_bytes: int, offsets: list[int], buckets: list[Bucket]
) -> None:
    plan = plan_buckets(sizes, 4, bucket_bytes)
    assert plan.offsets == offsets
    assert plan.buckets == buckets
    for index, offset in enumerate(plan.offsets):
        bucket = plan.buckets[plan.bucket_of[index]]
        assert bucket.start <= offset and (bucket.stop is None or offset + sizes[index] <= bucket.stop)


class _Deep(torch.nn.Module):
    """Five layers, and with ``unused`` a sixth whose gradient never arrives."""

    def __init__(self, unused: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(5))
        self.unused = torch.nn.Linear(32, 32) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _engine(
    virtual_nodes: int = 2, bucket_mb: float = 4 * 33 * 32 / 2**20, unused: bool = False
) -> VirtualNodeEngine:
    """Buckets of about one layer (4 KiB of float32)."""
    torch.manual_seed(0)
    model = _Deep(unused)
    data = TensorDataset(torch.randn(64, 32), torch.randint(0, 32, (64,)))
    spec = TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=data,
        loss_fn=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]),
    )
    config = trainer_config(
        max_replicas=virtual_nodes,
        virtual_nodes=virtual_nodes,
        global_batch_size=8 * virtual_nodes,
        mode="fast",
        bucket_mb=bucket_mb,
    )
    return VirtualNodeEngine(spec, config)


class _Recording(WorldOfOne):
    """Records each launched bucket and how many first-layer weight gradients (among the last a
    backward pass computes) had been computed by then."""

    def __init__(self, engine: VirtualNodeEngine) -> None:
        self.launches: list[tuple[int, int, int]] = []
        self.first_layer_gradients = 0
        first = engine.spec.model.layers[0].weight

        def note(gradient: torch.Tensor) -> torch.Tensor:
            self.first_layer_gradients += 1
            return gradient

        first.register_hook(note)

    def all_reduce(self, tensor: torch.Tensor):  # type: ignore[no-untyped-def]
        base = tensor.untyped_storage().data_ptr()
        start = (tensor.data_ptr() - base) // tensor.element_size()
        stop = start + tensor.numel()
        self.launches.append((start, stop, self.first_layer_gradients))
        return super().all_reduce(tensor)


def test_buckets_are_reduced_in_order_while_the_last_backward_runs() -> None:
    engine = _engine()
    comm = _Recording(engine)
    message, _ = engine.reduce_step(0, [0, 1], rank=0, world_size=1, leave=lambda: False, comm=comm)
    starts = [start for start, _, _ in comm.launches]
    assert starts == sorted(starts) and starts[0] == 0, "in bucket order, from the first"
    assert comm.launches[-1][1] == message.numel(), "the last bucket carries the extras"
    assert len(comm.launches) == len(engine.buckets.plan.buckets) >= 4  # type: ignore[union-attr]
    assert all(done >= 1 for _, _, done in comm.launches), "nothing goes before the last virtual node"
    early = [launch for launch in comm.launches if launch[2] < 2]
    assert len(early) >= 3, "buckets went while the last backward had not reached the first layer"
    # One launch per bucket covering the whole message.
    assert sum(stop - start for start, stop, _ in comm.launches) == message.numel()


def test_an_unused_parameter_gets_a_zero_gradient_and_every_bucket_goes() -> None:
    """Its bucket (the first: it is the last parameter) never fills, so every bucket goes at the end:
    correct, without overlap (DDP needs find_unused_parameters for such models)."""
    engine = _engine(unused=True)
    unused = engine.spec.model.unused.weight.detach().clone()
    comm = _Recording(engine)
    message, _ = engine.reduce_step(0, [0, 1], rank=0, world_size=1, leave=lambda: False, comm=comm)
    assert len(comm.launches) == len(engine.buckets.plan.buckets)  # type: ignore[union-attr]
    engine.apply(message, 1)
    assert torch.equal(engine.spec.model.unused.weight, unused)


def test_gradients_do_not_stay_in_the_parameters_between_steps() -> None:
    """The message is the step's only gradient memory; after the update nothing is left in .grad."""
    engine = _engine(virtual_nodes=4)
    step_world([engine], 0)
    assert all(p.grad is None for p in engine.spec.model.parameters())


def test_a_backward_outside_a_step_is_left_alone() -> None:
    """Hooks act only inside a step: the script's own backward (a probe, a test) keeps .grad."""
    engine = _engine()
    model = engine.spec.model
    model(torch.randn(3, 32)).sum().backward()
    assert model.layers[0].weight.grad is not None


@pytest.mark.parametrize("bucket_mb", [1e-6, 25.0], ids=["one-parameter-buckets", "one-bucket"])
def test_bucket_size_does_not_change_the_result(bucket_mb: float) -> None:
    reference, ours = _engine(virtual_nodes=4), _engine(virtual_nodes=4, bucket_mb=bucket_mb)
    for step in range(3):
        step_world([reference], step)
        step_world([ours], step)
    for a, b in zip(reference.spec.model.parameters(), ours.spec.model.parameters(), strict=True):
        assert torch.equal(a, b)
