"""Exact sums (deterministic mode's arithmetic): the same bits for every split of the same terms, and
the documented error bound against exact summation."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from ebbflow_trainer.step import exact

# Segments as the engine has them (gradient, buffers, loss and norm), small blocks to get many.
SEGMENTS = [70, 9, 2]
BLOCK = 16


def _layout() -> exact.BlockLayout:
    return exact.BlockLayout(SEGMENTS, block=BLOCK, chunk_blocks=2)


def _terms(kind: str, count: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """``count`` rows of ``sum(SEGMENTS)`` values of one flavour of awkward."""
    g = torch.Generator().manual_seed(seed)
    size = sum(SEGMENTS)
    tiny = torch.finfo(dtype).tiny
    if kind == "normal":
        return [torch.randn(size, generator=g, dtype=dtype) for _ in range(count)]
    if kind == "wide":  # magnitudes from 1e-30 to 1e30 within a block, mixed signs
        return [
            torch.randn(size, generator=g, dtype=dtype) * 10.0 ** (torch.rand(size, generator=g) * 60 - 30)
            for _ in range(count)
        ]
    if kind == "subnormal":  # subnormals, zeros and signed zeros
        rows = [torch.randint(-3, 4, (size,), generator=g).to(dtype) * tiny / 8 for _ in range(count)]
        rows[0][::3] = -0.0
        return rows
    if kind == "cancelling":  # x and -x in different terms, plus a few ones
        half = [torch.randn(size, generator=g, dtype=dtype) * 1e6 for _ in range(count // 2)]
        rows = [*half, *(-r for r in half)]
        rows += [torch.ones(size, dtype=dtype)] * (count - len(rows))
        return rows
    if kind == "zero_blocks":  # whole blocks of zeros next to large values
        rows = [torch.randn(size, generator=g, dtype=dtype) * 1e20 for _ in range(count)]
        for row in rows:
            row[:BLOCK] = 0.0
        return rows
    if kind == "extreme":  # the largest finite values: no integer overflow at F bits
        big = torch.finfo(dtype).max
        return [torch.full((size,), big if i % 2 else big / 3, dtype=dtype) for i in range(count)]
    raise ValueError(kind)


def _random_split(count: int, rng: random.Random) -> list[list[int]]:
    """Terms dealt to a random number of groups in a random order, some groups possibly empty."""
    order = list(range(count))
    rng.shuffle(order)
    groups: list[list[int]] = [[] for _ in range(rng.randint(1, count + 1))]
    for index in order:
        groups[rng.randrange(len(groups))].append(index)
    return groups


def _exact_mean(layout: exact.BlockLayout, rows: list[torch.Tensor], groups: list[list[int]]) -> torch.Tensor:
    """What the workers compute: a MAX-agreed grid, each group's encoded sum, their integer sum, decoded."""
    count = len(rows)
    shares = [exact.local_agreement(layout, [rows[i] for i in group]) for group in groups]
    agreement = torch.stack(shares).amax(0)
    total = torch.zeros(layout.size, dtype=torch.int64)
    for group in reversed(groups):
        total += exact.encode(layout, [rows[i] for i in group], agreement, count)
    positions = layout.positions(agreement[1] > 0)
    counts = sum(
        (exact.count_nonfinite([rows[i] for i in group], positions) for group in groups),
        torch.zeros(positions.numel(), dtype=torch.int64),
    )
    values = exact.decode_mean(layout, total, agreement, count)
    exact.restore_nonfinite(values, positions, counts)
    return values


KINDS = ["normal", "wide", "subnormal", "cancelling", "zero_blocks", "extreme"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", [1, 5, 12, 64])
def test_every_split_of_the_same_terms_gives_the_same_bits(kind: str, count: int, dtype: torch.dtype) -> None:
    layout = _layout()
    rows = _terms(kind, count, dtype, seed=count)
    reference = _exact_mean(layout, rows, [list(range(count))])
    rng = random.Random(f"{kind}-{count}")
    for _ in range(4):
        ours = _exact_mean(layout, rows, _random_split(count, rng))
        assert torch.equal(ours.view(torch.int64), reference.view(torch.int64))
    assert bool(torch.isfinite(reference).all())


@pytest.mark.parametrize("kind", KINDS)
def test_float32_rows_round_to_the_same_integers_as_their_float64_values(kind: str) -> None:
    """float32 rows are scaled in float32 where the factor fits (tiny blocks fall back to float64)."""
    layout = _layout()
    rows = _terms(kind, 12, torch.float32, seed=5)
    for row in rows:
        row[: layout.size // 2] *= 2.0**-100  # blocks whose factor does not fit a float32
    agreement = exact.local_agreement(layout, rows)
    assert torch.equal(agreement, exact.local_agreement(layout, [r.double() for r in rows]))
    narrow = exact.encode(layout, rows, agreement, 12)
    assert torch.equal(narrow, exact.encode(layout, [r.double() for r in rows], agreement, 12))


def _bound(rows: list[torch.Tensor], layout: exact.BlockLayout) -> torch.Tensor:
    """The documented bound's first term per value: 2**(ceil(log2 V) - 62) * M_block."""
    magnitude = torch.stack(rows).double().abs().amax(0)
    per_value = torch.empty(layout.size, dtype=torch.float64)
    for piece in layout.pieces:
        block_max = layout.view(magnitude, piece).amax(1, keepdim=True)
        layout.view(per_value, piece).copy_(block_max.expand(piece.blocks, piece.width))
    return per_value * 2.0 ** ((len(rows) - 1).bit_length() - 62)


@pytest.mark.parametrize("kind", ["normal", "wide", "subnormal", "cancelling", "zero_blocks"])
@pytest.mark.parametrize("count", [1, 3, 12, 64])
def test_the_mean_is_within_the_documented_bound_of_the_exact_mean(kind: str, count: int) -> None:
    layout = _layout()
    rows = _terms(kind, count, torch.float32, seed=100 + count)
    mean = _exact_mean(layout, rows, [list(range(count))])
    exact_mean = [sum((Fraction(float(r[i])) for r in rows), Fraction(0)) / count for i in range(layout.size)]
    bound = _bound(rows, layout)
    for i, truth in enumerate(exact_mean):
        error = abs(Fraction(float(mean[i])) - truth)
        allowed = Fraction(float(bound[i])) + abs(truth) * Fraction(1, 2**51)
        assert error <= allowed, (i, float(mean[i]), float(truth), float(error), float(allowed))


def test_a_value_at_its_block_maximum_is_as_accurate_as_float32_summation_or_better() -> None:
    """For values near their block's maximum the grid beats float32's own rounding by far."""
    layout = _layout()
    rows = _terms("normal", 64, torch.float32, seed=7)
    ours = _exact_mean(layout, rows, [list(range(64))])
    truth = torch.tensor(
        [math.fsum(float(r[i]) for r in rows) / 64 for i in range(layout.size)], dtype=torch.float64
    )
    naive = torch.stack(rows).sum(0, dtype=torch.float32).double() / 64
    assert float((ours - truth).abs().max()) < float((naive - truth).abs().max()) / 1e6


@pytest.mark.parametrize("count", [1, 2, 5, 64])
def test_non_finite_values_sum_like_floats(count: int) -> None:
    layout = _layout()
    rows = _terms("normal", count, torch.float32, seed=3)
    rng = random.Random(count)
    specials = [math.inf, -math.inf, math.nan]
    for row in rows:
        for _ in range(6):
            row[rng.randrange(layout.size)] = rng.choice(specials)
    truth = torch.stack(rows).double().mean(0)
    ours = _exact_mean(layout, rows, [list(range(count))])
    assert torch.equal(torch.isnan(ours), torch.isnan(truth))
    assert torch.equal(torch.isposinf(ours), torch.isposinf(truth))
    assert torch.equal(torch.isneginf(ours), torch.isneginf(truth))
    for _ in range(4):
        split = _exact_mean(layout, rows, _random_split(count, rng))
        assert torch.equal(split.view(torch.int64), ours.view(torch.int64))
    finite = torch.isfinite(truth)
    assert torch.allclose(ours[finite], truth[finite], rtol=1e-12, atol=1e-12)


def test_the_agreement_reports_exponents_and_non_finite_blocks() -> None:
    layout = exact.BlockLayout([4, 4, 2], block=4)
    row = torch.tensor([0.0, -0.0, 0.0, 0.0, 3.0, -0.5, 1e-40, 1.0, math.nan, 2.0**-10])
    agreement = exact.local_agreement(layout, [row])
    assert agreement.dtype == torch.int32
    assert agreement[0].tolist() == [exact.NO_EXPONENT, 2, -9]  # 3 < 2**2; 2**-10 < 2**-9
    assert agreement[1].tolist() == [0, 0, 1]


def test_terms_beyond_the_count_bits_are_refused() -> None:
    assert exact.fraction_bits(1) == 62 and exact.fraction_bits(2) == 61 and exact.fraction_bits(64) == 56
    assert exact.fraction_bits(65) == 55
    with pytest.raises(ValueError, match="terms"):
        exact.fraction_bits(exact.MAX_TERMS + 1)
