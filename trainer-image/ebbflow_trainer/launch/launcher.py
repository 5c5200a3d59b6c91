"""``ebbflow-train run`` and ``torchrun``: one torch elastic agent per worker pod, ``--nproc-per-node``
processes under it (one per GPU) running the engine's worker (:mod:`.worker`) or the user's script.

The agent joins the job's c10d rendezvous (served by the rendezvous pod) and restarts its workers
when the world changes (``run``'s take a newcomer in place, :mod:`.agent`). SIGTERM (pod deletion)
reaches the workers, which finish their step, hand their state over and exit 0; workers still
running when the leave grace runs out are killed, and the launcher exits
``contract.EXIT_LEAVE_TIMED_OUT`` saying why. A lost store is waited for (see :mod:`.rendezvous`);
if none answers within ``--store-loss-timeout`` the workers stop at a step boundary (rank 0
checkpoints) and the launcher exits ``EXIT_STORE_LOST``.

Invariants: the rendezvous is never closed while the job trains, so a pod that leaves does not end
the job for the others (pytorch/pytorch#67742); once the world has trained to the last step its
agents close it and a node still waiting to join exits 0; a worker exit no restart can cure
(``contract.FATAL_EXIT_REASONS``) becomes the launcher's exit code.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from ebbflow_api import contract

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import warm_forkserver
from ebbflow_trainer.termination import write_termination_message

if TYPE_CHECKING:
    from torch.distributed.elastic.agent.server.api import WorkerSpec

    from ebbflow_trainer.launch.agent import EbbflowAgent
    from ebbflow_trainer.launch.object_checkpoints import Uploader
    from ebbflow_trainer.launch.rendezvous import GenerationRendezvousHandler

# Seconds of the pod's grace period the launcher keeps for itself after its workers' shutdown.
LAUNCHER_MARGIN_S = 5
# How long a launcher whose training ended waits for its last checkpoint's upload.
UPLOAD_DRAIN_S = 300.0
# A rendezvous store lost for longer than --store-loss-timeout: a real failure (the operator replaces
# the pod until maxRestarts), not a preemption.
EXIT_STORE_LOST = 1
log = logging.getLogger(__name__)


class Markers:
    """The LEFT and TRAINING markers of the pod's workers, one pair per local rank (see :mod:`.state`)."""

    def __init__(self, state_dir: Path, nproc_per_node: int):
        from ebbflow_trainer.launch.state import LEAVING_MARKER, LEFT_MARKER, TRAINING_MARKER, local_dir

        directories = [local_dir(state_dir, r) for r in range(nproc_per_node)]
        for directory in directories:
            directory.mkdir(parents=True, exist_ok=True)
        self.left = [directory / LEFT_MARKER for directory in directories]
        self.training = [directory / TRAINING_MARKER for directory in directories]
        self.leaving = [directory / LEAVING_MARKER for directory in directories]
        self.clear()  # a launcher starts with none: those on the volume are an earlier process's

    def clear(self) -> None:
        for marker in (*self.left, *self.training, *self.leaving):
            marker.unlink(missing_ok=True)

    def mark_leaving(self) -> None:
        """The pod leaves: its workers' SIGTERM is a leave, not a restart into the next world."""
        for marker in self.leaving:
            marker.touch()

    def graceful(self) -> bool:
        """Leaving loses nothing: every worker finished its step and left, or was not inside a step."""
        return all(
            left.exists() or not training.exists()
            for left, training in zip(self.left, self.training, strict=True)
        )


def _prepare_process(config: TrainerConfig, preload_script: bool) -> None:
    """Logging, torch elastic's environment switches and the workers' forkserver, before the agent."""
    import multiprocessing

    from ebbflow_trainer.launch.preload import ENV_PRELOAD_SCRIPT

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("torch.distributed.elastic").setLevel(logging.INFO)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Workers bootstrap from the rendezvous store; no agent needs to host a store of its own.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Every pod runs the same --nproc-per-node: global rank = node rank x N + local rank, world size =
    # nodes x N, without an extra store round-trip. Pods with different N would get wrong ranks.
    os.environ["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Workers are forked from a forkserver that has already imported torch and the TrainingSpec script
    # (a torchrun script is not imported ahead: its module code is the training); the forkserver
    # itself is forked from this process, which imported torch already (warm_forkserver).
    os.environ[ENV_PRELOAD_SCRIPT] = config.spec if preload_script else ""
    multiprocessing.get_context("forkserver").set_forkserver_preload(["ebbflow_trainer.launch.preload"])
    warm_forkserver.start()


def run(config: TrainerConfig, torchrun: bool = False) -> int:
    """Run the elastic agent until training finishes, this pod leaves, or restarts run out; each
    world's workers run the engine (``torchrun`` False) or the torchrun script ``config.spec``."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousClosedError

    from ebbflow_trainer.launch.agent import FatalWorkerExit
    from ebbflow_trainer.launch.rendezvous import GenerationRendezvousHandler, StoreLost
    from ebbflow_trainer.launch.script import run_script
    from ebbflow_trainer.launch.worker_process import run_worker

    _prepare_process(config, preload_script=not torchrun)
    markers = Markers(Path(config.state_dir), config.nproc_per_node)
    uploader = None if torchrun else _start_uploader(config)
    drain_seconds = UPLOAD_DRAIN_S
    handler = GenerationRendezvousHandler(config)
    spec = WorkerSpec(
        role="trainer",
        local_world_size=config.nproc_per_node,
        rdzv_handler=handler,
        entrypoint=run_script if torchrun else run_worker,
        args=(config.to_json(), 0),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
    )

    agent = _new_agent(config, spec, markers, handler, torchrun)

    def start_generation(generation: int) -> None:
        """The agent reads ``spec.args`` when it starts a world's workers, right after the round."""
        spec.args = (config.to_json(), generation)
        if not agent.joining_in_place:  # running workers keep their markers
            markers.clear()

    handler.on_generation = start_generation

    def leave_when_asked(signum: int, frame: object) -> None:
        """From the entrypoint's "stopped before joining" on (torch installs its own only once workers
        start): a pod deleted during the first rendezvous leaves it (`handler.leave`), not just exits."""
        raise SignalException(f"process {os.getpid()} got signal {signum}", sigval=signal.Signals(signum))

    signal.signal(signal.SIGTERM, leave_when_asked)
    try:
        result = agent.run()
        if result is None or result.state == WorkerState.SUCCEEDED:
            handler.close_finished()
    except RendezvousClosedError:
        log.info("the job finished while this node waited to join its world: nothing left to train")
        return contract.EXIT_SUCCESS
    except SignalException as signalled:
        handler.leave()
        drain_seconds = LAUNCHER_MARGIN_S - 1  # what the pod's grace has left
        if signalled.sigval == signal.SIGTERM and agent.outlived_grace is not None:
            return _left_late(config, agent.outlived_grace, torchrun)
        if signalled.sigval == signal.SIGTERM and markers.graceful():
            return contract.EXIT_SUCCESS
        return 128 + int(signalled.sigval)
    except FatalWorkerExit as fatal:
        log.error("%s: not restarting", fatal)
        return fatal.code
    except StoreLost as lost:
        why = f"{lost}; the workers stopped at a step boundary with their state handed over"
        log.error("stopping: %s", why)
        write_termination_message(config.termination_message_path, why)
        return EXIT_STORE_LOST
    finally:
        # Before the interpreter exits: see GenerationRendezvousHandler.stop_heartbeats.
        handler.close()
        if uploader is not None:
            _finish_uploads(uploader, drain_seconds)
    # None: torch's agent swallowed a graceful exit from a closed rendezvous (a node that waited as a
    # spare in a full world): the job is done.
    return contract.EXIT_SUCCESS if result is None or result.state == WorkerState.SUCCEEDED else 1


def _new_agent(
    config: TrainerConfig,
    spec: WorkerSpec,
    markers: Markers,
    handler: GenerationRendezvousHandler,
    torchrun: bool,
) -> EbbflowAgent:
    """The pod's agent: the workers get the pod's grace period less a margin for it to exit; the
    engine's running workers take a newcomer in place (a script's restart)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    from ebbflow_trainer.launch.agent import EbbflowAgent, InPlaceJoins, shutdown_option
    from ebbflow_trainer.launch.state import local_dir

    agent = EbbflowAgent(
        spec,
        logs_specs=DefaultLogsSpecs(),
        start_method="forkserver",
        exit_barrier_timeout=config.collective_timeout,
        **shutdown_option(EbbflowAgent, max(1, config.leave_grace_seconds - LAUNCHER_MARGIN_S)),
    )
    agent.on_pod_leaving = markers.mark_leaving
    if not torchrun:
        state_dirs = [local_dir(Path(config.state_dir), rank) for rank in range(config.nproc_per_node)]
        agent.in_place = InPlaceJoins(handler, state_dirs, ready_timeout=config.collective_timeout)
    return agent


def _start_uploader(config: TrainerConfig) -> Uploader | None:
    """The thread that uploads rank 0's snapshots when checkpoints go to an object store."""
    from ebbflow_trainer.launch.journal import Journal
    from ebbflow_trainer.launch.object_checkpoints import Uploader, from_config

    checkpoints = from_config(config, os.environ)
    if checkpoints is None:
        return None
    uploader = Uploader(
        checkpoints, Path(config.state_dir), config.checkpoint_retain, Journal(config.journal)
    )
    uploader.start()
    return uploader


def _finish_uploads(uploader: Uploader, seconds: float) -> None:
    """The last snapshot committed before the launcher exits, if it can be within `seconds`."""
    if not uploader.drain(seconds):
        log.error(
            "the last checkpoint was not uploaded within %.0f s; the job resumes from the one before it "
            "(raise spec.leaveGraceSeconds to give the upload more time)",
            seconds,
        )
    uploader.stop()


def _left_late(config: TrainerConfig, grace: int, torchrun: bool) -> int:
    """The workers outlived the leave grace and were killed: said in the termination message."""
    fix = (
        "a script that takes the stop flag must call ebbflow_trainer.elastic.should_stop() once per step "
        "and elastic.stop() as soon as it returns True"
        if torchrun
        else "the step and the state's handoff took longer than that"
    )
    why = (
        f"the training processes did not stop within {grace} s of SIGTERM (spec.leaveGraceSeconds="
        f"{config.leave_grace_seconds} less {LAUNCHER_MARGIN_S} s for the launcher) and were killed: {fix}, "
        "or raise spec.leaveGraceSeconds; the next world resumes from the last state they saved"
    )
    log.error("%s", why)
    write_termination_message(config.termination_message_path, why)
    return contract.EXIT_LEAVE_TIMED_OUT
