"""One training process's worker (forked warm by the agent, see :mod:`.preload` and :mod:`.worker_process`).

Life of a worker: bootstrap a gloo process group from the rendezvous store under the world's
generation; agree on the freshest state (survivors bring theirs from node-local memory, newcomers
receive it from a peer); train; and when the world must change, stop at a step boundary and either
enter the next world in this process (a newcomer joins a replicated world, :mod:`.world_switch`) or
leave the state in node-local memory for the next world and exit.

Exit codes towards the agent: 0 when training finished or this worker was asked to leave (SIGTERM);
``EXIT_REFORM`` when the world must re-form without it being asked (the agent restarts it in the next
round); ``contract.EXIT_NONFINITE_LOSS`` after ``max_nonfinite_steps`` skipped steps in a row, decided
at the same step by every worker, rank 0 saving the last finite state as the checkpoint.
Invariant: after bootstrap, training never waits on the rendezvous store (it only keeps rank 0's
record of the newest step, to count the steps a new world lost).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from ebbflow_api import contract
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from ebbflow_trainer import global_batch, metrics
from ebbflow_trainer.api import load_spec
from ebbflow_trainer.batching import DynamicBatchingController
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import shard_copies, state, world_switch
from ebbflow_trainer.launch.buddies import Piece
from ebbflow_trainer.launch.collectives import (
    DistCollectives,
    resolve_backend,
    training_device,
    use_deterministic_kernels,
)
from ebbflow_trainer.launch.durable import DurableCheckpoints
from ebbflow_trainer.launch.journal import Journal
from ebbflow_trainer.launch.rendezvous import connect, generation_store
from ebbflow_trainer.launch.world_switch import World
from ebbflow_trainer.sharding import even_counts, ranges_from_counts
from ebbflow_trainer.step import memory_budget
from ebbflow_trainer.step.engine import ReductionFailed, Requests, StepResult
from ebbflow_trainer.step.selection import engine_for
from ebbflow_trainer.termination import write_termination_message

EXIT_REFORM = 75
# Not an exit: train() returns it when the world enters its next one in place (`Worker.entering`).
ENTER_NEXT_WORLD = -1
log = logging.getLogger("ebbflow_trainer.launch.worker")


class LeaveNow(Exception):
    """SIGTERM arrived before training started: nothing to finish, leave at once."""


class LeaveSignal:
    """SIGTERM means "finish this step, hand the state over, exit 0"; before training it means "exit now"."""

    def __init__(self) -> None:
        self.requested = False
        self.training = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.training:
            raise LeaveNow


class Worker:
    def __init__(self, config: TrainerConfig, world: World, leave: LeaveSignal):
        self.config = config
        self.world = world
        self.leave = leave
        self.journal = Journal(config.journal)
        torch.manual_seed(config.seed)
        self.spec = load_spec(config.spec)
        self.backend = resolve_backend(config)
        if config.mode == "deterministic" and torch.cuda.is_available():
            use_deterministic_kernels()
        self.device = training_device(world.local_rank)
        # Before the optimizer holds state: Module.to moves the parameters in place, so the optimizer's
        # references stay valid (and a restored optimizer state follows its parameters' device).
        self.spec.model.to(self.device)
        # nccl reduces on the GPU only; gloo on the CPU.
        self.comm_device = self.device if self.backend == "nccl" else torch.device("cpu")
        self.engine = engine_for(self.spec, config, message_device=self.comm_device)
        self.comm = DistCollectives(self.comm_device)
        self.total_steps = config.steps or self.spec.steps
        self.state_dir = state.local_dir(Path(config.state_dir), world.local_rank)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.last_step_wall_time = time.time()
        self.last_pause: float | None = None  # of this process's last membership change
        self.store: TCPStore | None = connect(config, config.store_timeout)
        self._last_store_report = 0.0
        self.entering: World | None = None  # set by a stop that enters it in place
        self._bind(world)
        # A replicated world's next one is entered in this process (:mod:`.world_switch`).
        self.next_world: world_switch.NextWorldFile | None = None
        if self.copies is None and not self.engine.collective_state:
            self.next_world = world_switch.NextWorldFile(self.state_dir)
            (self.state_dir / world_switch.IN_PLACE_MARKER).touch()
        else:
            (self.state_dir / world_switch.IN_PLACE_MARKER).unlink(missing_ok=True)

    def _bind(self, world: World) -> None:
        """What depends on this process's rank and world size: set for each world it trains in."""
        config = self.config
        self.world = world
        # Durable checkpoints: files on a shared volume (pieces, when sharded), or objects (s3://).
        self.durable = DurableCheckpoints(
            config, self.engine, world.rank, world.size, self.comm_device, self.journal
        )
        self.progress = metrics.ProgressReporter(config) if world.rank == 0 else None
        # Rank 0 reads the global batch the operator's policy chose (only with maxGlobalBatchSize).
        changing = config.max_global_batch_size is not None and config.global_batch_size_file
        self.requests = global_batch.RequestFile(config) if changing and world.rank == 0 else None
        # Rank 0 chooses the compression rate that fits the memory budget (only with bandLimit).
        budgeted = config.band_limit and config.memory_budget_file and world.rank == 0
        self.rate_requests = (
            memory_budget.RateRequests(config, self.engine.rates, self.engine.measured_footprint)
            if budgeted
            else None
        )
        # A sharded world's copies of each worker's shard in a buddy's memory (TrainingSpec.buddy_every).
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.copies = shard_copies.for_world(
            self.engine, world.rank, world.size, per_node, self.spec.buddy_every, self.comm_device
        )

    # --- state agreement -------------------------------------------------------------------------
    def _highest(self, local: dict[str, Any] | None) -> tuple[torch.Tensor, int, int]:
        """Every member's step (+1, so "no state" is 0), the highest, and the lowest rank holding it."""
        steps = torch.zeros(self.world.size, dtype=torch.int64, device=self.comm_device)
        steps[self.world.rank] = local["step"] + 1 if local is not None else 0
        dist.all_reduce(steps)
        best = int(steps.max())
        return steps, best, int((steps == best).nonzero()[0])

    def agree_on_state(self, live: bool = False) -> None:
        """Continue from the freshest state: in-memory handoffs first (survivors keep theirs, stale members
        and newcomers receive it from a peer), the durable checkpoint only when no member holds one.
        ``live``: this process trained the last world, its state is the one in its memory."""
        local: dict[str, Any] | None = {"step": self.step}
        copies: dict[Piece, bytes] = {}
        if not live:
            local, copies = shard_copies.read_handoff(self.state_dir / state.HANDOFF_FILE)
        source = "memory"
        steps, best, holder = self._highest(local)
        durable = self.durable.configured
        rebuilt = self.copies.rebuild(copies, best - 1, durable) if self.copies else None
        if rebuilt is not None:
            local, source = rebuilt, "shards"
            steps, best, holder = self._highest(local)
        if best == 0 and durable:
            local, source = self.durable.read(), "checkpoint"
            steps, best, holder = self._highest(local)
        mine = int(steps[self.world.rank])
        resumed = local if local is not None and mine == best else None
        if best > 0 and bool((steps != best).any()):
            sent = None
            if self.world.rank == holder and local is not None:
                whole = state.capture(self.engine, self.step, self.last_step_wall_time) if live else local
                sent = state.to_bytes(whole)
            payload = [sent]
            dist.broadcast_object_list(payload, src=holder)
            if resumed is None:
                assert payload[0] is not None
                resumed, source = state.from_bytes(payload[0]), "peer"
        if resumed is None:
            source = "fresh"
        elif not (live and source == "memory"):  # else the state this process trained on is in place
            state.restore(self.engine, resumed)
            self.step = int(resumed["step"])
            self.last_step_wall_time = float(resumed["last_step_wall_time"])
        self.source = source
        lost = 0
        if self.world.rank == 0:
            lost = self._steps_lost()
            metrics.STEPS_LOST.inc(lost)
        self.journal.write(
            "generation",
            generation=self.world.generation,
            rank=self.world.rank,
            world=self.world.size,
            step=self.step,
            source=source,
            holder=holder,
            steps_lost=lost,
        )
        log.info(
            contract.RESUMES_LOG,
            self.world.generation,
            self.world.rank,
            self.world.size,
            self.step,
            source,
            f", {lost} step(s) lost" if self.world.rank == 0 else "",
        )

    @property
    def _last_step_key(self) -> str:
        return f"ebbflow/{self.config.rdzv_id}/last-step"

    def _steps_lost(self) -> int:
        """The job's newest step (rank 0 records it in the store) minus the step this world resumes at.
        A store that never held it (the first world, or a new store after a loss) counts none."""
        try:
            if self.store is not None and self.store.check([self._last_step_key]):
                return max(0, int(self.store.get(self._last_step_key)) - self.step)
        except RuntimeError as error:  # torch's DistError: the store is gone
            self._store_unreachable(error)
        return 0

    def _store_unreachable(self, error: Exception) -> None:
        log.warning(
            "the rendezvous store is unreachable (%s); training on without recording the last step "
            "until the next world",
            error,
        )
        self.store = None

    # --- training --------------------------------------------------------------------------------
    def train(self) -> int:
        config, world = self.config, self.world
        counts = even_counts(config.virtual_nodes, world.size)
        controller = (
            DynamicBatchingController(config.virtual_nodes, world.size, dead_band=config.dead_band)
            if config.batching == "dynamic"
            else None
        )
        first_step = True
        metrics.WORLD_SIZE.set(world.size)
        metrics.GENERATION.set(world.generation)
        self.leave.training = True
        (self.state_dir / state.TRAINING_MARKER).touch()
        if not self._copy_to_buddies(every_step=True):
            return EXIT_REFORM
        while self.step < self.total_steps:
            mine = ranges_from_counts(counts)[world.rank]
            started = time.time()
            try:
                message, compute_seconds = self._reduce(mine)
            except ReductionFailed as error:
                self.hand_over_after_failure(error)
                return EXIT_REFORM
            if self.copies is not None:
                self.copies.settle()
            result = self.engine.apply(message, world.size)
            self.step += 1
            now = time.time()
            if first_step:
                self._first_step_done(now)
            first_step = False
            self.last_step_wall_time = now
            self._evaluate()
            self._record_step(now - started, result, mine, compute_seconds)
            self._follow(result.requests)
            if self.engine.nonfinite_streak >= config.max_nonfinite_steps:
                return self.stop_diverged()
            interval = config.checkpoint_interval_steps
            if interval and self.step % interval == 0 and not self._checkpoint():
                return EXIT_REFORM
            if result.leave_requested:
                return self.stop_for_new_world()
            if not self._copy_to_buddies():
                return EXIT_REFORM
            if controller is not None:
                proposal = controller.observe(counts, result.compute_seconds)
                if proposal is not None:
                    self.journal.write(
                        "rebalance", step=self.step, counts=proposal, seconds=result.compute_seconds
                    )
                    counts = proposal
        if not (interval and self.step % interval == 0) and not self._checkpoint():  # else written already
            return EXIT_REFORM
        whole = world.rank == 0 or self.engine.collective_state  # a sharded model is gathered by all
        digest = state.state_digest(self.engine.model_state()) if whole else ""
        if world.rank == 0:
            self._report_last_step(force=True)
            log.info(contract.FINISHED_LOG, self.step, digest)
        self.journal.write("done", step=self.step, generation=world.generation)
        return contract.EXIT_SUCCESS

    def _first_step_done(self, now: float) -> None:
        """The new world's first step: its pause since the last step of the job, and a sharded
        worker's handoff dropped (stale from now on: the next world must not resume from it)."""
        if self.source in ("memory", "peer", "shards"):
            pause = now - self.last_step_wall_time
            self.last_pause = pause
            metrics.RESCALE_PAUSE.observe(pause)
            self.journal.write(
                "resumed", generation=self.world.generation, step=self.step, pause_seconds=pause
            )
            if self.world.rank == 0:
                log.info(contract.RESUMED_LOG, self.world.generation, pause)
        if self.engine.collective_state:
            (self.state_dir / state.HANDOFF_FILE).unlink(missing_ok=True)

    def _copy_to_buddies(self, every_step: bool = False) -> bool:
        """A sharded world's buddy copies of this step when due (``every_step``: at the world's start);
        False when the exchange failed and the state is handed over for the next world."""
        if self.copies is None or not (self.copies.due(self.step) or (every_step and self.copies.every)):
            return True
        try:
            self.copies.exchange(self.step, self.last_step_wall_time)
        except ReductionFailed as error:
            self.hand_over_after_failure(error)
            return False
        return True

    def _reduce(self, mine: list[int]) -> tuple[torch.Tensor, float]:
        """This worker's part of the step, all-reduced; rank 0's message asks for the global batch
        the policy chose and the compression rate that fits the memory budget."""
        requests = Requests(
            self.requests.poll() if self.requests is not None else 0,
            self.rate_requests.poll() if self.rate_requests is not None else 0,
        )
        with torch.random.fork_rng(devices=[]):
            reduced = self.engine.reduce_step(
                self.step,
                mine,
                rank=self.world.rank,
                world_size=self.world.size,
                leave=self._stop_asked,
                comm=self.comm,
                requests=requests,
            )
        if self.world.size > 1 and self.config.simulated_sync_seconds > 0:
            time.sleep(self.config.simulated_sync_seconds)  # a modelled slow interconnect (tests)
        return reduced

    def _follow(self, requests: Requests) -> None:
        """Every worker read the same requests in the same step's message: all switch before the next."""
        if requests.batch and requests.batch != self.engine.global_batch_size:
            self._switch_batch(requests.batch)
        rate = memory_budget.decode_rate(requests.rate, self.engine.rates)
        if rate is not None and rate != self.engine.compression_rate:
            previous = self.engine.compression_rate
            self.engine.switch_rate(rate)
            log.info(contract.RATE_LOG, self.step, rate, previous)
            self.journal.write("rate", step=self.step, rate=rate, previous=previous, rank=self.world.rank)

    def _switch_batch(self, batch: int) -> None:
        previous = self.engine.global_batch_size
        self.engine.switch_batch(self.step, batch)
        log.info(contract.BATCH_LOG, self.step, batch, previous, self.engine.samples_per_virtual_node)
        self.journal.write("batch", step=self.step, batch=batch, previous=previous, rank=self.world.rank)

    def _record_step(
        self, seconds: float, result: StepResult, mine: list[int], compute_seconds: float
    ) -> None:
        samples, loss = self.engine.global_batch_size, result.loss
        metrics.STEP.set(self.step)
        metrics.SAMPLES.inc(samples)
        metrics.SAMPLES_PER_SECOND.set(samples / seconds if seconds > 0 else 0.0)
        metrics.STEP_SECONDS.observe(seconds)
        metrics.COMPUTE_SECONDS.set(compute_seconds)
        metrics.VIRTUAL_NODES.set(len(mine))
        metrics.GLOBAL_BATCH_SIZE.set(samples)
        metrics.COMPRESSION_RATE.set(self.engine.compression_rate)
        metrics.WORKER_SAMPLES.set(len(mine) * self.engine.samples_per_virtual_node)
        metrics.LOSS.set(loss)
        self._count_update(result)
        self.journal.write(
            "step",
            step=self.step,
            generation=self.world.generation,
            rank=self.world.rank,
            world=self.world.size,
            vnodes=mine,
            batch=samples,
            loss=loss,
            compute_seconds=compute_seconds,
            skipped=result.skipped,
            overflow=result.overflow,
            lr=result.lr,
            grad_norm=result.grad_norm,
            loss_scale=result.loss_scale,
        )
        if self.progress is not None:
            # JSON has no NaN: a skipped step reports no loss rather than an unparsable document.
            reported_loss = loss if math.isfinite(loss) else None
            shape = metrics.StepShape(
                world_size=self.world.size,
                micro_batch=self.engine.samples_per_virtual_node,
                micro_batches=len(mine),
                step_seconds=seconds,
                compute_seconds=compute_seconds,
                noise_scale=self.engine.noise.noise_scale if self.engine.tracks_noise else None,
                rescale_pause_seconds=self.last_pause,
                compression_rate=self.engine.compression_rate if self.engine.rates else None,
            )
            report = self.progress.report(
                self.step,
                self.engine.position.samples_at(self.step),
                reported_loss,
                samples / max(seconds, 1e-9),
                self.engine.evaluation.report(),
                shape,
            )
            self.progress.maybe_report(report, force=self.step == self.total_steps)
            self._report_last_step()

    @staticmethod
    def _count_update(result: StepResult) -> None:
        if result.overflow:
            metrics.OVERFLOW_STEPS.inc()
        elif result.skipped:
            metrics.NONFINITE_STEPS.inc()
        if result.lr is not None:
            metrics.LEARNING_RATE.set(result.lr)
        if result.loss_scale is not None:
            metrics.LOSS_SCALE.set(result.loss_scale)

    def _evaluate(self) -> None:
        """The script's evaluation, on every worker, when this step is due (see :mod:`.evaluation`)."""
        evaluation = self.engine.evaluation
        if not evaluation.due(self.step, self.total_steps):
            return
        started = time.monotonic()
        values = evaluation.run(self.step)
        for name, value in values.items():
            metrics.EVAL.labels(metric=name).set(value)
        seconds = time.monotonic() - started
        self.journal.write("eval", step=self.step, rank=self.world.rank, metrics=values, seconds=seconds)

    def _report_last_step(self, force: bool = False) -> None:
        """Rank 0 keeps the job's newest step in the store, so a restart can count the steps it lost."""
        now = time.monotonic()
        if self.store is not None and (force or now - self._last_store_report >= 1.0):
            self._last_store_report = now
            try:
                self.store.set(self._last_step_key, str(self.step))
            except RuntimeError as error:  # torch's DistError: the store is gone
                self._store_unreachable(error)

    def _stop_asked(self) -> bool:
        """This worker asks its world to stop after this step: its pod leaves, its agent restarts it
        (both SIGTERM), or its agent wrote its next world."""
        return self.leave.requested or (self.next_world is not None and self.next_world.pending())

    def _next_world_together(self) -> World | None:
        """At a stop: this worker's next world when every member has its own (each then enters it in
        its process), else None and the world stops for a restart; decided in one sum by all."""
        mine = self.next_world if not self.leave.requested else None
        ready = self._members_saying(mine is not None and mine.pending())
        if 0 < ready < self.world.size:  # a peer's agent wrote its next world first: wait for ours
            ready = self._members_saying(mine is not None and mine.wait(world_switch.LAGGARD_WAIT_SECONDS))
        if mine is None or ready < self.world.size:
            if self.next_world is not None:
                self.next_world.discard()
            return None
        return mine.take()

    def _members_saying(self, yes: bool) -> int:
        count = torch.tensor([1.0 if yes else 0.0], device=self.comm_device)
        self.comm.all_reduce(count).wait()
        return int(count.item())

    def enter_next_world(self, world: World) -> int:
        """Leave this world's process group for the next one's, in this process, and train on there;
        a member lost before the new world trains hands the state over for a restart."""
        log.info("entering generation %d as rank %d of %d in place", world.generation, world.rank, world.size)
        # Held while the next world forms: the last reference's release tears the group down (gloo's
        # event loops stop, about 20 ms), on a thread of its own once the new group is up.
        retired = [dist.group.WORLD]
        dist.destroy_process_group()
        self._bind(world)
        try:
            join_process_group(self.config, self.backend, world)
            threading.Thread(target=retired.clear, name="old process group", daemon=True).start()
            self.engine.join_world(world.size)
            self.agree_on_state(live=True)
        except RuntimeError as error:
            log.warning("generation %d did not form (%s); the world re-forms", world.generation, error)
            self.hand_over()
            return EXIT_REFORM
        return self.train()

    def stop_for_new_world(self) -> int:
        """Someone asked to leave (or the agent must admit a newcomer): stop at this step boundary;
        ``ENTER_NEXT_WORLD`` when every member enters its next world in place (``self.entering``). A
        sharded world keeps its shards in the stayers' memory, a leaver's with its heir."""
        handoff = None
        try:
            self.entering = self._next_world_together()
            if self.entering is not None:
                return ENTER_NEXT_WORLD
            if self.copies is not None:
                leaving = self.leave.requested and (self.state_dir / state.LEAVING_MARKER).exists()
                handoff = self.copies.hand_over_at_stop(self.step, self.last_step_wall_time, leaving)
            if handoff is None and self.durable.sharded:  # every member of a sharded world leaves
                self.write_checkpoint()
            elif handoff is None:  # replicated, or sharded into an object store: the state whole
                self.write_checkpoint(self.hand_over())
        except ReductionFailed as error:
            self.hand_over_after_failure(error)
            return EXIT_REFORM
        if handoff:  # no checkpoint: the stayers hold every shard, and gathering costs a replica each
            state.write_atomic(state.to_bytes(handoff), self.state_dir / state.HANDOFF_FILE)
        if self.world.rank == 0:
            self._report_last_step(force=True)
        if self.leave.requested:
            (self.state_dir / state.LEFT_MARKER).touch()
            self.journal.write("left", step=self.step, generation=self.world.generation)
            return contract.EXIT_SUCCESS
        self.journal.write("reform", step=self.step, generation=self.world.generation)
        return EXIT_REFORM

    def stop_diverged(self) -> int:
        """Too many non-finite steps in a row: keep the last finite state and say why in the pod's status."""
        streak = self.engine.nonfinite_streak
        last_finite = self.step - streak
        why = (
            f"loss or gradient non-finite for {streak} consecutive steps "
            f"(steps {last_finite + 1}-{self.step}), the limit set by spec.maxNonFiniteSteps; "
            f"the parameters are those after step {last_finite}"
        )
        self.write_checkpoint()
        if self.world.rank == 0:
            self._report_last_step(force=True)
        write_termination_message(self.config.termination_message_path, why)
        log.error("stopping: %s", why)
        self.journal.write("diverged", step=self.step, last_finite_step=last_finite, streak=streak)
        return contract.EXIT_NONFINITE_LOSS

    def hand_over(self) -> dict[str, Any]:
        """Leave this node's state in node-local memory (shared memory in a pod) for the next world;
        the state left there. Collective when the state is sharded: every worker calls it."""
        snapshot = state.capture(self.engine, self.step, self.last_step_wall_time)
        state.write_atomic(state.to_bytes(snapshot), self.state_dir / state.HANDOFF_FILE)
        return snapshot

    def hand_over_after_failure(self, error: ReductionFailed) -> None:
        """A collective of this step failed: hand over the last step's state, which every worker
        holds whole, unless the state is sharded: then a peer's shard may be gone and nothing can be
        gathered."""
        if not self.engine.collective_state:
            log.warning("step %s failed (%s); handing over the state of step %s", self.step, error, self.step)
            self.hand_over()
            return
        if self.copies is not None and self.copies.every:
            log.warning(
                "step %s failed (%s); handing over this shard and its buddy copies", self.step + 1, error
            )
            handoff = self.copies.handoff(self.step, self.last_step_wall_time)
            state.write_atomic(state.to_bytes(handoff), self.state_dir / state.HANDOFF_FILE)
            return
        log.warning(
            "step %s failed (%s); no buddy copies (buddy_every=0, or a world of one): the next world "
            "resumes from the durable checkpoint",
            self.step + 1,
            error,
        )

    def _checkpoint(self) -> bool:
        """The durable checkpoint of this step; False when a peer was lost while a sharded one was
        written (this worker's state is handed over for the next world)."""
        try:
            self.write_checkpoint()
        except ReductionFailed as error:
            self.hand_over_after_failure(error)
            return False
        return True

    def write_checkpoint(self, captured: dict[str, Any] | None = None) -> None:
        """The durable checkpoint of ``captured``, else of the state now (every worker calls it)."""
        self.durable.write(self.step, self.last_step_wall_time, captured)


def join_process_group(config: TrainerConfig, backend: str, world: World) -> None:
    """This process's group for ``world``, bootstrapped from the store under its generation; counted
    ready there first, for the agents that switch running workers into it (:mod:`.world_switch`)."""
    store = generation_store(config, world.generation)
    store.add(world_switch.READY_KEY, 1)
    dist.init_process_group(
        backend,
        store=store,
        rank=world.rank,
        world_size=world.size,
        timeout=timedelta(seconds=config.collective_timeout),
    )
