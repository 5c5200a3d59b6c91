"""Band-limited convolutions: exact at rate 0, what the rate drops, what it saves, and the conversion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ebbflow_devtools.testing.simulated_world import step_world
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.step.bandlimit import (
    BandLimitedConv2d,
    band_limit,
    kept_frequencies,
    set_compression_rate,
)
from ebbflow_trainer.step.engine import Requests, VirtualNodeEngine
from ebbflow_trainer.step.memory_budget import decode_rate, encode_rate
from torch import nn

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]

# Every Conv2d setting the layer must honour, each against F.conv2d itself.
CONVS = [
    pytest.param({}, id="plain"),
    pytest.param({"padding": 1}, id="padding"),
    pytest.param({"stride": 2, "padding": 1}, id="stride"),
    pytest.param({"stride": (1, 2), "bias": False}, id="uneven-stride-no-bias"),
    pytest.param({"dilation": 2, "padding": 2}, id="dilation"),
    pytest.param({"groups": 2}, id="groups"),
    pytest.param({"padding": "same"}, id="same"),
    pytest.param({"padding": (2, 0)}, id="uneven-padding"),
    pytest.param({"padding": 1, "padding_mode": "reflect"}, id="reflect"),
    pytest.param({"padding": 1, "padding_mode": "circular"}, id="circular"),
]


def _grads(layer: nn.Conv2d, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    y = layer(x)
    probe = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).view_as(y)
    params = [p for p in (layer.weight, layer.bias) if p is not None]
    return y, list(torch.autograd.grad((y * probe).sum(), [x, *params]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("settings", CONVS)
def test_rate_zero_is_conv2d_forward_and_backward(settings: dict[str, Any], device: str) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, **settings).double().to(device)
    x = torch.randn(2, 4, 11, 9, dtype=torch.float64, device=device, requires_grad=True)
    expected, expected_grads = _grads(conv, x)
    got, got_grads = _grads(BandLimitedConv2d.from_conv(conv), x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for g, e in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-11)


def test_rate_zero_in_float32_is_within_float_tolerance() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 8, 5, padding=2)
    x = torch.randn(4, 16, 28, 28)
    torch.testing.assert_close(BandLimitedConv2d.from_conv(conv)(x), conv(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_inputs_run_in_float32_and_come_back_in_their_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    band = BandLimitedConv2d.from_conv(conv).to(dtype)
    y = band(x.to(dtype))
    assert y.dtype == dtype
    torch.testing.assert_close(
        y.float(),
        F.conv2d(x.to(dtype).float(), conv.weight.to(dtype).float(), conv.bias.to(dtype).float(), padding=1),
        rtol=0.02,
        atol=0.02,
    )


@pytest.mark.parametrize(
    ("height", "columns", "rate", "expected"),
    [
        pytest.param(12, 7, 0.0, (6, 6, 7), id="rate-0-even-all"),
        pytest.param(11, 6, 0.0, (6, 5, 6), id="rate-0-odd-all"),
        pytest.param(12, 7, 0.5, (5, 4, 5), id="half"),
        pytest.param(11, 6, 0.75, (3, 2, 3), id="quarter"),
        pytest.param(8, 5, 0.99, (1, 0, 1), id="dc-at-least"),
    ],
)
def test_kept_frequencies(height: int, columns: int, rate: float, expected: tuple[int, int, int]) -> None:
    assert kept_frequencies(height, columns, rate) == expected


def test_kept_fraction_follows_the_rate_and_rows_stay_symmetric() -> None:
    for rate in (0.25, 0.5, 0.75):
        positive, negative, columns = kept_frequencies(64, 33, rate)
        assert positive == negative + 1, "rows 0..k and -k..-1"
        assert (positive + negative) * columns / (64 * 33) == pytest.approx(1 - rate, abs=0.05)


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_a_rate_outside_zero_one_is_refused_naming_it(rate: float) -> None:
    with pytest.raises(ValueError, match=r"compression rate must be in \[0, 1\)"):
        BandLimitedConv2d(1, 1, 3, compression_rate=rate)
    with pytest.raises(ValueError, match="compression rate"):
        set_compression_rate(nn.Sequential(nn.Conv2d(1, 1, 3)), rate)


def test_a_constant_image_passes_any_rate_unchanged() -> None:
    """A constant has only its DC coefficient, which every rate keeps: the valid output is exact."""
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3).double()
    x = torch.full((1, 2, 12, 12), 0.7, dtype=torch.float64)
    band = BandLimitedConv2d.from_conv(conv, compression_rate=0.9)
    torch.testing.assert_close(band(x), conv(x), rtol=0, atol=1e-12)


@torch.no_grad()
def test_the_error_grows_with_the_rate_and_high_frequencies_go_first() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    x = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    exact = conv(x)
    band = BandLimitedConv2d.from_conv(conv)
    errors = []
    for rate in (0.0, 0.25, 0.5, 0.75):
        set_compression_rate(band, rate)
        errors.append(float((band(x) - exact).norm() / exact.norm()))
    assert errors[0] < 1e-12 and errors == sorted(errors), errors
    smooth = torch.linspace(0, 1, 24, dtype=torch.float64)
    ramp = (smooth[:, None] * smooth[None, :]).expand(2, 3, 24, 24).contiguous()  # low frequencies
    set_compression_rate(band, 0.5)
    ramp_error = float((band(ramp) - conv(ramp)).norm() / conv(ramp).norm())
    assert ramp_error < errors[2] / 2, "a smooth image loses less than noise at the same rate"


def _saved_bytes(layer: nn.Module, x: torch.Tensor) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(storages.values())


def test_backward_keeps_only_the_truncated_spectra() -> None:
    """What autograd saves for backward shrinks with the rate (about 1 - rate of the spectrum),
    so the backward's products run on the truncated spectra too."""
    conv = nn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(8, 16, 32, 32, requires_grad=True)
    band = BandLimitedConv2d.from_conv(conv)
    saved = {}
    for rate in (0.0, 0.5, 0.75):
        set_compression_rate(band, rate)
        saved[rate] = _saved_bytes(band, x)
    assert saved[0.5] < 0.6 * saved[0.0] and saved[0.75] < 0.35 * saved[0.0], saved
    set_compression_rate(band, 0.5)
    band(x).sum().backward()
    assert x.grad is not None and band.weight.grad is not None and torch.isfinite(band.weight.grad).all()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Conv1d(4, 4, 1))
        self.head = nn.Linear(4, 2)


def test_band_limit_swaps_every_conv2d_keeping_its_parameters_and_state_dict() -> None:
    torch.manual_seed(0)
    net = _Net()
    weights = [net.stem.weight, net.body[1].weight]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert band_limit(net, 0.25) == 2
    assert isinstance(net.stem, BandLimitedConv2d) and isinstance(net.body[1], BandLimitedConv2d)
    assert type(net.body[2]) is nn.Conv1d, "only 2-D convolutions"
    assert net.stem.compression_rate == 0.25
    assert [net.stem.weight, net.body[1].weight] == weights, "the same Parameter objects"
    assert net.state_dict().keys() == before.keys()
    nn.Conv2d(1, 4, 3, padding=1).load_state_dict(
        {"weight": before["stem.weight"], "bias": before["stem.bias"]}
    )
    x = torch.randn(2, 1, 6, 6)
    net.body[1](net.stem(x)).sum().backward()
    optimizer.step()
    assert not torch.equal(net.stem.weight, before["stem.weight"]), "the old optimizer steps the layer"
    assert band_limit(net, 0.5) == 0, "run twice, converted once"
    assert set_compression_rate(net, 0.5) == 2 and net.body[1].compression_rate == 0.5


def test_the_rate_change_drops_cached_transforms() -> None:
    band = BandLimitedConv2d(1, 1, 3)
    x = torch.randn(1, 1, 8, 8)
    band(x)
    band(torch.randn(1, 1, 10, 10))
    assert len(band._plans) == 2
    set_compression_rate(band, 0.5)
    band(x)
    assert len(band._plans) == 1
    assert "compression_rate=0.5" in repr(band)


# --- in the trainer: deterministic mode across world sizes, and a rate switch between steps -------

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "digits_cnn" / "train.py"
V = 4


def _workers(world_size: int) -> list[VirtualNodeEngine]:
    workers = []
    for _ in range(world_size):
        torch.manual_seed(0)
        spec = load_spec(str(EXAMPLE))
        config = trainer_config(
            max_replicas=V, virtual_nodes=V, global_batch_size=32, mode="deterministic", band_limit=True
        )
        workers.append(VirtualNodeEngine(spec, config))
    return workers


def test_deterministic_mode_is_bitwise_the_same_for_any_world_size_through_a_rate_switch() -> None:
    """spec.bandLimit: the engines start at rate 0; rank 0 asks for 0.75 in step 1's message and every
    worker switches after it, as the trainer does: every step is applied (none lost or skipped), and
    the parameters are bitwise those of one worker holding every virtual node (three workers hold the
    four unevenly)."""
    finals = []
    for world_size in (1, 3):
        workers = _workers(world_size)
        assert {w.compression_rate for w in workers} == {0.0}
        for step in range(3):
            code = encode_rate(0.75, workers[0].rates) if step == 1 else 0
            requests = [Requests(rate=code if rank == 0 else 0) for rank in range(world_size)]
            results = step_world(workers, step, requests=requests)
            assert not any(r.skipped for r in results)
            for worker, result in zip(workers, results, strict=True):
                rate = decode_rate(result.requests.rate, worker.rates)
                if rate is not None:
                    worker.switch_rate(rate)
            layers = [m for w in workers for m in w.spec.model.modules() if isinstance(m, BandLimitedConv2d)]
            assert {layer.compression_rate for layer in layers} == {0.75 if step >= 1 else 0.0}
        finals.append([t.detach().clone() for t in workers[0].spec.model.state_dict().values()])
        for worker in workers:
            worker.close()
    for other in finals[1:]:
        assert all(torch.equal(a, b) for a, b in zip(other, finals[0], strict=True))
