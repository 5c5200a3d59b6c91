"""Memory elasticity (``spec.bandLimit``): the band-limited convolutions' compression rate follows the
GPU memory each worker may use, as the operator computes it.

Rank 0 reads the budget file (the kubelet's projection of the pod's annotation), measures once on a
copy of the model what a worker holds and what one virtual node adds at each rate, and asks for the
smallest rate whose footprint fits; the request rides in the step's all-reduce.

Invariants: only a job with ``spec.bandLimit`` is band-limited; the rates are ``RATES`` up to
``maxCompressionRate`` on every worker; every worker switches after the same step (no step lost);
the measurement and the rate in use are part of the training state, so a new world continues at it
and never measures again. Details: docs/design/step.md.
"""

from __future__ import annotations

import copy
import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ebbflow_trainer.api import TrainingSpec
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.data import to_device
from ebbflow_trainer.projected import ProjectedFile
from ebbflow_trainer.step.bandlimit import set_compression_rate

log = logging.getLogger("ebbflow_trainer.step.memory_budget")

RATES = (0.0, 0.25, 0.5, 0.75)
MIB = 1 << 20
IGNORED_LOG = "ignoring the memory budget %r in %s: not a whole number of MiB"
TOO_SMALL_LOG = (
    "no compression rate fits the memory budget of %s MiB (%s MiB needed at rate %s): using that rate"
)


def allowed_rates(max_rate: float) -> tuple[float, ...]:
    """The rates a job may use: ``RATES`` up to its ``maxCompressionRate``."""
    return tuple(rate for rate in RATES if rate <= max_rate)


@dataclass(frozen=True)
class Footprint:
    """A worker's memory: ``resident`` bytes held between steps, plus ``peaks[rate]`` at most while one
    virtual node's forward and backward run at that rate."""

    resident: int
    peaks: dict[float, int]

    def needs(self, rate: float) -> int:
        return self.resident + self.peaks[rate]

    def to_state(self) -> dict[str, object]:
        return {"resident": self.resident, "peaks": [[rate, peak] for rate, peak in self.peaks.items()]}

    @classmethod
    def from_state(cls, saved: dict[str, object]) -> Footprint:
        peaks = saved["peaks"]
        assert isinstance(peaks, list)
        return cls(int(saved["resident"]), {float(rate): int(peak) for rate, peak in peaks})  # type: ignore[call-overload]


def smallest_fitting_rate(
    footprint: Footprint, budget_bytes: int, rates: Sequence[float]
) -> tuple[float, bool]:
    """The smallest of ``rates`` whose footprint fits ``budget_bytes``, and whether one did (else the
    largest: dropping the most spectrum is the best the trainer can do)."""
    for rate in sorted(rates):
        if footprint.needs(rate) <= budget_bytes:
            return rate, True
    return max(rates), False


def encode_rate(rate: float | None, rates: Sequence[float]) -> int:
    """The message value asking for ``rate`` (0: nothing)."""
    return 0 if rate is None else rates.index(rate) + 1


def decode_rate(value: float, rates: Sequence[float]) -> float | None:
    """The rate a reduced message value asks for (None: nothing)."""
    code = round(value)
    return rates[code - 1] if 0 < code <= len(rates) else None


# --- measuring --------------------------------------------------------------------------------------
def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters (and a gradient the size of each trainable one), buffers and optimizer state."""
    total = sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1) for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    for values in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))
    return total


def cpu_peak_bytes(run: Callable[[], object]) -> int:
    """The most CPU memory ``run`` held at once beyond what it started with, from the profiler's record
    of every allocation (positive) and free (negative)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    cpu = torch.autograd.DeviceType.CPU  # type: ignore[attr-defined]
    events = [
        e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == cpu
    ]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """The most memory ``run`` allocates at once on ``device`` beyond what was allocated before."""
    if device.type != "cuda":
        return cpu_peak_bytes(run)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


@contextmanager
def _random_state_kept(device: torch.device) -> Iterator[None]:
    """Every generator the training draws from is as it was afterwards (the measurement must not
    shift a single random number of the run)."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    random.setstate(python)
    np.random.set_state(numpy)


def measure(
    spec: TrainingSpec,
    samples: int,
    rates: Sequence[float],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[object]],
) -> Footprint:
    """The footprint of a worker computing virtual nodes of ``samples`` samples at each rate, measured
    on a copy of the model (each rate twice: the second run, after the rate's transforms exist)."""
    with _random_state_kept(device):
        probe = copy.deepcopy(spec.model).train()
        indices = torch.arange(min(samples, len(spec.dataset)))
        batch = to_device(spec.batch(indices), device)

        def forward_backward() -> None:
            probe.zero_grad(set_to_none=True)
            with autocast():
                loss = spec.loss_fn(probe, batch)
            loss.backward()  # type: ignore[no-untyped-call]

        peaks = {}
        for rate in rates:
            set_compression_rate(probe, rate)
            forward_backward()
            probe.zero_grad(set_to_none=True)
            peaks[rate] = peak_bytes(forward_backward, device)
    return Footprint(resident_bytes(spec.model, spec.optimizer), peaks)


# --- rank 0's requests ----------------------------------------------------------------------------------
def budget_mib(text: str) -> int | None:
    """The budget a file's content names (a positive whole number of MiB), None for none or garbage."""
    value = text.strip()
    return int(value) if re.fullmatch("[0-9]+", value) and int(value) > 0 else None


class RateRequests:
    """Rank 0's choice of compression rate: reads the budget file, measures the footprint the first
    time a budget arrives (``measure_footprint``; skipped when the state already holds one) and keeps
    asking for the rate that fits the last budget read."""

    def __init__(
        self,
        config: TrainerConfig,
        rates: Sequence[float],
        footprint: Callable[[], Footprint],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.file = ProjectedFile(config.memory_budget_file, log, "the memory budget", clock)
        self.rates = tuple(rates)
        self.footprint = footprint
        self._rate: float | None = None

    def poll(self) -> int:
        """The message value to send with this step (0: no request)."""
        text = self.file.changed()
        if text is not None:
            budget = budget_mib(text)
            if budget is None and text.strip():
                log.warning(IGNORED_LOG, text.strip()[:40], self.file.path)
            if budget is not None:
                footprint = self.footprint()
                self._rate, fits = smallest_fitting_rate(footprint, budget * MIB, self.rates)
                if not fits:
                    needed = -(-footprint.needs(self._rate) // MIB)
                    log.warning(TOO_SMALL_LOG, budget, needed, self._rate)
        return encode_rate(self._rate, self.rates)
