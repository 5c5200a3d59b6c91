"""Throughput model (Pollux): prediction, fit from synthetic measurements, prior, statistical efficiency."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from ebbflow_operator.policies.throughput import (
    BATCH_SWITCH_GAIN,
    TIME_SLICE_OVERHEAD,
    JobModel,
    Measurement,
    Placement,
    ThroughputParams,
    busiest_fraction,
    busy_devices,
    compute_speeds,
    fit,
    fit_cached,
    slowdown,
    statistical_efficiency,
    step_shape,
)

TRUE = ThroughputParams(
    alpha_c=0.01, beta_c=0.002, alpha_local=0.02, beta_local=0.003, alpha_net=0.1, beta_net=0.01, gamma=3.0
)


def measure(truth: ThroughputParams, noise: float = 0.0, seed: int = 0) -> list[Measurement]:
    """Measurements at K in {1..16}, on one and on two nodes, three micro-batch sizes, s = 1."""
    rnd = random.Random(seed)
    shots = []
    for workers in (1, 2, 4, 8, 16):
        for nodes in (1, 2) if workers > 1 else (1,):
            for micro in (16.0, 32.0, 64.0):
                step = truth.step_s(Placement(workers, nodes), micro, 1) * (1 + rnd.gauss(0, noise))
                compute = truth.compute_s(micro) * (1 + rnd.gauss(0, noise))
                shots.append(Measurement(workers, micro, step, compute, nodes, 1))
    return shots


@pytest.mark.parametrize(
    ("batch", "virtual", "workers", "expected"),
    [
        pytest.param(512, 64, 1, (8.0, 63), id="one worker does every virtual node"),
        pytest.param(512, 64, 64, (8.0, 0), id="one virtual node each"),
        pytest.param(512, 64, 100, (8.0, 0), id="workers beyond V idle"),
        pytest.param(512, 64, 3, (8.0, 21), id="uneven split: the busiest worker counts"),
        pytest.param(512, 0, 0, (512.0, 0), id="degenerate V and K"),
    ],
)
def test_step_shape(batch: int, virtual: int, workers: int, expected: tuple[float, int]) -> None:
    assert step_shape(batch, virtual, workers) == expected


@pytest.mark.parametrize(
    ("batch", "tuned", "noise", "expected"),
    [
        pytest.param(256, 256, 1000.0, 1.0, id="fixed batch: no loss"),
        pytest.param(512, 256, 256.0, 2 / 3, id="double batch, phi = M0"),
        pytest.param(512, 256, None, 1.0, id="no noise scale yet"),
        pytest.param(128, 256, 0.0, 2.0, id="smaller batch, phi 0"),
    ],
)
def test_statistical_efficiency(batch: int, tuned: int, noise: float | None, expected: float) -> None:
    assert statistical_efficiency(batch, tuned, noise) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("gamma", "expected"),
    [
        pytest.param(1.0, 0.03 + 0.02, id="gamma 1: no overlap, sum"),
        pytest.param(10.0, 0.03, id="gamma 10: almost max"),
    ],
)
def test_overlap_of_compute_and_sync(gamma: float, expected: float) -> None:
    params = ThroughputParams(0.03, 0.0, 0.02, 0.0, 0.02, 0.0, gamma)
    assert params.step_s(Placement(2, 1), 1.0, 0) == pytest.approx(expected, rel=0.01)


def test_one_worker_has_no_sync_and_time_slicing_slows_compute() -> None:
    alone = TRUE.step_s(Placement(1), 32.0, 3)
    assert alone == pytest.approx(4 * TRUE.compute_s(32.0))
    assert slowdown(2.0) == pytest.approx(2.0 * (1 + TIME_SLICE_OVERHEAD))
    assert TRUE.step_s(Placement(1, share=2.0), 32.0, 3) == pytest.approx(slowdown(2.0) * alone)


@pytest.mark.parametrize(
    ("share", "batches", "tail", "expected"),
    [
        pytest.param(1.0, 4, 1 / 3, 1.0, id="own device: no slowdown"),
        pytest.param(2.0, 1, 1.0, 2.2, id="even split: share plus context switches"),
        pytest.param(2.0, 3, 1.0, 2.2, id="even split: every micro-batch at the share"),
        pytest.param(1.5, 2, 1 / 3, (1.65 + 1.0) / 2, id="3 workers on 2 devices, V=4: last batch alone"),
        pytest.param(4.0, 2, 0.5, (4.4 + 2.2) / 2, id="the tail still time-sliced"),
        pytest.param(2.0, 1, 0.5, 1.1, id="workers beyond V idle: half the share"),
    ],
)
def test_slowdown(share: float, batches: int, tail: float, expected: float) -> None:
    assert slowdown(share, batches, tail) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("virtual", "workers", "expected"),
    [
        pytest.param(4, 2, 1.0, id="even split"),
        pytest.param(4, 3, 1 / 3, id="one of three holds two"),
        pytest.param(5, 3, 2 / 3, id="two of three hold two"),
        pytest.param(4, 8, 0.5, id="beyond V: half busy"),
        pytest.param(0, 3, 1.0, id="V unknown: even"),
    ],
)
def test_busiest_fraction(virtual: int, workers: int, expected: float) -> None:
    assert busiest_fraction(virtual, workers) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        pytest.param(Placement(1), 1.0, id="one worker"),
        pytest.param(Placement(8, 2), 4.0, id="packed on two nodes"),
        pytest.param(Placement(3, 1, share=1.5), 2.0, id="time-sliced: the devices"),
        pytest.param(Placement(5, 2), 3.0, id="the busiest node"),
    ],
)
def test_busy_devices(placement: Placement, expected: float) -> None:
    assert busy_devices(placement) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        pytest.param(Placement(1), 1.0, id="one busy device: none"),
        pytest.param(Placement(2, 2), 1.0, id="one worker per node: none"),
        pytest.param(Placement(4, 1), 1.3, id="four on a node: three more busy devices"),
        pytest.param(Placement(4, 1, share=2.0), 1.1 * 2.2, id="time-sliced: two busy devices"),
    ],
)
def test_contention_slows_compute_with_busy_devices_per_node(placement: Placement, expected: float) -> None:
    crowded = replace(TRUE, contention=0.1)
    assert crowded.slowed_compute_s(placement, 32.0, 0) == pytest.approx(expected * TRUE.compute_s(32.0))


def test_overhead_is_paid_once_per_step() -> None:
    with_overhead = replace(TRUE, overhead=0.005)
    for placement in (Placement(1), Placement(4, 2)):
        assert with_overhead.step_s(placement, 32.0, 3) == pytest.approx(
            TRUE.step_s(placement, 32.0, 3) + 0.005
        )


def test_fit_recovers_noise_free_parameters() -> None:
    fitted = fit(measure(TRUE))
    for name in ("alpha_c", "beta_c", "alpha_local", "beta_local", "alpha_net", "beta_net", "gamma"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name


def test_noisy_fit_predicts_unseen_sizes() -> None:
    fitted = fit(measure(TRUE, noise=0.02, seed=1))
    for workers, nodes in ((3, 1), (12, 2), (32, 4)):
        placement = Placement(workers, nodes)
        assert fitted.step_s(placement, 48.0, 2) == pytest.approx(TRUE.step_s(placement, 48.0, 2), rel=0.05)


CPU = replace(TRUE, contention=0.15, overhead=0.004)


def on_two_devices(truth: ThroughputParams, workers: int, micro: float, virtual: int = 4) -> Measurement:
    """What a job following `truth` reports with `workers` processes on one node of two devices (CPU
    cores): more than two time-slice them, and V/K need not be whole."""
    share = max(1.0, workers / 2)
    accum = -(-virtual // workers) - 1
    tail = busiest_fraction(virtual, workers)
    placement = Placement(workers, 1, share)
    step = truth.step_s(placement, micro, accum, tail)
    compute = truth.slowed_compute_s(placement, micro, accum, tail)
    return Measurement(workers, micro, step, compute, 1, accum, share, virtual_nodes=virtual)


def crowded(truth: ThroughputParams) -> list[Measurement]:
    return [on_two_devices(truth, k, m) for k in (1, 2, 3, 4) for m in (8.0, 16.0, 32.0)]


def test_fit_recovers_contention_and_overhead() -> None:
    fitted = fit(crowded(CPU))
    for name in ("alpha_c", "beta_c", "contention", "overhead", "alpha_local", "beta_local"):
        assert getattr(fitted, name) == pytest.approx(getattr(CPU, name), rel=0.02), name


def test_one_slow_single_worker_step_does_not_raise_the_overhead() -> None:
    shots = crowded(CPU)
    shots[1] = replace(shots[1], step_s=shots[1].step_s * 2)  # 1x16 measured under load
    assert fit(shots).overhead == pytest.approx(CPU.overhead, rel=0.02)


def test_no_contention_is_fitted_where_compute_does_not_slow() -> None:
    fitted = fit(crowded(TRUE))
    assert fitted.contention == 0.0
    assert fitted.overhead == pytest.approx(0.0, abs=1e-12)


def test_without_single_worker_steps_the_sync_line_absorbs_the_overhead() -> None:
    shots = [m for m in crowded(CPU) if m.workers > 1]
    fitted = fit(shots)
    assert fitted.overhead == ThroughputParams.prior().overhead
    for m in shots:
        assert fitted.step_s(m.placement, m.micro_batch, m.accum_steps, m.tail) == pytest.approx(
            m.step_s, rel=0.02
        )


def test_no_measurements_is_the_prior() -> None:
    assert fit([]) == ThroughputParams.prior()
    assert fit([Measurement(2, 32.0, step_s=0.0, compute_s=0.1)]) == ThroughputParams.prior()


def test_single_worker_measurements_fit_compute_only() -> None:
    shots = [m for m in measure(TRUE) if m.workers == 1]
    fitted = fit(shots)
    assert fitted.beta_c == pytest.approx(TRUE.beta_c, rel=0.01)
    assert fitted.alpha_c == pytest.approx(TRUE.alpha_c, rel=0.01)
    prior = ThroughputParams.prior()
    assert (fitted.alpha_net, fitted.beta_net, fitted.gamma) == (prior.alpha_net, prior.beta_net, prior.gamma)


def test_one_micro_batch_scales_the_prior_compute() -> None:
    shots = [Measurement(1, 32.0, step_s=0.2, compute_s=0.2)]
    assert fit(shots).compute_s(32.0) == pytest.approx(0.2)


def test_compute_measured_under_time_slicing_is_corrected() -> None:
    shots = [
        Measurement(1, micro, TRUE.compute_s(micro) * 2.2, TRUE.compute_s(micro) * 2.2, share=2.0)
        for micro in (16.0, 64.0)
    ]
    assert fit(shots).compute_s(32.0) == pytest.approx(TRUE.compute_s(32.0))


def test_a_slower_gpu_types_measurements_fit_the_reference_model() -> None:
    """Measured on a type at half the speed, normalised by that speed: the same parameters."""
    slow = []
    for m in measure(TRUE):
        step = TRUE.step_s(Placement(m.workers, m.nodes, speed=0.5), m.micro_batch, 1)
        slow.append(replace(m, step_s=step, compute_s=m.compute_s / 0.5, gpu_type="T4", speed=0.5))
    fitted = fit(slow)
    for workers, nodes in ((1, 1), (4, 1), (16, 2)):
        assert fitted.step_s(Placement(workers, nodes), 32.0, 1) == pytest.approx(
            TRUE.step_s(Placement(workers, nodes), 32.0, 1), rel=0.02
        )


def _on(gpu_type: str, compute_s: float, micro: float = 32.0) -> Measurement:
    return Measurement(1, micro, compute_s, compute_s, gpu_type=gpu_type)


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        pytest.param([], {}, id="nothing-measured"),
        pytest.param([[_on("A100", 0.1)]], {"A100": 1.0}, id="one-type"),
        pytest.param(
            [[_on("A100", 0.1), _on("A100", 0.2, 64.0), _on("T4", 0.25)], [_on("A100", 0.3)]],
            {"A100": 1.0, "T4": 0.4},
            id="a-job-on-both-types-links-them",
        ),
        pytest.param(
            [[_on("A100", 0.1)], [_on("A100", 0.3)], [_on("T4", 0.25)]],
            {"A100": 1.0},
            id="no-job-on-both-types-no-speed",
        ),
        pytest.param(
            [[_on("A100", 0.1), _on("T4", 0.25)], [_on("A100", 0.1), _on("T4", 0.5)], [_on("A100", 0.1)]],
            {"A100": 1.0, "T4": pytest.approx(0.3)},
            id="median-over-jobs",
        ),
    ],
)
def test_compute_speeds(jobs: list[list[Measurement]], expected: dict[str, float]) -> None:
    assert compute_speeds(jobs) == expected


def test_fitted_values_are_never_negative() -> None:
    # Sync time that falls with K (noise) must not give a negative slope.
    shots = [Measurement(k, 32.0, 0.2 - 0.001 * k, 0.05, nodes=2) for k in (2, 4, 8)]
    fitted = fit(shots)
    assert min(fitted.alpha_net, fitted.beta_net, fitted.alpha_c, fitted.beta_c) >= 0
    assert 1.0 <= fitted.gamma <= 10.0


def test_fit_is_memoised() -> None:
    shots = tuple(measure(TRUE))
    assert fit_cached(shots) is fit_cached(shots)


@pytest.mark.parametrize(
    ("params", "better_at_16"),
    [
        pytest.param(TRUE, True, id="cheap sync: 16 workers beat 4"),
        pytest.param(
            ThroughputParams(0.001, 0.0001, 0.5, 0.2, 1.0, 0.5, 1.0), False, id="sync-bound: 16 lose to 4"
        ),
    ],
)
def test_goodput_follows_scaling(params: ThroughputParams, better_at_16: bool) -> None:
    model = JobModel(params, global_batch=512, virtual_nodes=64)
    assert (model.goodput(Placement(16, 4)) > model.goodput(Placement(4, 1))) is better_at_16


def test_goodput_is_zero_without_workers_and_flat_beyond_virtual_nodes() -> None:
    model = JobModel(TRUE, global_batch=512, virtual_nodes=8)
    assert model.goodput(Placement(0)) == 0.0
    assert model.goodput(Placement(16, 2)) <= model.goodput(Placement(8, 2))
    expected = 512 / TRUE.step_s(Placement(8, 2), 64.0, 0)
    assert math.isclose(model.goodput(Placement(8, 2)), expected)


def test_all_zero_parameters_still_give_a_positive_step() -> None:
    model = JobModel(ThroughputParams(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0), global_batch=64, virtual_nodes=4)
    assert model.step_s(Placement(2)) > 0
    assert math.isfinite(model.goodput(Placement(2)))


# --- batch-size co-adaptation (JobModel.max_batch) --------------------------------------------------


def adaptive(
    noise: float | None, max_batch: int | None = 4096, batch: int = 256, virtual: int = 64
) -> JobModel:
    return JobModel(TRUE, global_batch=batch, virtual_nodes=virtual, noise_scale=noise, max_batch=max_batch)


@pytest.mark.parametrize(
    ("model", "workers", "expected"),
    [
        pytest.param(
            adaptive(1024.0), (1, 8, 16, 64), (512, 512, 2048, 4096), id="phi large: B grows with K"
        ),
        pytest.param(adaptive(4096.0), (1, 8, 16, 64), (1024, 1024, 4096, 4096), id="phi larger: larger B"),
        pytest.param(adaptive(1.0), (1, 8, 16, 32), (256,) * 4, id="phi small: B0"),
        pytest.param(adaptive(None), (1, 8, 16, 64), (256,) * 4, id="phi unknown: B0"),
        pytest.param(adaptive(1e6, max_batch=None), (1, 8, 64), (256,) * 3, id="B fixed: B0"),
        pytest.param(adaptive(1e6, max_batch=256), (1, 8, 64), (256,) * 3, id="max == B0"),
        pytest.param(adaptive(1e6, max_batch=100), (1, 64), (256,) * 2, id="max below B0: B0"),
        pytest.param(adaptive(1e6), (0,), (256,), id="zero workers: B0"),
        pytest.param(adaptive(1e6), (1,), (4096,), id="one worker, phi huge: max (amortises alpha_c)"),
        pytest.param(
            adaptive(1e6, max_batch=1000), (64,), (960,), id="max not a multiple of V: rounded down"
        ),
    ],
)
def test_best_batch(model: JobModel, workers: tuple[int, ...], expected: tuple[int, ...]) -> None:
    got = tuple(model.best_batch(Placement(k, max(1, k // 8))) for k in workers)
    assert got == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        pytest.param(adaptive(1.0), (256, 512, 1024, 2048, 4096), id="powers of two up to max"),
        pytest.param(adaptive(1.0, max_batch=3000), (256, 512, 1024, 2048, 2944), id="max rounded to V"),
        pytest.param(adaptive(1.0, max_batch=300), (256,), id="max rounds down to B0"),
        pytest.param(adaptive(1.0, batch=192, max_batch=640), (192, 384, 640), id="B0 not a power of two"),
        pytest.param(adaptive(None), (256,), id="phi unknown"),
        pytest.param(adaptive(1.0, max_batch=None), (256,), id="fixed"),
    ],
)
def test_batch_candidates(model: JobModel, expected: tuple[int, ...]) -> None:
    assert model.batch_candidates() == expected


def test_best_batch_stays_in_bounds_on_multiples_of_v() -> None:
    rnd = random.Random(3)
    for _ in range(300):
        virtual = rnd.choice((1, 3, 8, 12, 64))
        batch = virtual * rnd.randint(1, 40)
        top = batch + rnd.randint(0, 5000)
        params = ThroughputParams(*(rnd.uniform(0.0, 0.05) for _ in range(6)), gamma=rnd.uniform(1.0, 10.0))
        model = JobModel(params, batch, virtual, rnd.choice((None, 0.0, 10.0, 1e3, 1e6)), max_batch=top)
        workers = rnd.randint(0, 100)
        best = model.best_batch(Placement(workers, max(1, workers // 8)))
        assert batch <= best <= top and best % virtual == 0
        goodput, at = model.best(Placement(workers, max(1, workers // 8)))
        assert at == best and goodput == model.goodput(Placement(workers, max(1, workers // 8)), best)
        assert all(
            model.goodput(Placement(workers), b) <= model.best(Placement(workers))[0]
            for b in model.batch_candidates()
        )


@pytest.mark.parametrize(
    ("noise", "current", "expected"),
    [
        pytest.param(700.0, None, 1024, id="nothing chosen yet: the best"),
        pytest.param(700.0, 1024, 1024, id="running the best: kept"),
        pytest.param(800.0, 1024, 1024, id="just past the crossing: the running batch kept"),
        pytest.param(800.0, 2048, 2048, id="just before the crossing the other way: kept"),
        pytest.param(3000.0, 512, 2048, id="far below the best: switched"),
        pytest.param(800.0, 1000, 2048, id="a batch that is no candidate: the best"),
    ],
)
def test_batch_to_run_keeps_the_running_batch_within_the_switch_gain(
    noise: float, current: int | None, expected: int
) -> None:
    model, placement = adaptive(noise), Placement(16, 2)
    chosen = model.batch_to_run(placement, current)
    assert chosen == expected
    assert model.goodput(placement, chosen) * (1 + BATCH_SWITCH_GAIN) >= model.best(placement)[0]


def test_a_noise_scale_jittering_at_a_crossing_switches_the_batch_once() -> None:
    """phi near 754, where 1024 and 2048 trade places at 16 workers: the best batch flips at every
    estimate, the batch to run once."""
    placement, running, switches, flips = Placement(16, 2), 1024, 0, 0
    best = adaptive(740.0).best_batch(placement)
    for noise in [740.0, 770.0] * 10 + [2000.0]:
        model = adaptive(noise)
        flips += model.best_batch(placement) != best
        best = model.best_batch(placement)
        chosen = model.batch_to_run(placement, running)
        switches += chosen != running
        running = chosen
    # The best flips at each of the 19 jitters; the batch run moves once, to phi = 2000's best.
    assert flips == 19 and switches == 1 and running == 2048


def test_a_fixed_batch_job_is_the_old_model_float_for_float() -> None:
    """Without max_batch every method is the fixed-batch model: same floats, B0 chosen."""
    for noise in (None, 100.0):
        model = JobModel(TRUE, global_batch=512, virtual_nodes=64, noise_scale=noise)
        for placement in (Placement(1), Placement(8), Placement(16, 2, 1.5), Placement(64, 8)):
            micro, accum = step_shape(512, 64, placement.workers)
            expected = 512 * 1.0 / max(TRUE.step_s(placement, micro, accum), 1e-9)
            assert model.goodput(placement) == model.goodput(placement, 512) == expected
            assert model.best(placement) == (expected, 512)
