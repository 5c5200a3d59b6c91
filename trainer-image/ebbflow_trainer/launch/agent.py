"""The elastic agent: torch's local agent, except that a worker exit no restart can cure ends it.

Torch restarts a failed worker group until ``max_restarts`` run out. A worker that exits with one of
``contract.FATAL_EXIT_REASONS`` (training diverged) would only replay the same failure, so the agent
stops at once and the launcher exits with the worker's code, which the operator reads from the pod.

For a newcomer, the agent joins the next round while its workers train on and, once that world's
workers are all ready, gives each its next world (:mod:`.world_switch`); else they restart.

After the pod's SIGTERM the agent gives the workers the leave grace (less the launcher's margin) to
exit, then kills them; `outlived_grace` says whether it had to (the launcher reports it). Workers get
SIGTERM for a restart into the next world too; `on_pod_leaving` runs first only when the pod leaves.

The trainer runs on torch >= 2.4 (a vendor's torch in the image's base, docs/images.md), and the
agent's constructor grew options since: `shutdown_option` passes only what the installed one takes.
"""

from __future__ import annotations

import inspect
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ebbflow_api import contract
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from ebbflow_trainer.launch import world_switch
from ebbflow_trainer.launch.rendezvous import GenerationRendezvousHandler
from ebbflow_trainer.launch.state import TRAINING_MARKER

log = logging.getLogger(__name__)

# What torch's agent gives its workers to exit after a signal where it takes no `shutdown_timeout`.
TORCH_FIXED_SHUTDOWN_SECONDS = 30


class ShutdownOption(TypedDict, total=False):
    shutdown_timeout: int


def shutdown_option(agent: type, seconds: int) -> ShutdownOption:
    """How long the workers get to exit after the pod's SIGTERM, as `agent`'s constructor takes it.
    An older torch's agent (2.11's, for one) takes no such option and gives them a fixed 30 s, which
    the pod's own grace period cuts short or the worker's handoff outlasts: said once in the log."""
    if "shutdown_timeout" in inspect.signature(agent).parameters:
        return {"shutdown_timeout": seconds}
    if seconds != TORCH_FIXED_SHUTDOWN_SECONDS:
        log.warning(
            "this torch's elastic agent gives workers a fixed %d s to exit after a signal, not the %d s "
            "the leave grace asks for (a newer torch takes it)",
            TORCH_FIXED_SHUTDOWN_SECONDS,
            seconds,
        )
    return {}


class FatalWorkerExit(Exception):
    """A worker exited with a code that no restart can cure."""

    def __init__(self, code: int):
        super().__init__(f"a worker exited {code} ({contract.FATAL_EXIT_REASONS[code]})")
        self.code = code


# Workers whose shutdown after SIGTERM took this close to its timeout were still running at its end.
OUTLIVED_MARGIN_S = 0.5


@dataclass
class InPlaceJoins:
    """What the agent needs to take a newcomer into its running world (:mod:`.world_switch`)."""

    handler: GenerationRendezvousHandler
    state_dirs: list[Path]  # each local worker's, by local rank
    ready_timeout: float  # how long the running world waits for the newcomer's worker to be built

    def possible(self) -> bool:
        """Nodes wait to join, no member was lost, and every local worker trains (not still bootstrapping
        its world) and said it can switch."""
        markers = (
            directory / marker
            for directory in self.state_dirs
            for marker in (world_switch.IN_PLACE_MARKER, TRAINING_MARKER)
        )
        return self.handler.newcomers_waiting and all(marker.exists() for marker in markers)


class EbbflowAgent(LocalElasticAgent):
    # The seconds the workers were given after SIGTERM and outlived (then killed); None if they exited.
    outlived_grace: int | None = None
    # Called before the workers get the pod's SIGTERM, not a restart's (their shards then go to heirs).
    on_pod_leaving: Callable[[], None] | None = None
    # Set for workers that can enter a next world in their process (the engine's, not a script).
    in_place: InPlaceJoins | None = None
    # True while the running workers' next round is joined (they keep their state directories' files).
    joining_in_place = False
    _restarting = False

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """A newcomer waits and the running workers can take it in place, or they restart into the next
        world as torch's agent does (a failure, a member lost, a script)."""
        joins = self.in_place if worker_group.state == WorkerState.HEALTHY else None
        if joins is not None and joins.possible() and self._join_in_place(worker_group, joins):
            return
        super()._restart_workers(worker_group)

    def _join_in_place(self, worker_group: WorkerGroup, joins: InPlaceJoins) -> bool:
        """Join the next round while the workers train, then give each its next world once all of that
        world's workers are ready; False when they must restart instead."""
        self.joining_in_place = True
        try:
            self._rendezvous(worker_group)
        finally:
            self.joining_in_place = False
        assert self._pcontext is not None
        pids = self._pcontext.pids()
        for worker in worker_group.workers:  # the same processes, with the ranks of the new world
            worker.id = pids[worker.local_rank]
        generation, total = joins.handler.generation, worker_group.workers[0].world_size
        deadline = time.monotonic() + joins.ready_timeout
        try:
            ready = joins.handler.count_ready(generation, len(worker_group.workers))
            while ready < total:
                exited = self._pcontext.wait(0)
                if exited is not None:  # finished (the monitor sees it) or failed (restart them)
                    return not exited.is_failed()
                if time.monotonic() >= deadline:
                    log.warning(
                        "generation %d: %d of %d workers ready after %.0f s; restarting into a later round",
                        generation,
                        ready,
                        total,
                        joins.ready_timeout,
                    )
                    return False
                time.sleep(world_switch.POLL_SECONDS)
                ready = joins.handler.count_ready(generation, 0)
        except RuntimeError as error:  # torch's DistError: the store went away
            log.warning("generation %d: the ready count is unreadable (%s); restarting", generation, error)
            return False
        for worker in worker_group.workers:
            next_world = world_switch.World(
                worker.global_rank, worker.world_size, generation, worker.local_rank
            )
            world_switch.write_next_world(joins.state_dirs[worker.local_rank], next_world)
        log.info("generation %d: every worker ready; %s", generation, world_switch.ENTERS_IN_PLACE_LOG)
        return True

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """A restart into the next world (a newcomer waits, a peer failed): the workers stay."""
        self._restarting = True
        try:
            super()._stop_workers(worker_group)
        finally:
            self._restarting = False

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        started = time.monotonic()
        if death_sig == signal.SIGTERM and not self._restarting and self.on_pod_leaving is not None:
            self.on_pod_leaving()
        super()._shutdown(death_sig, timeout)
        if death_sig == signal.SIGTERM and time.monotonic() - started >= timeout - OUTLIVED_MARGIN_S:
            self.outlived_grace = timeout

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        for failure in result.failures.values():
            if failure.exitcode in contract.FATAL_EXIT_REASONS:
                raise FatalWorkerExit(failure.exitcode)
        return result
