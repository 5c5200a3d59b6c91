"""What real training scripts need, in-process with simulated workers: LR scheduler, gradient clipping,
mixed precision with the fp16 loss scale, the evaluation hook, the script's own state, background
batch loading and the validation of these settings."""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ebbflow_api import contract
from ebbflow_api.models import ElasticTrainingJobStatus
from ebbflow_devtools.testing.simulated_world import combine_rows, step_world
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT, trainer_config
from ebbflow_operator.decision.model import parse_progress
from ebbflow_trainer import metrics
from ebbflow_trainer.__main__ import main
from ebbflow_trainer.api import LossScaling, SpecError, TrainingSpec, load_spec
from ebbflow_trainer.data import VirtualNodeLoader, VirtualNodePlan, build_batch
from ebbflow_trainer.evaluation import Evaluation
from ebbflow_trainer.launch import state
from ebbflow_trainer.sharding import DataPosition, virtual_node_indices
from ebbflow_trainer.step.engine import StepResult, VirtualNodeEngine
from ebbflow_trainer.step.update import LossScaler
from torch.utils.data import Dataset, TensorDataset

V, B = 4, 16
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def _loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _data() -> TensorDataset:
    data = torch.Generator().manual_seed(1)
    features = torch.randn(96, 6, generator=data)
    labels = (features[:, 0] > 0).long() + (features[:, 1] > 0).long()  # learnable: the loss goes down
    return TensorDataset(features, labels)


def _spec(scheduler: SchedulerFactory | None = None, lr: float = 0.1, **options: Any) -> TrainingSpec:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    options.setdefault("dataset", _data())
    options.setdefault("loss_fn", _loss)
    return TrainingSpec(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler(optimizer) if scheduler is not None else None,
        **options,
    )


def _engine(spec: TrainingSpec, mode: str = "deterministic", **config: Any) -> VirtualNodeEngine:
    return VirtualNodeEngine(
        spec, trainer_config(max_replicas=V, virtual_nodes=V, global_batch_size=B, mode=mode, **config)
    )


def _step(workers: list[VirtualNodeEngine], step: int, counts: list[int] | None = None) -> list[StepResult]:
    return step_world(workers, step, counts)


def _train(
    make: Callable[[], VirtualNodeEngine], world_size: int, steps: int, first: int = 0
) -> tuple[VirtualNodeEngine, list[StepResult]]:
    workers = [make() for _ in range(world_size)]
    results = [_step(workers, step)[0] for step in range(first, steps)]
    for engine in workers[1:]:
        engine.close()
    return workers[0], results


def _bits(engine: VirtualNodeEngine) -> list[torch.Tensor]:
    return [t.detach().clone() for t in engine.spec.model.state_dict().values()]


def _same(a: VirtualNodeEngine, b: VirtualNodeEngine) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_bits(a), _bits(b), strict=True))


def _cosine(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=8, eta_min=0.01)


# --- learning-rate scheduler ---------------------------------------------------------------------


def test_the_scheduler_steps_once_per_step_identically_for_every_world_size() -> None:
    reference, results = _train(lambda: _engine(_spec(_cosine)), 1, 6)
    scheduler = reference.spec.scheduler
    assert scheduler is not None and scheduler.last_epoch == 6
    # Step k used the cosine LR of position k.
    expected = [0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * k / 8)) / 2 for k in range(6)]
    assert [r.lr for r in results] == pytest.approx(expected, rel=1e-9)
    for world_size in (2, 4):
        ours, their_results = _train(lambda: _engine(_spec(_cosine)), world_size, 6)
        assert [r.lr for r in their_results] == [r.lr for r in results]
        assert _same(ours, reference), world_size


def test_lr_scaling_multiplies_the_scheduled_lr_without_compounding() -> None:
    def halving(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    engine, results = _train(
        lambda: _engine(_spec(halving), lr_scaling="linear", base_batch_size=B // 4), 1, 4
    )
    # The scheduler defines the step's base LR; linear scaling multiplies it by B / B0 = 4.
    assert [r.lr for r in results] == pytest.approx([0.1 * 0.5**k * 4 for k in range(4)])
    assert engine.base_lrs == pytest.approx([0.1 * 0.5**4])
    assert engine.spec.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)


def test_a_skipped_step_still_advances_the_schedule() -> None:
    engine = _engine(_spec(_cosine))
    _step([engine], 0)
    skipped = _poisoned_step(engine, 1, gradient_value=math.nan)
    assert skipped.skipped and skipped.lr is None
    scheduler = engine.spec.scheduler
    assert scheduler is not None and scheduler.last_epoch == 2, "its position is the step count"


def _poisoned_step(
    engine: VirtualNodeEngine,
    step: int,
    *,
    gradient_value: float | None = None,
    loss_value: float | None = None,
) -> StepResult:
    """One single-worker step with one virtual node's gradient value or loss replaced."""
    rows, seconds = engine.compute_rows(step, list(range(V)))
    if gradient_value is not None:
        rows[1][0] = gradient_value
    if loss_value is not None:
        rows[2][engine.num_params + engine.num_float_buffer_values] = loss_value
    message = combine_rows([engine], [(rows, seconds)])
    return engine.apply(message, 1)


# --- gradient clipping ---------------------------------------------------------------------------


def test_clipping_limits_the_combined_gradient_norm_for_every_world_size() -> None:
    limit = 0.05

    def make() -> VirtualNodeEngine:
        torch.manual_seed(0)
        spec = _spec(clip_grad_norm=limit, lr=1.0)
        spec.optimizer = torch.optim.SGD(spec.model.parameters(), lr=1.0)  # the update is -gradient
        return _engine(spec)

    engine = make()
    before = [p.detach().clone() for p in engine.params]
    [result] = _step([engine], 0)
    update = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, engine.params, strict=True)])
    assert result.grad_norm is not None and result.grad_norm > limit
    assert float(update.norm()) == pytest.approx(limit, rel=1e-4)
    engine.close()

    reference, _ = _train(make, 1, 5)
    for world_size in (2, 4):
        ours, _ = _train(make, world_size, 5)
        assert _same(ours, reference), world_size


def test_a_gradient_within_the_limit_is_not_changed() -> None:
    clipped, _ = _train(lambda: _engine(_spec(clip_grad_norm=1e6)), 1, 3)
    plain, _ = _train(lambda: _engine(_spec()), 1, 3)
    assert _same(clipped, plain)


# --- mixed precision -----------------------------------------------------------------------------


def _recording_loss(
    dtypes: list[torch.dtype],
) -> Callable[[torch.nn.Module, list[torch.Tensor]], torch.Tensor]:
    def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        logits = model(batch[0])
        dtypes.append(logits.dtype)
        return F.cross_entropy(logits, batch[1])

    return loss_fn


def test_bf16_autocast_trains_on_cpu() -> None:
    dtypes: list[torch.dtype] = []
    engine, results = _train(lambda: _engine(_spec(precision="bf16", loss_fn=_recording_loss(dtypes))), 1, 30)
    assert set(dtypes) == {torch.bfloat16}, "the forward pass runs under bf16 autocast"
    assert all(p.dtype == torch.float32 for p in engine.params), "parameters stay fp32"
    losses = [r.loss for r in results]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_stays_bitwise_identical_across_world_sizes(precision: str) -> None:
    def make() -> VirtualNodeEngine:
        return _engine(_spec(_cosine, precision=precision, clip_grad_norm=1.0))

    reference, results = _train(make, 1, 4)
    assert not any(r.skipped for r in results)
    for world_size in (2, 4):
        ours, _ = _train(make, world_size, 4)
        assert _same(ours, reference), world_size


@pytest.mark.parametrize("mode", ["deterministic", "fast"])
def test_an_fp16_overflow_is_skipped_backs_off_and_is_not_counted(mode: str) -> None:
    scaling = LossScaling(init_scale=2.0**40)  # the scaled gradient overflows fp16 in the backward pass
    engine = _engine(_spec(precision="fp16", loss_scaling=scaling), mode)
    before = _bits(engine)
    [result] = _step([engine], 0)
    assert result.skipped and result.overflow
    assert engine.nonfinite_streak == 0, "an overflow is not a sign of divergence"
    assert result.loss_scale == 2.0**39
    assert _same_bits(engine, before)
    results = [_step([engine], step)[0] for step in range(1, 40)]
    overflows = [r.overflow for r in results]
    assert overflows[-1] is False and engine.nonfinite_streak == 0
    # The scale backed off once per overflow until the gradient fit; then training went on.
    assert results[-1].loss_scale == 2.0 ** (39 - sum(overflows))
    assert not _same_bits(engine, before)
    engine.close()


def _same_bits(engine: VirtualNodeEngine, bits: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_bits(engine), bits, strict=True))


def test_with_a_loss_scale_a_non_finite_loss_still_counts() -> None:
    engine = _engine(_spec(precision="fp16", loss_scaling=LossScaling(init_scale=2.0**8)))
    result = _poisoned_step(engine, 0, loss_value=math.nan, gradient_value=math.inf)
    assert result.skipped and not result.overflow
    assert engine.nonfinite_streak == 1
    assert result.loss_scale == 2.0**7, "the scale follows GradScaler: any non-finite gradient backs off"
    result = _poisoned_step(engine, 1, gradient_value=math.inf)  # an overflow ends the streak
    assert result.overflow and engine.nonfinite_streak == 0


def test_without_a_loss_scale_a_non_finite_gradient_counts() -> None:
    engine = _engine(_spec(precision="bf16"))
    result = _poisoned_step(engine, 0, gradient_value=math.inf)
    assert result.skipped and not result.overflow and engine.nonfinite_streak == 1


def test_the_loss_scale_grows_after_the_interval() -> None:
    engine = _engine(_spec(precision="fp16", loss_scaling=LossScaling(init_scale=2.0**8, growth_interval=3)))
    scales = [_step([engine], step)[0].loss_scale for step in range(7)]
    assert scales == [2.0**8, 2.0**8, 2.0**9, 2.0**9, 2.0**9, 2.0**10, 2.0**10]
    assert engine.update.scaler is not None and engine.update.scaler.growth_tracker == 1


def test_the_loss_scale_rule_is_gradscalers() -> None:
    """Against torch._amp_update_scale_ (GradScaler's update), factors that are not powers of two too."""
    rng = random.Random(0)
    for _ in range(200):
        settings = LossScaling(
            init_scale=rng.uniform(1, 1e6),
            growth_factor=rng.uniform(1.01, 3),
            backoff_factor=rng.uniform(0.01, 0.99),
            growth_interval=rng.randint(1, 3),
        )
        ours = LossScaler(settings)
        scale = torch.tensor([settings.init_scale], dtype=torch.float32)
        tracker = torch.zeros(1, dtype=torch.int32)
        for _ in range(8):
            found_inf = rng.random() < 0.4
            torch._amp_update_scale_(
                scale,
                tracker,
                torch.tensor([float(found_inf)]),
                settings.growth_factor,
                settings.backoff_factor,
                settings.growth_interval,
            )
            ours.update(found_inf)
            assert (ours.scale, ours.growth_tracker) == (float(scale), int(tracker))


# --- state: everything survives a handover -------------------------------------------------------


def _featured(
    counter: dict[str, int], precision: str = "fp16", mode: str = "deterministic"
) -> VirtualNodeEngine:
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        counter["evaluations"] += 1
        return {"accuracy": 0.5}

    return _engine(
        _spec(
            _cosine,
            clip_grad_norm=0.5,
            precision=precision,
            loss_scaling=LossScaling(init_scale=2.0**10, growth_interval=2),
            eval_fn=evaluate,
            eval_every=2,
            extra_state=(lambda: dict(counter), counter.update),
        ),
        mode,
    )


@pytest.mark.parametrize("mode", ["deterministic", "fast"])
def test_every_feature_survives_a_handover_exactly(mode: str) -> None:
    straight_counter = {"evaluations": 0}
    straight, _ = _train(lambda: _featured(straight_counter, mode=mode), 1, 6)

    counter = {"evaluations": 0}
    first, _ = _train(lambda: _featured(counter, mode=mode), 1, 3)
    counter["evaluations"] = 7
    first.evaluation.run(3)
    saved = state.to_bytes(state.capture(first, 3, 0.0))
    counter["evaluations"] = -1  # the live dict changes after the capture: the state keeps its copy

    resumed_counter = {"evaluations": 0}
    restored = state.from_bytes(saved)
    assert restored["extra"] == {"evaluations": 8}
    resumed = _featured(resumed_counter, mode=mode)
    state.restore(resumed, restored)
    assert resumed_counter == {"evaluations": 8}
    assert resumed.evaluation.last == {"step": 3, "metrics": {"accuracy": 0.5}}
    assert resumed.update.state_dict() == first.update.state_dict()
    assert resumed.base_lrs == first.base_lrs
    workers = [resumed]
    for step in range(3, 6):
        _step(workers, step)
    assert _same(resumed, straight)
    assert resumed.update.state_dict() == straight.update.state_dict()
    scheduler = resumed.spec.scheduler
    assert scheduler is not None and scheduler.last_epoch == 6


# --- evaluation ----------------------------------------------------------------------------------


def test_evaluation_runs_at_the_due_steps_and_changes_nothing() -> None:
    seen: list[tuple[bool, bool]] = []

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        seen.append((model.training, torch.is_grad_enabled()))
        torch.rand(3)  # draws from the RNG: evaluating must not shift training's random numbers
        return {"accuracy": torch.tensor(0.75), "loss": 2}

    spec = _spec(eval_fn=evaluate, eval_every=3)
    evaluation = Evaluation(spec, lambda: torch.autocast("cpu", enabled=False))
    due = [step for step in range(1, 8) if evaluation.due(step, total_steps=7)]
    assert due == [3, 6, 7]
    rng = torch.get_rng_state()
    spec.model.train()
    assert evaluation.run(3) == {"accuracy": 0.75, "loss": 2.0}
    assert seen == [(False, False)] and spec.model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert not evaluation.due(3, total_steps=7), "a step is evaluated once"
    evaluation.run(7)
    assert not evaluation.due(7, total_steps=7), "the last step is not evaluated twice"


def test_only_the_last_step_is_evaluated_without_eval_every() -> None:
    spec = _spec(eval_fn=lambda model: {"x": 1.0})
    evaluation = Evaluation(spec, lambda: torch.autocast("cpu", enabled=False))
    assert [step for step in range(1, 11) if evaluation.due(step, total_steps=10)] == [10]


def test_the_progress_report_leaves_out_non_finite_metrics() -> None:
    spec = _spec(eval_fn=lambda model: {"accuracy": 0.5, "perplexity": math.inf})
    evaluation = Evaluation(spec, lambda: torch.autocast("cpu", enabled=False))
    evaluation.run(4)
    assert evaluation.report() == {"step": 4, "metrics": {"accuracy": 0.5}}


@pytest.mark.parametrize("returned", [[0.5], {"accuracy": "high"}])
def test_an_eval_fn_returning_no_metrics_is_named(returned: Any) -> None:
    spec = _spec(eval_fn=lambda model: returned)
    with pytest.raises(SpecError, match="eval_fn"):
        Evaluation(spec, lambda: torch.autocast("cpu", enabled=False)).run(1)


# --- batches: the sampler and background loader processes ---------------------------------------


def test_the_plan_yields_each_virtual_nodes_indices_in_order() -> None:
    config = trainer_config(max_replicas=V, virtual_nodes=V, global_batch_size=B, seed=3)
    plan = VirtualNodePlan(config, num_samples=96)
    plan.restart(5, [1, 2], DataPosition(B))
    keys = iter(plan)
    for step in (5, 6, 7, 8, 9, 10, 11):  # crosses the epoch boundary (6 steps of 16 per epoch)
        for k in (1, 2):
            got_step, got_k, indices = next(keys)
            expected = virtual_node_indices(
                seed=3, step=step, virtual_node=k, num_samples=96, virtual_nodes=V, position=DataPosition(B)
            )
            assert (got_step, got_k) == (step, k) and torch.equal(indices, expected)


class _Noisy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset with a random transform, to show where and when a batch is built does not matter."""

    def __init__(self) -> None:
        self.base = _data()

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features, label = self.base[index]
        return features + 0.1 * torch.randn(features.shape), label


def test_loader_processes_build_the_same_batches_and_stop_on_close() -> None:
    spec = _spec(dataset=_Noisy(), loader_workers=1, prefetch=2)
    config = trainer_config(max_replicas=V, virtual_nodes=V, global_batch_size=B)
    earlier = _children()  # processes other tests left to this one (a forkserver, a resource tracker)
    loader = VirtualNodeLoader(spec, config)
    plan = VirtualNodePlan(config, len(spec.dataset))
    try:
        # The assignment changes at step 2 (dynamic batching): the loader restarts from the new one.
        for step, nodes in [(0, [0, 1]), (1, [0, 1]), (2, [0, 1, 2]), (3, [0, 1, 2]), (5, [3])]:
            loader.prepare(step, nodes, DataPosition(B))
            for k in nodes:
                expected = build_batch(spec, config.seed, step, k, plan.indices(step, k))
                got = loader.batch(step, k)
                assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), (step, k)
        assert loader.restarts == 3
        children = _children() - earlier
        assert children, "the loader runs in a background process"
    finally:
        loader.close()
    assert not (children & _children()), "close() stops the loader processes"


def _children() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(entry))
    return found


def test_training_with_loader_processes_is_bitwise_identical() -> None:
    in_process, _ = _train(lambda: _engine(_spec(dataset=_Noisy())), 1, 4)
    background, _ = _train(lambda: _engine(_spec(dataset=_Noisy(), loader_workers=1)), 2, 4)
    background.close()
    assert _same(background, in_process)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"precision": "fp8"}, "precision"),
        ({"clip_grad_norm": 0.0}, "clip_grad_norm"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm"),
        ({"clip_grad_norm": math.nan}, "clip_grad_norm"),
        ({"eval_fn": lambda model: {}, "eval_every": 0}, "eval_every"),
        ({"eval_every": 5}, "eval_every"),
        ({"eval_fn": "accuracy"}, "eval_fn"),
        ({"loader_workers": -1}, "loader_workers"),
        ({"prefetch": 0}, "prefetch"),
        ({"steps": 0}, "steps"),
        ({"extra_state": (dict,)}, "extra_state"),
        ({"loss_scaling": LossScaling(backoff_factor=1.5)}, "loss_scaling.backoff_factor"),
        ({"loss_scaling": LossScaling(growth_factor=1.0)}, "loss_scaling.growth_factor"),
        ({"loss_scaling": LossScaling(growth_interval=0)}, "loss_scaling.growth_interval"),
        ({"loss_scaling": LossScaling(init_scale=0)}, "loss_scaling.init_scale"),
    ],
)
def test_invalid_settings_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=re.escape(f"TrainingSpec.{field}")):
        _spec(**options)


def test_a_scheduler_must_drive_the_specs_optimizer() -> None:
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(SpecError, match=re.escape("TrainingSpec.scheduler")):
        _spec(lambda optimizer: torch.optim.lr_scheduler.StepLR(other, step_size=1))
    with pytest.raises(SpecError, match="ReduceLROnPlateau"):
        _spec(torch.optim.lr_scheduler.ReduceLROnPlateau)  # type: ignore[arg-type]


INVALID_SCRIPT = """
import torch
from ebbflow_trainer import TrainingSpec


def build():
    model = torch.nn.Linear(2, 2)
    spec = TrainingSpec(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=list(range(64)),
        loss_fn=lambda model, batch: batch,
    )
    spec.precision = "half"  # changed after construction: checked again at load
    return spec
"""


def test_an_invalid_spec_fails_the_job_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(INVALID_SCRIPT)
    with pytest.raises(SpecError, match=re.escape("TrainingSpec.precision='half' must be one of")):
        load_spec(str(script))

    message = tmp_path / "termination-log"
    for name, value in VALID_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(contract.ENV_TERMINATION_MESSAGE_PATH, str(message))
    assert main(["run", str(script), "--state-dir", str(tmp_path)]) == contract.EXIT_INVALID_CONFIG
    assert "TrainingSpec.precision" in capsys.readouterr().err
    assert "TrainingSpec.precision" in message.read_text()


def test_the_status_model_accepts_the_progress_report_with_its_evaluation() -> None:
    """The operator copies rank 0's report into status.progress, which the API validates."""
    spec = _spec(eval_fn=lambda model: {"accuracy": 0.5, "nll": math.nan})
    evaluation = Evaluation(spec, lambda: torch.autocast("cpu", enabled=False))
    evaluation.run(20)
    shape = metrics.StepShape(
        2, 8, 2, 0.5, 0.3, noise_scale=120.0, rescale_pause_seconds=3.5, compression_rate=0.25
    )
    report = metrics.ProgressReporter.report(20, 640, 0.3, 99.0, evaluation.report(), shape)
    parsed = parse_progress(json.dumps(report))
    assert parsed == report and tuple(report) == contract.PROGRESS_FIELDS
    status = ElasticTrainingJobStatus.model_validate({"progress": parsed})
    assert status.progress is not None and status.progress.eval is not None
    assert status.progress.eval.metrics == {"accuracy": 0.5}
    written = status.to_json()["progress"]
    assert written["eval"] == {"step": 20, "metrics": {"accuracy": 0.5}}
    # Every field of the step's shape survives into status.progress (the policies' history).
    assert {k: written[k] for k in contract.PROGRESS_FIELDS[6:]} == {
        k: report[k] for k in contract.PROGRESS_FIELDS[6:]
    }
