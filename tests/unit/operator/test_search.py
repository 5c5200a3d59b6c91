"""The one-dimensional search both model fits use: golden section inside the grid's best basin."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from ebbflow_operator.policies.search import golden_min, grid_then_golden

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("f", "lo", "hi", "expected"),
    [
        pytest.param(lambda x: (x - 0.3) ** 2, 0.0, 1.0, 0.3, id="parabola"),
        pytest.param(lambda x: abs(x - 2.5), 0.0, 10.0, 2.5, id="kink"),
        pytest.param(lambda x: x, 0.0, 1.0, 0.0, id="minimum-at-the-low-end"),
        pytest.param(lambda x: -x, 0.0, 1.0, 1.0, id="minimum-at-the-high-end"),
    ],
)
def test_golden_min_finds_the_minimum(
    f: Callable[[float], float], lo: float, hi: float, expected: float
) -> None:
    assert golden_min(f, lo, hi) == pytest.approx(expected, abs=1e-3 * (hi - lo))


def test_golden_min_evaluates_rounds_plus_two_points() -> None:
    seen: list[float] = []
    golden_min(lambda x: seen.append(x) or (x - 0.7) ** 2, 0.0, 1.0, rounds=12)
    assert len(seen) == 14


def test_grid_then_golden_refines_the_best_basin_not_the_first() -> None:
    # Two basins: a shallow one at 1 and the deeper one at 7.
    def f(x: float) -> float:
        return min((x - 1.0) ** 2 + 0.5, (x - 7.0) ** 2)

    assert grid_then_golden(f, [float(i) for i in range(11)]) == pytest.approx(7.0, abs=1e-3)


def test_grid_then_golden_on_a_log_grid() -> None:
    grid = [math.log(10.0) * i / 12 for i in range(13)]
    assert math.exp(grid_then_golden(lambda g: (math.exp(g) - 4.0) ** 2, grid)) == pytest.approx(
        4.0, rel=1e-3
    )
