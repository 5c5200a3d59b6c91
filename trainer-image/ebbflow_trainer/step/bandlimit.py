"""Band-limited 2-D convolutions (Dziedzic et al., ICML 2019): a convolution computed in the frequency
domain with the highest frequencies of its input and kernel spectra dropped, so that a worker whose
GPU memory shrinks trades a little accuracy for memory instead of crashing.

Discrete Fourier transforms restricted to the kept frequencies run as real matrix products, one
spatial axis at a time, with zero padding folded in and complex values as real tensors ("planar").

Invariants: at rate 0 a `BandLimitedConv2d` computes `torch.nn.functional.conv2d` (to float
tolerance); its parameters are the `Conv2d`'s own objects, so an optimizer built earlier still steps
them and state dicts load either way; the rate is plain module state, changed by whoever owns when
(the trainer, at a step boundary, the same on every worker). How: docs/design/step.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


def _check_rate(rate: float) -> float:
    if not 0.0 <= rate < 1.0:
        raise ValueError(
            f"compression rate must be in [0, 1) (the fraction of the spectrum dropped), got {rate}"
        )
    return float(rate)


def kept_frequencies(height: int, columns: int, rate: float) -> tuple[int, int, int]:
    """(non-negative rows, negative rows, columns) kept of an `rfft2` spectrum with `height` rows
    (frequencies 0, 1, ..., -2, -1) and `columns` (0 .. width // 2): the lowest frequencies, a
    rectangle scaled by sqrt(1 - rate) on each axis so that about `1 - rate` of the coefficients
    stay, rows symmetric around 0. Every coefficient at rate 0; at least the DC term."""
    scale = math.sqrt(1.0 - _check_rate(rate))
    kept_columns = max(1, min(columns, round(columns * scale)))
    if scale == 1.0:
        return height - height // 2, height // 2, kept_columns
    half = min((height - 1) // 2, max(0, round((height * scale - 1) / 2)))  # rows 0..half and -half..-1
    return half + 1, half, kept_columns


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a layer's transform: `length` input samples after `offset` zeros of
    padding in a transform of `size`, the `frequencies` kept, `taps` kernel taps `dilation` apart,
    and the outputs wanted (0, stride, 2 stride, ... below `outputs`)."""

    length: int
    offset: int
    size: int
    frequencies: tuple[int, ...]
    taps: int
    dilation: int
    outputs: int
    stride: int

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        f = torch.tensor(self.frequencies, dtype=torch.float64)
        return 2 * math.pi * torch.outer(positions, f) / self.size  # positions x kept

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(re, im) of the input's transform, e^(-i angle): samples x kept."""
        angles = self._angles(torch.arange(self.length, dtype=torch.float64) + self.offset)
        return torch.cos(angles), -torch.sin(angles)

    def kernel(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(re, im) of the kernel's transform: taps x kept."""
        angles = self._angles(torch.arange(self.taps, dtype=torch.float64) * self.dilation)
        return torch.cos(angles), -torch.sin(angles)

    def inverse(self, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(re, im) of the inverse transform to the wanted outputs, e^(+i angle) / size: kept x
        outputs. `half`: the rfft axis, whose columns other than 0 and Nyquist stand for their
        conjugates too and so count twice."""
        angles = self._angles(torch.arange(0, self.outputs, self.stride, dtype=torch.float64)).T
        scale = torch.ones(len(self.frequencies), 1, dtype=torch.float64) / self.size
        if half:
            f = torch.tensor(self.frequencies)
            scale[(f != 0) & (2 * f != self.size)] *= 2
        return torch.cos(angles) * scale, torch.sin(angles) * scale


def _axis(length: int, before: int, after: int, taps: int, dilation: int, stride: int) -> _Axis:
    size = length + before + after
    span = (taps - 1) * dilation + 1
    if size < span:
        raise ValueError(f"a padded input of {size} is smaller than the kernel's span {span}")
    return _Axis(length, before, size, (), taps, dilation, size - span + 1, stride)


def _side_by_side(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    """A right-hand complex matrix acting on real rows: x @ [re | im] (planar output)."""
    return torch.cat((re, im), dim=1)


def _left_complex(matrix: tuple[torch.Tensor, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """(re + i im) @ z for a planar z (..., rows, [re | im]), planar out: four real products."""
    re, im = matrix
    z_re, z_im = z.chunk(2, dim=-1)
    # In place on fresh products (their backward does not need them): one temporary fewer.
    return torch.cat(((re @ z_re).sub_(im @ z_im), (re @ z_im).add_(im @ z_re)), dim=-1)


def _correlate(signal: torch.Tensor, taps: torch.Tensor, groups: int) -> torch.Tensor:
    """Per frequency, the sum over a group's channels of planar `signal` (n, c, rows, 2 columns)
    times the conjugate of planar `taps` (o, c / groups, rows, 2 columns): (a + ib)(p - iq) =
    (ap + bq) + i(bp - aq). Planar (n, o, rows, 2 columns) out. Both operands are copied once into
    a frequency-major layout; the products save those copies (the kept spectra) and nothing else."""
    n, channels, rows, width = signal.shape
    outputs, columns = taps.shape[0], width // 2
    frequencies = groups * rows * columns
    x = signal.reshape(n, groups, channels // groups, rows, 2, columns)
    a, b = x.permute(4, 1, 3, 5, 0, 2).reshape(2, frequencies, n, -1)  # (g rows columns, n, c/g)
    k = taps.reshape(groups, outputs // groups, channels // groups, rows, 2, columns)
    p, q = k.permute(4, 0, 3, 5, 2, 1).reshape(2, frequencies, channels // groups, -1)  # (.., c/g, o/g)
    out = torch.stack((a @ p + b @ q, b @ p - a @ q))  # 2, g rows columns, n, o/g
    out = out.reshape(2, groups, rows, columns, n, -1).permute(4, 1, 5, 2, 0, 3)  # n, g, o/g, rows, 2, cols
    return out.reshape(n, -1, rows, width)


@dataclass(frozen=True)
class _Plan:
    """A layer's transforms for one input shape and rate (see `_Axis`), in the working dtype."""

    col_forward: torch.Tensor  # width x 2 kept columns
    row_forward: tuple[torch.Tensor, torch.Tensor]  # kept rows x height
    col_kernel: torch.Tensor  # kernel width x 2 kept columns
    row_kernel: tuple[torch.Tensor, torch.Tensor]  # kept rows x kernel height
    row_inverse: tuple[torch.Tensor, torch.Tensor]  # output rows x kept rows
    col_inverse: torch.Tensor  # 2 kept columns x output columns: the real part of the product

    @classmethod
    def of(cls, rows: _Axis, columns: _Axis, dtype: torch.dtype, device: torch.device) -> _Plan:
        def cast(*matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            re, im = (m.to(dtype=dtype, device=device).contiguous() for m in matrices)
            return re, im

        row_inverse_re, row_inverse_im = rows.inverse(half=False)
        col_inverse_re, col_inverse_im = columns.inverse(half=True)
        return cls(
            col_forward=_side_by_side(*cast(*columns.forward())),
            row_forward=cast(*(m.T for m in rows.forward())),
            col_kernel=_side_by_side(*cast(*columns.kernel())),
            row_kernel=cast(*(m.T for m in rows.kernel())),
            row_inverse=cast(row_inverse_re.T, row_inverse_im.T),
            col_inverse=torch.cat(cast(col_inverse_re, -col_inverse_im), dim=0),
        )


def _plan(rows: _Axis, columns: _Axis, rate: float, x: torch.Tensor) -> _Plan:
    """The transforms for `rate`: the lowest rows (both signs) and columns of the spectrum."""
    positive, negative, kept_columns = kept_frequencies(rows.size, columns.size // 2 + 1, rate)
    rows = replace(rows, frequencies=(*range(positive), *range(rows.size - negative, rows.size)))
    columns = replace(columns, frequencies=tuple(range(kept_columns)))
    return _Plan.of(rows, columns, x.dtype, x.device)


class BandLimitedConv2d(nn.Conv2d):
    """A `Conv2d` computed through truncated Fourier transforms, keeping the lowest
    `1 - compression_rate` of the spectrum (see the module docstring). Same constructor, parameters
    and state dict as `Conv2d`; `from_conv` converts one and keeps its parameter objects."""

    def __init__(self, *args: object, compression_rate: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.compression_rate = _check_rate(compression_rate)
        self._plans: dict[tuple[object, ...], _Plan] = {}

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, compression_rate: float = 0.0) -> BandLimitedConv2d:
        band = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device=conv.weight.device,
            dtype=conv.weight.dtype,
            compression_rate=compression_rate,
        )
        band.weight = conv.weight
        band.bias = conv.bias
        band.train(conv.training)
        return band

    def extra_repr(self) -> str:
        conv = super().extra_repr()  # type: ignore[no-untyped-call]
        return f"{conv}, compression_rate={self.compression_rate}"

    def _plan_for(self, x: torch.Tensor, padding: list[int]) -> _Plan:
        """The transforms for `x`'s shape at the current rate, made once and kept beside the module
        (not in its state dict); a rate change drops the others."""
        height, width = x.shape[-2:]
        key = (height, width, tuple(padding), self.compression_rate, x.dtype, x.device)
        if key not in self._plans:
            if any(k[3] != self.compression_rate for k in self._plans):
                self._plans.clear()
            left, right, top, bottom = padding
            (kh, kw), (dh, dw), (sh, sw) = self.kernel_size, self.dilation, self.stride
            rows = _axis(height, top, bottom, kh, dh, sh)
            columns = _axis(width, left, right, kw, dw, sw)
            self._plans[key] = _plan(rows, columns, self.compression_rate, x)
        return self._plans[key]

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):  # the transforms run in fp32
            x, weight = x.float(), weight.float()
        padding = list(self._reversed_padding_repeated_twice)
        if self.padding_mode != "zeros":  # zero padding is folded into the transforms; others are not
            x, padding = F.pad(x, padding, mode=self.padding_mode), [0, 0, 0, 0]
        plan = self._plan_for(x, padding)
        # The input's and the kernel's kept spectra, planar: columns (real in), then rows.
        signal = _left_complex(plan.row_forward, x @ plan.col_forward)  # n, c, rows, 2 columns
        taps = _left_complex(plan.row_kernel, weight @ plan.col_kernel)  # o, c/g, rows, 2 columns
        # Their cross-correlation, then back to the wanted (valid, strided) outputs: rows, then the
        # columns' real part. No intermediate outlives its use.
        y = _left_complex(plan.row_inverse, _correlate(signal, taps, self.groups)) @ plan.col_inverse
        if bias is not None:
            y = y + bias.view(1, -1, 1, 1)
        return y.to(dtype)


def band_limit(model: nn.Module, compression_rate: float = 0.0) -> int:
    """Replace every `Conv2d` in `model` (in place, nested ones too) by a `BandLimitedConv2d` with the
    same parameter objects at `compression_rate`; returns how many were converted. Layers already
    band-limited are left as they are (run twice, convert once)."""
    _check_rate(compression_rate)
    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Conv2d:
                setattr(parent, name, BandLimitedConv2d.from_conv(child, compression_rate))
                converted += 1
    return converted


def set_compression_rate(model: nn.Module, compression_rate: float) -> int:
    """Set the rate of every band-limited layer of `model`; returns how many there are."""
    rate = _check_rate(compression_rate)
    layers = [m for m in model.modules() if isinstance(m, BandLimitedConv2d)]
    for layer in layers:
        layer.compression_rate = rate
    return len(layers)
