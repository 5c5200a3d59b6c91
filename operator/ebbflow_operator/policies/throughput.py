"""Pollux's throughput and goodput model for one job. Pure: parameters and measurements in, seconds out.

One optimiser step of a data-parallel job on K workers (Pollux, OSDI'21, eq. 8):

    T_iter(K, m, s) = s * T_acc + (T_acc^gamma + T_net^gamma)^(1/gamma)

with compute T_acc(m) = alpha_c + beta_c * m per micro-batch and sync T_net by placement class. The
global batch B is split into V virtual nodes: m = B/V and s = ceil(V/K) - 1 (`step_shape`).
Time-slicing (`slowdown`), contention between a node's busy devices, a per-step overhead and GPU
types scale the compute; goodput is throughput x statistical efficiency (phi + M0) / (phi + M).

Invariants: every fitted value is >= 0, so predictions are positive and T_iter never falls when K or
m grows past the sync's start; classes without measurements keep the prior's line. The terms and the
fit, in full: docs/design/throughput-model.md.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache, partial
from typing import Final

from .search import golden_min, grid_then_golden

GAMMA_MIN = 1.0
GAMMA_MAX = 10.0
TIME_SLICE_OVERHEAD = 0.1  # a time-sliced device does 10% less work than its share (context switches)
# A job keeps the batch it runs at unless another candidate promises this much more goodput.
BATCH_SWITCH_GAIN = 0.05
CONTENTION_MAX = 1.0  # the most one more busy device on a node may slow compute (fit's search range)


class Placement:
    """Where a job's workers run: how many, on how many nodes, the time-slicing share (>= 1), and
    the relative compute speed of the slowest GPU type among the job's nodes. A value: compared and
    hashed by its fields, never changed (`Final`; read-only once compiled). Written out rather than
    a frozen dataclass: a policy pass builds thousands, and in the simulator's native build
    (`make sim-native`) a dataclass's generated `__init__` stays interpreted Python, about 20 times
    the cost of this one compiled."""

    def __init__(self, workers: int, nodes: int = 1, share: float = 1.0, speed: float = 1.0) -> None:
        self.workers: Final = workers
        self.nodes: Final = nodes
        self.share: Final = share
        self.speed: Final = speed

    def with_speed(self, speed: float) -> Placement:
        return Placement(self.workers, self.nodes, self.share, speed)

    def _fields(self) -> tuple[int, int, float, float]:
        return self.workers, self.nodes, self.share, self.speed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Placement) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Placement(workers={self.workers}, nodes={self.nodes}, share={self.share}, speed={self.speed})"
        )


@dataclass(frozen=True)
class Measurement:
    """One report from the trainers: step and micro-batch compute seconds at a known shape."""

    workers: int
    micro_batch: float  # samples per micro-batch (m)
    step_s: float  # seconds per optimiser step
    compute_s: float  # seconds of forward+backward for one micro-batch (as measured, slowed by share)
    nodes: int = 1
    accum_steps: int = 0  # s: micro-batches accumulated before the synchronising one
    share: float = 1.0  # time-slicing share the workers ran under
    gpu_type: str = ""  # the GPU product the workers ran on ("" unknown or mixed)
    speed: float = 1.0  # that type's relative compute speed (set when the speeds are known)
    virtual_nodes: int = 0  # V of the job (0 unknown: the workers' split is taken to be even)

    # Cached: a fit reads both for every measurement at every point of its searches.
    @cached_property
    def placement(self) -> Placement:
        return Placement(self.workers, self.nodes, self.share, self.speed)

    @cached_property
    def tail(self) -> float:
        """The fraction of workers as busy as the slowest (`slowdown`'s tail)."""
        return busiest_fraction(self.virtual_nodes, self.workers)


@dataclass(frozen=True)
class ThroughputParams:
    """Parameters of T_iter; every value >= 0 and 1 <= gamma <= 10."""

    alpha_c: float
    beta_c: float
    alpha_local: float
    beta_local: float
    alpha_net: float
    beta_net: float
    gamma: float
    contention: float = 0.0  # compute slowdown per extra busy device on a node
    overhead: float = 0.0  # seconds per step outside compute and sync

    @classmethod
    def prior(cls) -> ThroughputParams:
        """Before any measurement: 1 ms/sample compute plus 5 ms launch overhead; sync of 5 ms within a
        node and 20 ms across nodes (about half a 32-sample micro-batch), growing slowly with K,
        partly overlapped (gamma 2). A new job scales well but not perfectly, so it neither hoards
        GPUs nor starves until its trainers report."""
        return cls(0.005, 0.001, 0.005, 0.0005, 0.02, 0.001, 2.0)

    def compute_s(self, micro_batch: float) -> float:
        return self.alpha_c + self.beta_c * micro_batch

    def sync_s(self, placement: Placement) -> float:
        if placement.workers <= 1:
            return 0.0
        if placement.nodes <= 1:
            return self.alpha_local + self.beta_local * (placement.workers - 2)
        return self.alpha_net + self.beta_net * (placement.workers - 2)

    def slowed_compute_s(
        self, placement: Placement, micro_batch: float, accum_steps: int, tail: float = 1.0
    ) -> float:
        """The slowest worker's seconds per micro-batch at this placement (time-slicing, contention,
        GPU speed)."""
        shared = slowdown(placement.share, accum_steps + 1, tail)
        crowd = 1.0 + self.contention * (busy_devices(placement) - 1.0)
        return self.compute_s(micro_batch) * shared * crowd / max(placement.speed, 1e-9)

    def step_s(self, placement: Placement, micro_batch: float, accum_steps: int, tail: float = 1.0) -> float:
        """Predicted seconds per optimiser step (T_iter); `tail` as in `slowdown`."""
        compute = self.slowed_compute_s(placement, micro_batch, accum_steps, tail)
        return accum_steps * compute + _overlap(compute, self.sync_s(placement), self.gamma) + self.overhead


def slowdown(share: float, batches: int = 1, tail: float = 1.0) -> float:
    """How much slower the slowest worker's micro-batches run when `share` workers share each
    physical GPU, it has `batches` of them, and a fraction `tail` of its node's workers have as
    many (the others one fewer: once they finish, the rest share the devices among fewer).

    Processor sharing with each worker on one device at most: (batches - 1) micro-batches at the
    full share, then the last at max(1, tail x share), per micro-batch. Even split (tail 1): share.
    """
    if share <= 1.0:
        return 1.0
    sliced = share * (1.0 + TIME_SLICE_OVERHEAD)
    last = max(1.0, min(1.0, max(tail, 0.0)) * sliced)
    return ((max(batches, 1) - 1) * sliced + last) / max(batches, 1)


def busiest_fraction(virtual_nodes: int, workers: int) -> float:
    """The fraction of workers holding the most virtual nodes (ceil(V/K)); 1 when V is unknown."""
    if virtual_nodes <= 0 or workers <= 0:
        return 1.0
    if workers >= virtual_nodes:
        return virtual_nodes / workers  # one each; the rest idle
    extra = virtual_nodes % workers
    return extra / workers if extra else 1.0


def busy_devices(placement: Placement) -> float:
    """Devices computing on the job's busiest node: its workers, or its devices when time-sliced."""
    per_node = math.ceil(max(placement.workers, 1) / max(placement.nodes, 1))
    return per_node / max(placement.share, 1.0)


def _overlap(compute: float, sync: float, gamma: float) -> float:
    if sync <= 0.0:
        return compute
    top = max(compute, sync)
    return float(top * ((compute / top) ** gamma + (sync / top) ** gamma) ** (1.0 / gamma))


def step_shape(global_batch: int, virtual_nodes: int, workers: int) -> tuple[float, int]:
    """(micro-batch m, accumulation steps s) of a worker when B is split into V virtual nodes."""
    v = max(1, virtual_nodes)
    per_worker = math.ceil(v / max(1, workers))
    return global_batch / v, per_worker - 1


def statistical_efficiency(batch: float, tuned_batch: float, noise_scale: float | None) -> float:
    """E(M) = (phi + M0) / (phi + M); 1 without a noise-scale estimate."""
    if noise_scale is None or noise_scale < 0:
        return 1.0
    return (noise_scale + tuned_batch) / (noise_scale + batch)


@dataclass(frozen=True)
class JobModel:
    """A job's goodput as a function of its placement and, when `max_batch` is set, of its global
    batch B (samples of tuned-batch progress per second).

    `global_batch` is B0, the batch the job starts at (the spec's globalBatchSize); with `max_batch`
    set (the spec's maxGlobalBatchSize, Pollux's batch-size co-adaptation) the job may run at any
    multiple of V in [B0, max_batch], and `best_batch` picks the one with the most goodput at a
    placement. Without a noise-scale estimate the efficiency of a larger batch is unknown, so B0 is
    kept; without `max_batch` every method is the fixed-batch model, float for float.
    """

    params: ThroughputParams
    global_batch: int
    virtual_nodes: int
    noise_scale: float | None = None
    tuned_batch: int | None = None
    max_batch: int | None = None

    def step_s(self, placement: Placement, batch: int | None = None) -> float:
        """Seconds per step at batch `batch` (default B0). The share may count other jobs' workers on
        a device, which do not leave it when this job's short workers finish, so the split is taken
        to be even here."""
        global_batch = self.global_batch if batch is None else batch
        micro, accum = step_shape(global_batch, self.virtual_nodes, placement.workers)
        return max(self.params.step_s(placement, micro, accum), 1e-9)  # > 0 even for all-zero params

    def goodput(self, placement: Placement, batch: int | None = None) -> float:
        """throughput x E(B) at batch `batch` (default B0)."""
        if placement.workers <= 0:
            return 0.0
        global_batch = self.global_batch if batch is None else batch
        tuned = self.tuned_batch if self.tuned_batch is not None else self.global_batch
        efficiency = statistical_efficiency(global_batch, tuned, self.noise_scale)
        return global_batch * efficiency / self.step_s(placement, batch)

    def batch_candidates(self) -> tuple[int, ...]:
        """The batches `best_batch` weighs: B0 x 1, 2, 4, ... below max, and max itself, each rounded
        down to a multiple of V (never below B0). Just B0 when B is fixed or phi unknown."""
        if self.max_batch is None or self.noise_scale is None or self.max_batch <= self.global_batch:
            return (self.global_batch,)
        v = max(1, self.virtual_nodes)
        top = max(self.global_batch, self.max_batch // v * v)
        out = []
        batch = self.global_batch
        while batch < top:
            out.append(max(self.global_batch, batch // v * v))
            batch *= 2
        return (*dict.fromkeys(out), top)

    def best_batch(self, placement: Placement) -> int:
        """The candidate batch with the most goodput at `placement` (the smallest on ties; B0 with
        no workers)."""
        return self.best(placement)[1]

    def batch_to_run(self, placement: Placement, current: int | None) -> int:
        """The batch to run at `placement`: `best_batch`, unless the batch the job runs at now
        (`current`, a candidate) comes within BATCH_SWITCH_GAIN of its goodput. Two candidates whose
        goodputs cross back and forth as the noise-scale estimate moves would otherwise switch the
        trainers' batch at every pass."""
        goodput, best = self.best(placement)
        if current is None or current == best or current not in self.batch_candidates():
            return best
        return current if self.goodput(placement, current) * (1 + BATCH_SWITCH_GAIN) >= goodput else best

    def best(self, placement: Placement) -> tuple[float, int]:
        """(goodput, batch) at the best candidate batch for `placement`."""
        found = (self.goodput(placement), self.global_batch)
        if placement.workers <= 0:
            return found
        for batch in self.batch_candidates()[1:]:
            value = self.goodput(placement, batch)
            if value > found[0]:
                found = (value, batch)
        return found


# --- fitting -------------------------------------------------------------------------------------


def _line(xs: Sequence[float], ys: Sequence[float], fallback_slope: float) -> tuple[float, float]:
    """Least-squares (intercept, slope), both >= 0; one distinct x keeps the fallback slope."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        slope = fallback_slope
    else:
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
    intercept = my - slope * mx
    if intercept < 0.0:  # through the origin instead
        sxx0 = sum(x * x for x in xs)
        sxy0 = sum(x * y for x, y in zip(xs, ys, strict=True))
        return 0.0, max(0.0, sxy0 / sxx0) if sxx0 > 0 else 0.0
    return intercept, slope


_PARAMS = tuple(f.name for f in fields(ThroughputParams))


def _with(params: ThroughputParams, **changes: float) -> ThroughputParams:
    """`dataclasses.replace` without its per-call field introspection: the fits build a few hundred
    parameter sets each, and that introspection was a quarter of a fit's time. (Not `vars`: the
    simulator's native build compiles this class, which then has no `__dict__`.)"""
    return ThroughputParams(**{name: changes.get(name, getattr(params, name)) for name in _PARAMS})


def _compute_line(data: Sequence[Measurement], base: ThroughputParams) -> ThroughputParams:
    """The compute line under `base`'s contention, from each measurement's compute seconds divided by
    its time-slicing and contention factors."""
    unit = _with(base, alpha_c=1.0, beta_c=0.0)  # compute_s(m) == 1: slowed_compute_s is the factor
    xs = [m.micro_batch for m in data]
    ys = [m.compute_s / unit.slowed_compute_s(m.placement, 1.0, m.accum_steps, m.tail) for m in data]
    if max(xs) - min(xs) > 1e-9:
        alpha_c, beta_c = _line(xs, ys, base.beta_c)
    else:  # one micro-batch size seen: keep the prior's split between fixed and per-sample cost
        scale = (sum(ys) / len(ys)) / max(base.compute_s(xs[0]), 1e-12)
        alpha_c, beta_c = base.alpha_c * scale, base.beta_c * scale
    return _with(base, alpha_c=alpha_c, beta_c=beta_c)


def _compute_error(data: Sequence[Measurement], params: ThroughputParams) -> float:
    return sum(
        (params.slowed_compute_s(m.placement, m.micro_batch, m.accum_steps, m.tail) - m.compute_s) ** 2
        for m in data
    )


def _contention_error(data: Sequence[Measurement], base: ThroughputParams, contention: float) -> float:
    """The compute error of the best compute line under `contention`."""
    return _compute_error(data, _compute_line(data, _with(base, contention=contention)))


def _fit_compute(data: Sequence[Measurement], base: ThroughputParams) -> ThroughputParams:
    """Compute line and contention. Contention needs compute measured at two or more numbers of busy
    devices per node; no contention is kept when it explains the measurements as well."""
    if len({busy_devices(m.placement) for m in data}) < 2:
        return _compute_line(data, base)
    # A partial, not a nested function: compiled, a nested function and its scope refer to each
    # other (a reference cycle left to the cyclic garbage collector at every fit).
    error = partial(_contention_error, data, base)
    found = golden_min(error, 0.0, CONTENTION_MAX)
    best = min((0.0, found), key=error)
    return _compute_line(data, _with(base, contention=best))


def _fit_overhead(data: Sequence[Measurement], base: ThroughputParams) -> float:
    """Least step time beyond compute among single-worker steps (no sync to hide it in): noise
    only ever adds time, and one slow measurement must not be paid on every prediction. The
    prior's without any."""
    alone = [m for m in data if m.workers == 1]
    if not alone:
        return base.overhead
    beyond = [
        m.step_s
        - (m.accum_steps + 1) * base.slowed_compute_s(m.placement, m.micro_batch, m.accum_steps, m.tail)
        for m in alone
    ]
    return max(0.0, min(beyond))


def _implied_sync(m: Measurement, compute: float, overhead: float, gamma: float) -> float:
    """T_net that makes the model's step time equal the measured one (0 when compute explains it)."""
    last = max(m.step_s - overhead - m.accum_steps * compute, compute)
    return float((last**gamma - compute**gamma) ** (1.0 / gamma))


@dataclass(frozen=True)
class _SyncData:
    """What the search over gamma needs of the measurements and does not depend on gamma, worked out
    once per fit: each measurement's placement and slowed compute seconds under the fitted compute
    line, and the multi-worker measurements grouped within one node (True) and across nodes (False)."""

    measurements: list[Measurement]
    placements: list[Placement]
    computes: list[float]
    groups: list[tuple[bool, list[int]]]

    @classmethod
    def of(cls, data: Sequence[Measurement], base: ThroughputParams) -> _SyncData:
        placements = [m.placement for m in data]
        computes = [
            base.slowed_compute_s(p, m.micro_batch, m.accum_steps, m.tail)
            for m, p in zip(data, placements, strict=True)
        ]
        groups = []
        for local in (True, False):
            indices = [i for i, m in enumerate(data) if m.workers >= 2 and (m.nodes <= 1) == local]
            if indices:
                groups.append((local, indices))
        return cls(list(data), placements, computes, groups)


def _fit_sync(data: _SyncData, base: ThroughputParams, gamma: float) -> tuple[ThroughputParams, float]:
    """Best sync lines for this gamma and their squared error in step seconds (`step_s`'s arithmetic,
    with the compute seconds that do not depend on gamma taken from `data`)."""
    lines: dict[str, float] = {"gamma": gamma}
    for local, indices in data.groups:
        xs = [float(data.measurements[i].workers - 2) for i in indices]
        ys = [_implied_sync(data.measurements[i], data.computes[i], base.overhead, gamma) for i in indices]
        alpha, beta = _line(xs, ys, base.beta_local if local else base.beta_net)
        lines |= (
            {"alpha_local": alpha, "beta_local": beta} if local else {"alpha_net": alpha, "beta_net": beta}
        )
    params = _with(base, **lines)
    error = sum(
        (
            m.accum_steps * compute
            + _overlap(compute, params.sync_s(placement), gamma)
            + params.overhead
            - m.step_s
        )
        ** 2
        for m, placement, compute in zip(data.measurements, data.placements, data.computes, strict=True)
    )
    return params, error


def fit(measurements: Sequence[Measurement], prior: ThroughputParams | None = None) -> ThroughputParams:
    """The parameters that best explain the measurements; the prior where they say nothing."""
    base = prior if prior is not None else ThroughputParams.prior()
    data = [m for m in measurements if m.workers >= 1 and m.step_s > 0 and m.compute_s > 0]
    if not data:
        return base
    base = _fit_compute(data, base)
    base = replace(base, overhead=_fit_overhead(data, base))
    if not any(m.workers >= 2 for m in data):
        return base
    grid = [GAMMA_MIN * (GAMMA_MAX / GAMMA_MIN) ** (i / 12) for i in range(13)]
    sync = _SyncData.of(data, base)
    gamma = grid_then_golden(lambda g: _fit_sync(sync, base, g)[1], grid)
    return _fit_sync(sync, base, gamma)[0]


@lru_cache(maxsize=4096)
def fit_cached(
    measurements: tuple[Measurement, ...], prior: ThroughputParams | None = None
) -> ThroughputParams:
    """`fit`, memoised: a policy pass refits only the jobs whose measurements changed."""
    return fit(measurements, prior)


def compute_speeds(jobs: Iterable[Sequence[Measurement]]) -> dict[str, float]:
    """Relative compute speed of each GPU type, from jobs measured on more than one type.

    The reference type (speed 1) is the one measured most. For a job measured on the reference and
    on type t, its ratio is the reference-fitted compute time over the compute time measured on t
    (median over its measurements); t's speed is the median ratio over such jobs. Types no job
    links to the reference are left out (callers assume 1).
    """
    measured = [list(job) for job in jobs]
    counts = Counter(m.gpu_type for job in measured for m in job if m.gpu_type)
    if not counts:
        return {}
    reference = counts.most_common(1)[0][0]
    ratios: dict[str, list[float]] = defaultdict(list)
    for job in measured:
        on_reference = tuple(m for m in job if m.gpu_type == reference)
        others = [m for m in job if m.gpu_type not in ("", reference) and m.compute_s > 0]
        if not on_reference or not others:
            continue
        line = fit_cached(on_reference)
        by_type: dict[str, list[float]] = defaultdict(list)
        for m in others:
            at_reference = m.placement.with_speed(1.0)
            expected = line.slowed_compute_s(at_reference, m.micro_batch, m.accum_steps, m.tail)
            by_type[m.gpu_type].append(expected / m.compute_s)
        for gpu_type, values in by_type.items():
            ratios[gpu_type].append(statistics.median(values))
    return {reference: 1.0, **{t: statistics.median(v) for t, v in ratios.items()}}
