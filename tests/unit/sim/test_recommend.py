"""The time/cost recommender: fit, per-type speed, choice under a deadline or budget, and its CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from ebbflow_operator.policies.throughput import (
    Measurement,
    Placement,
    ThroughputParams,
    busiest_fraction,
    step_shape,
)
from ebbflow_sim.cli import main as sim_main
from ebbflow_sim.recommend import (
    Goal,
    Offer,
    Option,
    choose,
    fit_model,
    held_out_errors,
    options,
    predict,
)

TRUE = ThroughputParams(alpha_c=0.004, beta_c=0.002, alpha_local=0.01, beta_local=0.002,
                        alpha_net=0.03, beta_net=0.004, gamma=1.5)  # fmt: skip
V, B = 8, 128


def sample(
    workers: int, micro: float, gpu_type: str = "a100", speed: float = 1.0, gpus_per_node: int = 4
) -> Measurement:
    """What the trainers of a job following TRUE (compute `speed` times as fast) would report."""
    nodes = -(-workers // gpus_per_node)
    accum = -(-V // workers) - 1
    step = TRUE.step_s(Placement(workers, nodes, speed=speed), micro, accum)
    return Measurement(workers, micro, step, TRUE.compute_s(micro) / speed, nodes, accum, gpu_type=gpu_type)


MEASURED = [sample(k, m) for k in (1, 2, 4, 6, 8) for m in (8.0, 16.0)]


def test_the_fit_predicts_held_out_measurements_of_a_job_that_follows_the_model() -> None:
    errors = held_out_errors(MEASURED)
    assert len(errors) == len(MEASURED)
    assert max(errors) < 0.02, errors


def test_held_out_steps_of_processes_sharing_two_cores() -> None:
    """1-4 processes on one node of two devices (the CPU bench): contention, a fixed overhead per
    step, time-slicing beyond two and an uneven split at three are all in the fit."""
    truth = replace(TRUE, contention=0.15, overhead=0.004)
    shots = []
    for workers in (1, 2, 3, 4):
        share, accum, tail = max(1.0, workers / 2), -(-4 // workers) - 1, busiest_fraction(4, workers)
        placement = Placement(workers, 1, share)
        for micro in (8.0, 16.0, 32.0):
            step = truth.step_s(placement, micro, accum, tail)
            compute = truth.slowed_compute_s(placement, micro, accum, tail)
            shots.append(Measurement(workers, micro, step, compute, 1, accum, share, "cpu", virtual_nodes=4))
    assert max(held_out_errors(shots)) < 0.02


def test_a_second_gpu_types_speed_is_learned_from_its_measurements() -> None:
    slow = [sample(k, 16.0, "t4", speed=0.4) for k in (1, 2)]
    model = fit_model([*MEASURED, *slow])
    assert model.reference == "a100"
    assert model.speeds["t4"] == pytest.approx(0.4, rel=0.02)
    predicted = predict(model, Offer("t4", 0.5, gpus_per_node=4), 4, Goal(1000, B, V))
    expected = sample(4, B / V, "t4", speed=0.4).step_s
    assert predicted.step_s == pytest.approx(expected, rel=0.05)


def test_an_unmeasured_type_uses_the_declared_speed() -> None:
    model = fit_model(MEASURED)
    goal = Goal(1000, B, V)
    fast, declared = (
        predict(model, Offer("a100", 1.0), 1, goal),
        predict(model, Offer("h100", 1.0, speed=2.0), 1, goal),
    )
    assert declared.step_s == pytest.approx(fast.step_s / 2)


def test_time_and_cost_follow_from_the_step_time() -> None:
    model = fit_model(MEASURED)
    option = predict(model, Offer("a100", 3.0, gpus_per_node=4), 6, Goal(3600, B, V))
    micro, accum = step_shape(B, V, 6)
    assert option.nodes == 2
    assert option.step_s == pytest.approx(model.params.step_s(Placement(6, 2), micro, accum))
    assert option.hours == pytest.approx(option.step_s)  # 3,600 steps
    assert option.cost == pytest.approx(6 * 3.0 * option.hours)


CANDIDATES = [
    Option("a", 1, 1, 1.0, hours=10.0, cost=10.0),
    Option("a", 2, 1, 0.6, hours=6.0, cost=12.0),
    Option("a", 4, 1, 0.4, hours=4.0, cost=16.0),
    Option("b", 4, 1, 0.3, hours=3.0, cost=24.0),
]


@pytest.mark.parametrize(
    ("deadline", "budget", "expected"),
    [
        pytest.param(7.0, None, CANDIDATES[1], id="cheapest-within-the-deadline"),
        pytest.param(3.5, None, CANDIDATES[3], id="a-tight-deadline-costs-more"),
        pytest.param(2.0, None, None, id="no-option-meets-the-deadline"),
        pytest.param(None, 16.0, CANDIDATES[2], id="fastest-within-the-budget"),
        pytest.param(None, 5.0, None, id="nothing-within-the-budget"),
        pytest.param(None, None, CANDIDATES[3], id="no-constraint-fastest"),
    ],
)
def test_choice(deadline: float | None, budget: float | None, expected: Option | None) -> None:
    assert choose(CANDIDATES, Goal(1, 1, 1, deadline, budget)) == expected


def test_options_cover_every_type_up_to_its_supply_and_the_virtual_nodes() -> None:
    model = fit_model(MEASURED)
    found = options(model, [Offer("a100", 1.0, max_gpus=3), Offer("t4", 0.3)], Goal(10, B, V))
    assert [(o.gpu_type, o.workers) for o in found] == [("a100", k) for k in (1, 2, 3)] + [
        ("t4", k) for k in range(1, V + 1)
    ]


def test_degenerate_inputs() -> None:
    with pytest.raises(ValueError, match="no measurements"):
        fit_model([])
    assert held_out_errors([MEASURED[0]]) == []  # nothing left to fit the held-out one with


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _measurements_csv(path: Path) -> Path:
    lines = ["gpu_type,workers,nodes,micro_batch,accumulation_steps,step_seconds,compute_seconds"]
    for m in MEASURED:
        lines.append(
            f"{m.gpu_type},{m.workers},{m.nodes},{m.micro_batch},{m.accum_steps},{m.step_s},{m.compute_s}"
        )
    return _write(path / "measured.csv", "\n".join(lines) + "\n")


def test_cli_prints_the_choice_and_the_fit_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prices = _write(tmp_path / "prices.csv", "gpu_type,price_per_gpu_hour,gpus_per_node\na100,3.0,4\n")
    args = ["recommend", "--measurements", str(_measurements_csv(tmp_path)), "--prices", str(prices)]
    sim_main([*args, "--steps", "100000", "--global-batch", str(B), "--virtual-nodes", str(V),
              "--deadline-hours", "10", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["choice"]["hours"] <= 10 and report["choice"]["gpu_type"] == "a100"
    cheaper = [o for o in report["options"] if o["hours"] <= 10 and o["cost"] < report["choice"]["cost"]]
    assert cheaper == []
    assert report["median_held_out_error"] < 0.02


@pytest.mark.parametrize(
    ("measurements", "message"),
    [
        pytest.param("gpu_type,workers\na100,2\n", "missing column(s) nodes", id="missing-column"),
        pytest.param(
            "gpu_type,workers,nodes,micro_batch,accumulation_steps,step_seconds,compute_seconds\n"
            "a100,two,1,8,0,1.0,0.5\n",
            "line 2: workers='two' is not a int",
            id="not-a-number",
        ),
        pytest.param(
            "gpu_type,workers,nodes,micro_batch,accumulation_steps,step_seconds,compute_seconds\n",
            "no measurements",
            id="empty",
        ),
    ],
)
def test_cli_rejects_a_bad_file_naming_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], measurements: str, message: str
) -> None:
    prices = _write(tmp_path / "prices.csv", "gpu_type,price_per_gpu_hour\na100,3.0\n")
    measured = _write(tmp_path / "measured.csv", measurements)
    with pytest.raises(SystemExit) as exit_info:
        sim_main(["recommend", "--measurements", str(measured), "--prices", str(prices),
                  "--steps", "10", "--global-batch", "64", "--virtual-nodes", "8"])  # fmt: skip
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
