"""Job traces for the simulator: a seeded synthetic generator shaped like published cluster traces, and CSV.

Shapes (Philly, ATC'19; Helios, SC'21): a heavy-tailed size mix (most jobs 1-8 GPUs, a few 16-64),
log-normal run times, Poisson arrivals at a rate derived from an offered load. Each job carries its
*true* models, which the engine advances it by and the policies only see through reports: a Pollux
throughput model (costs drawn per job) and a normalised loss curve loss(k) = b / (k + b); a job may
allow batch adaptation (`max_batch`) and carries a gradient noise scale that grows as its loss falls.

Invariants: the same config and seed give the same jobs; the batching options leave every other
field of the trace unchanged; CSV round-trips exactly (floats written with repr).
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from ebbflow_operator.policies.loss_curve import LossCurve
from ebbflow_operator.policies.throughput import JobModel, Placement, ThroughputParams

# GPUs a job asks for, with probabilities (Philly: ~80 % of jobs use <= 8 GPUs, a few use 32+).
SIZE_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.40),
    (2, 0.15),
    (4, 0.15),
    (8, 0.18),
    (16, 0.07),
    (32, 0.03),
    (64, 0.02),
)
MICRO_BATCH = 32  # samples per virtual node


@dataclass(frozen=True)
class SimJob:
    """One job of a trace: its request and its true throughput and loss models."""

    name: str
    arrival_s: float
    min_workers: int
    max_workers: int
    gpus_per_worker: int
    work_samples: float  # samples to train before it finishes
    global_batch: int
    virtual_nodes: int
    priority: int
    alpha_c: float
    beta_c: float
    alpha_local: float
    beta_local: float
    alpha_net: float
    beta_net: float
    gamma: float
    loss_b: float  # steps to halve the normalised loss
    # What the user would run without elasticity (0: max_workers): the rigid baselines' fixed size,
    # trained with one virtual node per worker (see `rigid`).
    requested_workers: int = 0
    noise_scale: float = 0.0  # gradient noise scale phi (read only when max_batch is set)
    # The spec's maxGlobalBatchSize (0: unset, B fixed): the goodput policy may run the job at any
    # multiple of V in [global_batch, max_batch]; progress is counted at global_batch's efficiency.
    max_batch: int = 0
    # phi after k steps = noise_scale x (loss(0) / loss(k)) ** noise_growth (0: constant; traces
    # written before the column). Read only when max_batch is set.
    noise_growth: float = 0.0

    def rigid(self) -> SimJob:
        """The job as `static` and `restart` run it: at most its requested size, V = that size."""
        requested = self.requested_workers or self.max_workers
        return replace(
            self,
            min_workers=min(self.min_workers, requested),
            max_workers=requested,
            virtual_nodes=requested,
            requested_workers=requested,
            max_batch=0,  # the rigid baselines run no goodput policy: B stays fixed
        )

    @property
    def params(self) -> ThroughputParams:
        return ThroughputParams(
            self.alpha_c,
            self.beta_c,
            self.alpha_local,
            self.beta_local,
            self.alpha_net,
            self.beta_net,
            self.gamma,
        )

    def model(self, steps: float = 0.0) -> JobModel:
        """The true model after `steps` steps; a job that may change its batch carries its noise scale
        at that point of training and its max."""
        if not self.max_batch:
            return JobModel(self.params, self.global_batch, self.virtual_nodes)
        return JobModel(
            self.params,
            self.global_batch,
            self.virtual_nodes,
            self.noise_scale_at(steps),
            max_batch=self.max_batch,
        )

    def noise_scale_at(self, steps: float) -> float:
        """phi after `steps` steps: it grows as the loss falls (`noise_growth`)."""
        if not self.noise_growth:
            return self.noise_scale
        return float(self.noise_scale * (1.0 + steps / self.loss_b) ** self.noise_growth)

    @property
    def loss(self) -> LossCurve:
        return LossCurve(a=self.loss_b, b=self.loss_b, c=0.0, scale=1.0)

    @property
    def total_steps(self) -> float:
        return self.work_samples / self.global_batch


@dataclass(frozen=True)
class TraceConfig:
    """The generator's parameters (documented in docs/simulator.md)."""

    jobs: int = 200
    gpus: int = 512
    load: float = 2.0  # offered GPU-seconds / available GPU-seconds over the arrival window
    median_duration_s: float = 3600.0  # at the job's max size, exclusive devices
    duration_sigma: float = 1.0  # log-normal sigma (heavy tail)
    min_duration_s: float = 60.0
    max_duration_s: float = 12 * 3600.0
    elastic_min_fraction: float = 0.25  # min workers = ceil(requested * this)
    # max workers = requested * this (capped by the cluster): the room an elastic job has to grow
    # into GPUs nobody uses. A power of two <= 32, so the batch of 32 samples per requested worker
    # splits into max virtual nodes. 1: elastic jobs can only shrink below what they asked for.
    elastic_max_factor: int = 1
    priorities: int = 1  # levels 0..priorities-1, uniform
    # Batch adaptation (Pollux): this fraction of the jobs set maxGlobalBatchSize = B0 x
    # max_batch_factor (0: elastic_max_factor, which keeps the micro-batch at max size the 32 samples
    # the user ran per GPU). Every job's noise scale is drawn log-uniform with phi / B0 in
    # noise_ratio (an assumption; docs/simulator.md). Both from their own random stream, so the
    # rest of the trace does not depend on them.
    adaptive_batch_fraction: float = 0.0
    max_batch_factor: int = 0
    noise_ratio: tuple[float, float] = (0.25, 16.0)
    # phi grows as the loss falls: phi(k) = phi(0) x (loss(0) / loss(k)) ** noise_growth. 1 is a
    # quadratic loss near its minimum (the gradient's squared norm shrinks with the loss, its
    # variance does not), where phi = tr(Sigma) / |G|^2 goes as 1 / loss; 0: constant (docs/simulator.md).
    noise_growth: float = 1.0

    def __post_init__(self) -> None:
        if self.elastic_max_factor not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"elastic_max_factor {self.elastic_max_factor}: choose 1, 2, 4, 8, 16 or 32")
        if not 0.0 <= self.adaptive_batch_fraction <= 1.0 or self.max_batch_factor < 0:
            raise ValueError("adaptive_batch_fraction must be in [0, 1] and max_batch_factor >= 0")
        if not 0.0 < self.noise_ratio[0] <= self.noise_ratio[1]:
            raise ValueError(f"noise_ratio {self.noise_ratio}: need 0 < low <= high")
        if not 0.0 <= self.noise_growth <= 4.0:
            raise ValueError(f"noise_growth {self.noise_growth}: choose a number in [0, 4] (0: constant phi)")


def _size(rnd: random.Random) -> int:
    sizes = [size for size, _ in SIZE_MIX]
    return int(rnd.choices(sizes, weights=[w for _, w in SIZE_MIX])[0])


def _job(rnd: random.Random, index: int, config: TraceConfig) -> SimJob:
    """A job without its arrival time: size, scaling, work and loss curve."""
    gpus = min(_size(rnd), config.gpus)
    workers = min(gpus * config.elastic_max_factor, config.gpus)
    duration = math.exp(rnd.gauss(math.log(config.median_duration_s), config.duration_sigma))
    duration = min(max(duration, config.min_duration_s), config.max_duration_s)
    partial = SimJob(
        name=f"job-{index:05d}",
        arrival_s=0.0,
        min_workers=max(1, math.ceil(gpus * config.elastic_min_fraction)),
        max_workers=workers,
        gpus_per_worker=1,
        work_samples=0.0,
        global_batch=MICRO_BATCH * gpus,
        virtual_nodes=workers,
        priority=rnd.randrange(max(1, config.priorities)),
        alpha_c=0.005,
        beta_c=0.001 * rnd.uniform(0.5, 4.0),  # compute per sample: model size
        alpha_local=0.005 * rnd.uniform(0.5, 2.0),
        beta_local=0.0005 * rnd.uniform(0.5, 2.0),
        alpha_net=0.02 * rnd.uniform(0.25, 8.0),  # gradient size / network: scaling differs per job
        beta_net=0.002 * rnd.uniform(0.25, 4.0),
        gamma=rnd.uniform(1.0, 3.0),
        loss_b=1.0,
        requested_workers=gpus,
    )
    work = duration * _rate(partial)
    steps = work / partial.global_batch
    return replace(partial, work_samples=work, loss_b=steps * rnd.uniform(0.05, 0.5))


def _batching(job: SimJob, rnd: random.Random, config: TraceConfig) -> SimJob:
    """The job's noise scale and, for `adaptive_batch_fraction` of the jobs, its max batch (a
    multiple of V). Both draws are made for every job, so the fraction changes nothing else."""
    low, high = config.noise_ratio
    phi = job.global_batch * math.exp(rnd.uniform(math.log(low), math.log(high)))
    adaptive = rnd.random() < config.adaptive_batch_fraction
    factor = config.max_batch_factor or config.elastic_max_factor
    top = job.global_batch * factor // job.virtual_nodes * job.virtual_nodes
    max_batch = top if adaptive and top > job.global_batch else 0
    return replace(job, noise_scale=phi, max_batch=max_batch, noise_growth=config.noise_growth)


def generate(config: TraceConfig, seed: int) -> list[SimJob]:
    """`config.jobs` jobs with Poisson arrivals at the rate that offers `config.load`."""
    rnd = random.Random(seed)
    jobs = [_job(rnd, i, config) for i in range(config.jobs)]
    batching = random.Random(f"batching-{seed}")
    jobs = [_batching(job, batching, config) for job in jobs]
    gpu_seconds = sum(j.rigid().max_workers * j.gpus_per_worker * j.work_samples / _rate(j) for j in jobs)
    window = gpu_seconds / (config.load * max(1, config.gpus))
    rate = len(jobs) / window if window > 0 else 1.0
    now = 0.0
    out = []
    for job in jobs:
        out.append(replace(job, arrival_s=now))
        now += rnd.expovariate(rate)
    return out


def _rate(job: SimJob) -> float:
    """Samples per second at the requested size, run rigidly (what the job's duration means)."""
    rigid = job.rigid()
    nodes = max(1, math.ceil(rigid.max_workers * job.gpus_per_worker / 8))
    return max(rigid.model().goodput(Placement(rigid.max_workers, nodes)), 1e-9)


COLUMNS = tuple(f.name for f in fields(SimJob))
_INTS = {
    "min_workers",
    "max_workers",
    "gpus_per_worker",
    "global_batch",
    "virtual_nodes",
    "priority",
    "requested_workers",
    "max_batch",
}
# Columns traces written before them lack: the rigid size is max_workers, B is fixed.
OPTIONAL = {"requested_workers", "noise_scale", "max_batch", "noise_growth"}


def write_csv(jobs: Iterable[SimJob]) -> str:
    """The trace as CSV text, one row per job, columns `COLUMNS` (floats exact)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in jobs:
        writer.writerow(
            [repr(getattr(job, c)) if c not in _INTS | {"name"} else getattr(job, c) for c in COLUMNS]
        )
    return out.getvalue()


def read_csv(text: str) -> list[SimJob]:
    """Parses `write_csv`'s format; a missing column or bad value raises ValueError naming it."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ()) and c not in OPTIONAL]
    if missing:
        raise ValueError(f"trace CSV lacks columns: {', '.join(missing)}")
    jobs = []
    for line, row in enumerate(reader, start=2):
        values: dict[str, object] = {}
        for column in COLUMNS:
            if column in OPTIONAL and not row.get(column):
                continue
            try:
                values[column] = _parse(column, row[column])
            except ValueError as error:
                raise ValueError(f"trace CSV line {line}, column {column}: {error}") from error
        job = SimJob(**values)  # type: ignore[arg-type]
        _check(job, line)
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.arrival_s, j.name))


def _parse(column: str, raw: str) -> object:
    if column == "name":
        if not raw:
            raise ValueError("empty")
        return raw
    if column in _INTS:
        return int(raw)
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{raw!r} is not a finite number >= 0")
    return value


def _check(job: SimJob, line: int) -> None:
    if not 1 <= job.min_workers <= job.max_workers:
        raise ValueError(f"trace CSV line {line}: need 1 <= min_workers <= max_workers")
    if job.requested_workers > job.max_workers:
        raise ValueError(f"trace CSV line {line}: need requested_workers <= max_workers (0: max_workers)")
    if job.global_batch < 1 or job.virtual_nodes < 1 or job.loss_b <= 0 or job.gpus_per_worker < 0:
        raise ValueError(f"trace CSV line {line}: global_batch, virtual_nodes, loss_b must be > 0")
    if job.max_batch and job.max_batch < job.global_batch:  # the policy rounds it down to a multiple of V
        raise ValueError(f"trace CSV line {line}: max_batch must be 0 or >= global_batch")
