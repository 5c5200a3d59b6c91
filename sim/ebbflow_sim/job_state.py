"""One simulated job's mutable state: progress, checkpoints, workers, and what its trainers would report.

Progress is in samples at the job's starting batch B0's statistical efficiency; a job runs at its
true goodput (`SimJob.model()`) at its current placement and batch `batch` (B0 unless the goodput
policy chose another for a job that allows it), except while paused (a rescale or a restart), when
it holds its GPUs and makes no progress. Checkpoints are taken every `checkpoint_s` seconds of
active (unpaused) time; losing every worker rolls progress back to the last one. Reports mirror
the trainers' contract: one throughput measurement per distinct shape (and batch) the job ran at,
and (step, loss) points at geometric step milestones (so the history is short and starts at step 0,
as the loss fit needs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ebbflow_operator.decision.allocator import most_used_first
from ebbflow_operator.policies.throughput import Measurement, Placement, slowdown, step_shape

from .trace import SimJob

REPORT_GROWTH = 1.25  # next loss report when the step count has grown by this factor
MAX_SHAPES = 8  # throughput measurements kept per job (the latest distinct shapes)


@dataclass
class JobState:
    job: SimJob
    progress: float = 0.0
    checkpoint: float = 0.0
    active_since_checkpoint: float = 0.0
    workers: list[str] = field(default_factory=list)  # one node name per worker (set with `set_workers`)
    # The workers' nodes most-used first (`allocator.most_used_first`), as a `Demand` lists them.
    current_nodes: tuple[str, ...] = ()
    rate: float = 0.0  # samples/s at the current placement
    paused_until: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    rescales: int = 0
    preemptions: int = 0
    lost_samples: float = 0.0  # work thrown away by roll-backs
    batch: int = 0  # the global batch B it trains at (0: the job's B0, set on creation)
    shapes: dict[tuple[int, int, float, int, str], Measurement] = field(default_factory=dict)
    losses: list[tuple[float, float]] = field(default_factory=list)
    next_report: float = 0.0  # the step of the next loss report (a milestone)
    noise_step: float = 0.0  # the loss milestone whose noise scale it trains with (`take_noise_scale`)
    synced_s: float = 0.0  # progress, checkpoint and reports are worked out up to this time
    _reported: tuple[object, tuple[Measurement, ...]] | None = field(default=None, repr=False, compare=False)
    _shapes_changed: int = field(default=0, repr=False, compare=False)  # bumped whenever `shapes` changes

    def __post_init__(self) -> None:
        self.batch = self.batch or self.job.global_batch

    def set_workers(self, nodes: list[str]) -> None:
        """Its workers from now on; their order most-used first is worked out once here, not at
        every allocation pass that asks for the job's `Demand`."""
        self.workers = nodes
        self.current_nodes = most_used_first(nodes)

    @property
    def steps(self) -> float:
        """Steps at B0 (progress counts samples at B0's efficiency, whatever B the job ran at)."""
        return self.progress / self.job.global_batch

    @property
    def done(self) -> bool:
        return self.finished_s is not None

    def normalised_loss(self) -> float:
        return self.job.loss.loss(self.steps)

    @property
    def noise_scale(self) -> float:
        """The gradient noise scale phi it trains with and its trainers report (`take_noise_scale`)."""
        return self.job.noise_scale_at(self.noise_step)

    def take_noise_scale(self) -> bool:
        """phi moves on to its value at the last loss milestone reported, as the operator reads it
        from the trainers at an allocation pass; held in between, so that the job's rate only changes
        when the engine rates it again. True when it moved."""
        step = self.losses[-1][0] if self.losses else 0.0
        moved = step != self.noise_step
        self.noise_step = step
        return moved

    def finish_time(self) -> float:
        """When the job completes at its current rate (inf when it is not running). Valid because its
        rate, pause and workers have not changed since `synced_s` (see `advance`)."""
        if self.rate <= 0 or not self.workers:
            return math.inf
        left = self.job.work_samples - self.progress
        return max(self.paused_until, self.synced_s) + max(0.0, left) / self.rate

    def advance(self, end: float, checkpoint_s: float) -> None:
        """Trains from `synced_s` to `end` (skipping the paused part), checkpointing on schedule and
        reporting the loss milestones passed. The engine calls it lazily: before anything changes
        the job's rate, pause, workers or progress, and before anyone reads its progress, not at
        every event (at 10,000 jobs that was millions of calls a simulated day)."""
        begin = max(self.paused_until, self.synced_s)
        self.synced_s = max(self.synced_s, end)
        if self.rate <= 0 or not self.workers or end <= begin:
            return
        active = end - begin
        total = self.active_since_checkpoint + active
        work = self.job.work_samples
        if checkpoint_s > 0 and total >= checkpoint_s:
            taken = int(total // checkpoint_s)
            first = checkpoint_s - self.active_since_checkpoint
            done_at = self.progress + self.rate * (first + checkpoint_s * (taken - 1))
            self.checkpoint = min(work, done_at)
            self.active_since_checkpoint = total - taken * checkpoint_s
        else:
            self.active_since_checkpoint = total
        self.progress = min(work, self.progress + self.rate * active)
        self.report_loss()

    def report_loss(self) -> None:
        """Reports (step, loss) at every milestone the job has reached since its last report, as its
        trainers would have at those steps (each milestone REPORT_GROWTH times the last, at least one
        step later), whenever the engine catches up with it."""
        while self.steps >= self.next_report:
            step = self.next_report
            self.losses.append((step, self.job.loss.loss(step)))
            self.next_report = max(step * REPORT_GROWTH, step + 1.0)

    def roll_back(self) -> None:
        """Every worker is gone without a handover: back to the last checkpoint."""
        self.lost_samples += self.progress - self.checkpoint
        self.progress = self.checkpoint
        self.active_since_checkpoint = 0.0
        self.next_report = self.steps

    def hand_over(self) -> None:
        """A graceful stop (SIGTERM): the trainers write a checkpoint before they exit."""
        self.checkpoint = self.progress
        self.active_since_checkpoint = 0.0

    def reported(self, speeds: Mapping[str, float]) -> tuple[Measurement, ...]:
        """The measurements, each carrying its GPU type's learned speed, as `History.metrics` gives
        them to the policies. Every pass asks for every job's; they are remembered until a shape or
        a speed changes (a measurement of a shape never changes)."""
        key = (self._shapes_changed, speeds)
        if self._reported is None or self._reported[0] != key:
            measured = tuple(replace(m, speed=speeds.get(m.gpu_type, 1.0)) for m in self.shapes.values())
            self._reported = (self._shapes_changed, dict(speeds)), measured
        return self._reported[1]

    def measure(self, placement: Placement, step_s: float, gpu_type: str = "") -> None:
        """Records what the trainers report at this placement and the job's batch (the true model, no
        noise), on GPUs of `gpu_type` ("" when the job's nodes mix types)."""
        micro, accum = step_shape(self.batch, self.job.virtual_nodes, placement.workers)
        key = (placement.workers, placement.nodes, placement.share, self.batch, gpu_type)
        if key in self.shapes:
            return
        compute = self.job.params.compute_s(micro) * slowdown(placement.share) / placement.speed
        self.shapes[key] = Measurement(
            placement.workers, micro, step_s, compute, placement.nodes, accum, placement.share, gpu_type
        )
        while len(self.shapes) > MAX_SHAPES:
            self.shapes.pop(next(iter(self.shapes)))
        self._shapes_changed += 1
