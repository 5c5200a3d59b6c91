"""Band-limited convolutions on the digits CNN (examples/digits_cnn): what each compression rate costs
and saves.

    .venv/bin/python bench/bandlimited.py [--rates 0,0.25,0.5,0.75] [--steps 200] [--batch 128]
                                          [--plot docs/bandlimited.png]

For each rate, in one process and one run (ratios against rate 0 and against `nn.Conv2d`):
- peak memory of one training step (forward, backward, optimizer step) at --batch: on CUDA
  `torch.cuda.max_memory_allocated` when a GPU is there, else the CPU allocator's own accounting
  as the profiler records it (every allocation and free, summed in time order);
- step time: the median of --timing-steps steps after two warm-ups, one intra-op thread;
- held-out accuracy after --steps steps of --batch (same seed, same samples for every rate);
- that model's accuracy on held-out images with high-frequency noise added (Gaussian noise keeping
  only frequencies of 0.25 cycles per pixel or more on some axis, the upper half of the band, scaled
  to an RMS of each amplitude; the images are standardised, so amplitude 1 is as strong as the signal).
Writes bench/results/bandlimited.json and the plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from ebbflow_trainer.api import TrainingSpec, import_script
from ebbflow_trainer.step.memory_budget import peak_bytes
from torch import nn

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits_cnn" / "train.py"
NOISE_AMPLITUDES = (0.0, 0.5, 1.0, 2.0, 4.0)
NOISE_CUTOFF = 0.25  # cycles per pixel: the noise keeps only the upper half of the band (Nyquist 0.5)


def _step(spec: TrainingSpec, batch: list[torch.Tensor]) -> None:
    spec.optimizer.zero_grad()
    spec.loss_fn(spec.model, batch).backward()
    spec.optimizer.step()


def peak_step_bytes(spec: TrainingSpec, batch: list[torch.Tensor], device: torch.device) -> int:
    _step(spec, batch)  # optimizer state and cached transforms exist before the measured step
    return peak_bytes(lambda: _step(spec, batch), device)


def step_seconds(spec: TrainingSpec, batch: list[torch.Tensor], device: torch.device, steps: int) -> float:
    times = []
    for i in range(steps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        _step(spec, batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def high_frequency_noise(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """Gaussian noise keeping only frequencies at or above NOISE_CUTOFF on some axis, at unit RMS
    per image."""
    noise = torch.randn(shape, generator=generator)
    spectrum = torch.fft.fft2(noise)
    fy = torch.fft.fftfreq(shape[-2]).abs()[:, None]
    fx = torch.fft.fftfreq(shape[-1]).abs()[None, :]
    spectrum[..., (fy < NOISE_CUTOFF) & (fx < NOISE_CUTOFF)] = 0
    high = torch.fft.ifft2(spectrum).real
    return high / high.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()


def train(example: ModuleType, rate: float, steps: int, batch: int, device: torch.device) -> TrainingSpec:
    torch.manual_seed(0)
    spec = example.make(rate)
    spec.model.to(device)
    samples = torch.Generator().manual_seed(0)
    for _ in range(steps):
        indices = torch.randint(0, len(spec.dataset), (batch,), generator=samples)
        _step(spec, [t.to(device) for t in spec.batch(indices)])
    return spec


@torch.no_grad()
def noisy_accuracy(example: ModuleType, net: nn.Module, device: torch.device) -> dict[str, float]:
    images, labels = example.images_and_labels()
    held_out = example.held_out_mask(len(labels))
    images, labels = images[held_out], labels[held_out]
    noise = high_frequency_noise(images.shape, torch.Generator().manual_seed(1))
    net.eval()
    return {
        str(a): example.accuracy(net, (images + a * noise).to(device), labels.to(device))
        for a in NOISE_AMPLITUDES
    }


def measure(
    example: ModuleType, rate: float | None, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """One row: `rate` None is plain `nn.Conv2d` (memory and time only: its maths is rate 0's)."""
    torch.manual_seed(0)
    spec = example.make(rate)
    spec.model.to(device)
    indices = torch.arange(args.batch)
    batch = [t.to(device) for t in spec.batch(indices)]
    row: dict[str, Any] = {
        "rate": rate,
        "peak_step_mib": peak_step_bytes(spec, batch, device) / 2**20,
        "step_s": step_seconds(spec, batch, device, args.timing_steps),
    }
    if rate is not None:
        trained = train(example, rate, args.steps, args.batch, device)
        row["noisy_accuracy"] = noisy_accuracy(example, trained.model, device)
        row["accuracy"] = row["noisy_accuracy"]["0.0"]
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [r for r in rows if r["rate"] is not None]
    rates = [r["rate"] for r in rated]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, key, label in (
        (axes[0], "peak_step_mib", "peak memory of a step (MiB)"),
        (axes[1], "step_s", "step time (s)"),
        (axes[2], "accuracy", "held-out accuracy"),
    ):
        ax.plot(rates, [r[key] for r in rated], "o-", label="band-limited")
        ax.set_xlabel("compression rate")
        ax.set_title(label)
    conv = next((r for r in rows if r["rate"] is None), None)
    if conv:
        for ax, key in ((axes[0], "peak_step_mib"), (axes[1], "step_s")):
            ax.axhline(conv[key], color="grey", linestyle="--", label="nn.Conv2d")
            ax.legend()
    for r in rated:
        amplitudes = [float(a) for a in r["noisy_accuracy"]]
        axes[3].plot(amplitudes, list(r["noisy_accuracy"].values()), "o-", label=f"rate {r['rate']}")
    for ax in axes[2:]:
        ax.set_ylim(0.85, 1.0)  # accuracy: a tight automatic range makes a third of a point look large
    axes[3].set_xlabel("high-frequency noise (RMS, standardised images)")
    axes[3].set_title("held-out accuracy with noise")
    axes[3].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0,0.25,0.5,0.75")
    p.add_argument("--steps", type=int, default=200, help="training steps per rate")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--timing-steps", type=int, default=5)
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "bandlimited.png")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    example = import_script(str(EXAMPLE))
    print(f"device {device}; load average before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    rows = [measure(example, None, args, device)]
    for rate in (float(r) for r in args.rates.split(",")):
        rows.append(measure(example, rate, args, device))
        print(json.dumps(rows[-1]), flush=True)
    base = next(r for r in rows if r["rate"] == 0.0)
    print("| layers | rate | peak step MiB (vs rate 0) | step s (vs rate 0) | accuracy | with noise 2.0 |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        name = "nn.Conv2d" if r["rate"] is None else "band-limited"
        noisy = r.get("noisy_accuracy", {}).get("2.0")
        print(
            f"| {name} | {r['rate'] if r['rate'] is not None else '-'} "
            f"| {r['peak_step_mib']:.1f} ({r['peak_step_mib'] / base['peak_step_mib']:.2f}x) "
            f"| {r['step_s']:.3f} ({r['step_s'] / base['step_s']:.2f}x) "
            f"| {r.get('accuracy', float('nan')):.3f} | {noisy if noisy is None else round(noisy, 3)} |"
        )
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    out = REPO / "bench" / "results" / "bandlimited.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "device": str(device), "rows": rows},
            indent=2,
        )
    )
    plot(rows, args.plot)


if __name__ == "__main__":
    main()
