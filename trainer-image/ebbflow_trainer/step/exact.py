"""Order-independent sums of floating-point rows through one int64 per value (deterministic mode).

Every virtual node's row is rounded onto a fixed-point grid all workers share (one small
all-reduce(MAX) agrees on each block's exponent), the integers are added in any order and grouping,
and the sum is decoded once: the result depends on the V rows only, never on the world size or on
which worker computed which virtual node. Non-finite values travel as per-value counts beside the
grid, so decoding restores what float addition gives.

Invariants: no overflow for any V (|q| <= 2**(62 - ceil(log2 V))); per value, |decoded mean - exact
mean| <= 2**(ceil(log2 V) - 62) * M + 2**-51 * |exact mean|, M the block's largest |value|. The grid,
the error bound and why one limb: docs/design/step.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

BLOCK = 4096
# Values quantized together (blocks of one row, or small pieces of several rows): bounds the scratch
# memory to CHUNK_BLOCKS * BLOCK * 20 bytes (float64, float32 and int64), small enough to stay in cache.
CHUNK_BLOCKS = 32
# The exponent of a block holding no finite non-zero value: below every real one.
NO_EXPONENT = -(2**30)
_COUNT_BITS = 21
_COUNT_MASK = (1 << _COUNT_BITS) - 1
_POSINF, _NEGINF, _NAN = 1, 1 << _COUNT_BITS, 1 << (2 * _COUNT_BITS)
MAX_TERMS = _COUNT_MASK


def fraction_bits(terms: int) -> int:
    """F: grid bits below a block's exponent, so that ``terms`` grid values add up within 2**62."""
    if not 1 <= terms <= MAX_TERMS:
        raise ValueError(f"exact sums support 1..{MAX_TERMS} terms, not {terms}")
    return 62 - (terms - 1).bit_length()


@dataclass(frozen=True)
class _Piece:
    """``blocks`` consecutive blocks of ``width`` values, from value ``start`` and block ``first_block``."""

    start: int
    blocks: int
    width: int
    first_block: int

    @property
    def stop(self) -> int:
        return self.start + self.blocks * self.width

    @property
    def block_slice(self) -> slice:
        return slice(self.first_block, self.first_block + self.blocks)


class BlockLayout:
    """A row of ``sum(segment_sizes)`` values cut into blocks of at most ``block`` values per segment."""

    def __init__(self, segment_sizes: Sequence[int], block: int = BLOCK, chunk_blocks: int = CHUNK_BLOCKS):
        pieces: list[_Piece] = []
        self.segment_blocks: list[range] = []
        start = blocks = 0
        for size in segment_sizes:
            first = blocks
            full, rest = divmod(size, block)
            for offset in range(0, full, chunk_blocks):
                count = min(chunk_blocks, full - offset)
                pieces.append(_Piece(start, count, block, blocks))
                start, blocks = start + count * block, blocks + count
            if rest:
                pieces.append(_Piece(start, 1, rest, blocks))
                start, blocks = start + rest, blocks + 1
            self.segment_blocks.append(range(first, blocks))
        self.pieces = tuple(pieces)
        self.size = start
        self.num_blocks = blocks
        self.chunk_values = chunk_blocks * block  # the largest piece

    def view(self, row: torch.Tensor, piece: _Piece) -> torch.Tensor:
        return row[piece.start : piece.stop].view(piece.blocks, piece.width)

    def positions(self, blocks: torch.Tensor) -> torch.Tensor:
        """Indices of the values of the flagged ``blocks`` (a bool per block), in block order."""
        ranges: list[torch.Tensor] = []
        if not bool(blocks.any()):
            return torch.zeros(0, dtype=torch.int64)
        for piece in self.pieces:
            for index in blocks[piece.block_slice].nonzero().flatten().tolist():
                start = piece.start + index * piece.width
                ranges.append(torch.arange(start, start + piece.width))
        return torch.cat(ranges) if ranges else torch.zeros(0, dtype=torch.int64)


def _exponents(magnitude: torch.Tensor) -> torch.Tensor:
    """E with magnitude < 2**E (frexp's exponent), NO_EXPONENT for zero."""
    exponent = torch.frexp(magnitude.double()).exponent
    return torch.where(magnitude > 0, exponent, torch.full_like(exponent, NO_EXPONENT))


def _stacks(layout: BlockLayout, rows: Sequence[torch.Tensor], piece: _Piece) -> Iterator[torch.Tensor]:
    """``piece`` of every row as [rows, blocks, width] tensors of at most ``chunk_values`` values each:
    a large piece goes one row at a time (a view), small ones are stacked, so few operations run."""
    per_stack = max(1, layout.chunk_values // (piece.stop - piece.start))
    for first in range(0, len(rows), per_stack):
        group = rows[first : first + per_stack]
        if len(group) == 1:
            yield layout.view(group[0], piece).unsqueeze(0)
        else:
            yield torch.stack([layout.view(row, piece) for row in group])


def local_agreement(layout: BlockLayout, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """This worker's share of the grid: int32 [2, blocks], the largest exponent of a finite value of
    ``rows`` per block and 1 where one of them is NaN or infinite. All-reduce it with MAX."""
    device = rows[0].device if rows else torch.device("cpu")
    agreement = torch.zeros(2, layout.num_blocks, dtype=torch.int32, device=device)
    agreement[0] = NO_EXPONENT
    for piece in layout.pieces:
        target = agreement[:, piece.block_slice]
        for stack in _stacks(layout, rows, piece):
            magnitude = stack.abs().amax(dim=2).amax(dim=0)  # NaN and infinities come through
            nonfinite = ~torch.isfinite(magnitude)
            if bool(nonfinite.any()):
                finite = torch.where(torch.isfinite(stack), stack, torch.zeros_like(stack))
                magnitude = finite.abs().amax(dim=2).amax(dim=0)
            torch.maximum(target[0], _exponents(magnitude), out=target[0])
            torch.maximum(target[1], nonfinite.int(), out=target[1])
    return agreement.cpu()


def _powers_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """2.0**k in float64, built from its bits (exact for k in [-1022, 1023])."""
    return ((exponents.long() + 1023) << 52).view(torch.float64)


def _shifts(agreement: torch.Tensor, terms: int) -> torch.Tensor:
    """F - E per block: the grid is 2**-(F - E). Clamped to float64's normal range; a block at a clamp
    holds only zeros and non-finite values (or float64 values below 2**-960)."""
    return (fraction_bits(terms) - agreement[0].long()).clamp(-1022, 1022)


def encode(
    layout: BlockLayout,
    rows: Sequence[torch.Tensor],
    agreement: torch.Tensor,
    terms: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The sum of ``rows`` on the agreed grid (int64), exactly: each row is rounded on its own.
    Added into ``out`` (an int64 row) when given."""
    device = rows[0].device if rows else torch.device("cpu")
    shifts = _shifts(agreement, terms)
    # float32 rows are scaled in float32 where the factor fits: exact as well (|x| < 2**E keeps
    # x * 2**(F - E) below 2**62, and a product too small for a normal float32 rounds to 0 either
    # way), with half the memory traffic. Blocks without a finite non-zero value take any factor.
    narrow_shifts = torch.where(agreement[0] == NO_EXPONENT, 0, shifts)
    narrow_rows = bool(rows) and rows[0].dtype == torch.float32
    factors = {
        torch.float64: _powers_of_two(shifts).to(device),
        torch.float32: _powers_of_two(narrow_shifts.clamp(max=127)).float().to(device),
    }
    flagged = agreement[1] > 0
    if out is not None and out.device == device:
        total = out
    else:
        total = torch.zeros(layout.size, dtype=torch.int64, device=device)
    scratch = {dtype: torch.empty(layout.chunk_values, dtype=dtype, device=device) for dtype in factors}
    int_scratch = torch.empty(layout.chunk_values, dtype=torch.int64, device=device)
    for piece in layout.pieces:
        narrow = narrow_rows and int(narrow_shifts[piece.block_slice].max()) <= 127
        dtype = torch.float32 if narrow else torch.float64
        scale = factors[dtype][piece.block_slice].unsqueeze(1)
        zero_nonfinite = bool(flagged[piece.block_slice].any())
        target = layout.view(total, piece)
        for stack in _stacks(layout, rows, piece):
            grid = scratch[dtype][: stack.numel()].view(stack.shape)
            integers = int_scratch[: stack.numel()].view(stack.shape)
            if narrow:
                torch.mul(stack, scale, out=grid)  # exact: a power of two
            else:
                grid.copy_(stack)
                grid.mul_(scale)  # exact: a power of two, in float64
            if zero_nonfinite:
                torch.nan_to_num(grid, nan=0.0, posinf=0.0, neginf=0.0, out=grid)
            grid.round_()
            integers.copy_(grid)
            target += integers[0] if len(stack) == 1 else integers.sum(dim=0)
    if out is not None and total is not out:
        out += total.to(out.device)
        return out
    return total


def decode_mean(
    layout: BlockLayout, total: torch.Tensor, agreement: torch.Tensor, terms: int
) -> torch.Tensor:
    """The mean over the ``terms`` rows, in float64, of an (all-reduced) ``encode`` sum: the integer
    rounded to float64, times the block's grid step divided by ``terms`` (both rounded to float64).
    The mean, unlike the sum, cannot overflow where the terms did not."""
    factors = (_powers_of_two(-_shifts(agreement, terms)) / terms).to(total.device)
    values = total.to(torch.float64)
    for piece in layout.pieces:
        layout.view(values, piece).mul_(factors[piece.block_slice].unsqueeze(1))
    return values


def count_nonfinite(rows: Sequence[torch.Tensor], positions: torch.Tensor) -> torch.Tensor:
    """Per value at ``positions``: how many rows hold +inf, -inf and NaN there, packed in one int64."""
    counts = torch.zeros(positions.numel(), dtype=torch.int64)
    for row in rows:
        values = row[positions.to(row.device)].cpu()
        counts += torch.isposinf(values).long() * _POSINF
        counts += torch.isneginf(values).long() * _NEGINF
        counts += torch.isnan(values).long() * _NAN
    return counts


def restore_nonfinite(values: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor) -> None:
    """Put back, in place, what float addition gives where the summed ``counts`` saw a non-finite value."""
    if positions.numel() == 0:
        return
    positions, counts = positions.to(values.device), counts.to(values.device)
    positive = (counts & _COUNT_MASK) > 0
    negative = ((counts >> _COUNT_BITS) & _COUNT_MASK) > 0
    nan = (counts >> (2 * _COUNT_BITS)) > 0
    restored = values[positions]
    restored = torch.where(positive, torch.full_like(restored, torch.inf), restored)
    restored = torch.where(negative, torch.full_like(restored, -torch.inf), restored)
    restored = torch.where(nan | (positive & negative), torch.full_like(restored, torch.nan), restored)
    values[positions] = restored
