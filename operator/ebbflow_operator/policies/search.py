"""One-dimensional minimisation shared by the model fits (throughput's gamma, the loss curve's b).

Both fits minimise a squared error over one parameter whose error curve is smooth but not known to be
unimodal over the whole range: a coarse grid finds the basin, golden-section search refines it. Pure,
deterministic: the same function and grid give the same point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

GOLDEN_ROUNDS = 20  # shrinks the bracket to 0.618^20, about 7e-5 of two grid steps
_RATIO = (math.sqrt(5.0) - 1.0) / 2.0


def golden_min(f: Callable[[float], float], lo: float, hi: float, rounds: int = GOLDEN_ROUNDS) -> float:
    """Golden-section search on [lo, hi]; each round reuses one of the previous round's two
    evaluations, so ``rounds + 2`` evaluations in all."""
    a, b = lo, hi
    c, d = b - _RATIO * (b - a), a + _RATIO * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(rounds):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _RATIO * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _RATIO * (b - a)
            fd = f(d)
    return (a + b) / 2.0


def grid_then_golden(
    f: Callable[[float], float], grid: Sequence[float], rounds: int = GOLDEN_ROUNDS
) -> float:
    """The grid point with the least error (the first among equals), refined by `golden_min` between
    its two neighbours."""
    errors = [f(x) for x in grid]
    best = min(range(len(grid)), key=lambda i: errors[i])
    lo, hi = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    return golden_min(f, lo, hi, rounds)
