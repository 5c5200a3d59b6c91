"""The training process the elastic agent starts: one worker, through every world it trains in.

It builds the worker (the model, the data), joins its first world's process group, agrees on the
state and trains; a world that changes with every member running is entered in this same process
(:mod:`.world_switch`), any other change ends it with an exit code the agent acts on (see
:mod:`.worker`). A return hands the code to the agent through its result queue, which only a
finished run does; every other way out exits at once with ``os._exit``.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

import torch
from ebbflow_api import contract

from ebbflow_trainer import metrics
from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.worker import (
    ENTER_NEXT_WORLD,
    EXIT_REFORM,
    LeaveNow,
    LeaveSignal,
    Worker,
    join_process_group,
)
from ebbflow_trainer.launch.world_switch import World

log = logging.getLogger("ebbflow_trainer.launch.worker")


def run_worker(config_json: str, generation: int) -> int:
    """The agent's entrypoint, called in a process forked for one world (RANK, WORLD_SIZE in the env).

    Returning hands the exit code to the agent through its result queue, which only a finished run
    should do; every other outcome exits the process at once, so the agent sees the code immediately
    and nothing waits on interpreter teardown.
    """
    config = TrainerConfig.from_json(config_json)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # `kill -USR1 <pid>` prints every thread's stack: the first thing to look at when a world hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    leave = LeaveSignal()
    world = World(
        rank=int(os.environ["RANK"]),
        size=int(os.environ["WORLD_SIZE"]),
        generation=generation,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )
    code = _run(config, world, leave)
    if code == contract.EXIT_SUCCESS and not leave.requested:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(config: TrainerConfig, world: World, leave: LeaveSignal) -> int:
    local_dir = state.local_dir(Path(config.state_dir), world.local_rank)
    local_dir.mkdir(parents=True, exist_ok=True)
    try:
        worker = Worker(config, world, leave)
        if world.local_rank == 0:  # the pod's one metrics port
            metrics.serve(config.metrics_port)
        if worker.backend == "nccl":
            # A collective with a dead peer raises after --collective-timeout (and the world re-forms with
            # the state handed over) instead of hanging until the watchdog aborts the process.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        join_process_group(config, worker.backend, world)
        worker.engine.join_world(world.size)
        try:
            worker.agree_on_state()
        except RuntimeError as error:
            log.warning("state agreement failed (%s); the world re-forms", error)
            return EXIT_REFORM
        try:
            code = worker.train()
            while code == ENTER_NEXT_WORLD:
                assert worker.entering is not None
                code = worker.enter_next_world(worker.entering)
            # Every return from train() is at a step boundary with the state handed over or saved.
            (local_dir / state.TRAINING_MARKER).unlink(missing_ok=True)
            return code
        finally:
            worker.engine.close()  # loader processes: run_worker may leave with os._exit
    except LeaveNow:
        (local_dir / state.LEFT_MARKER).touch()
        return contract.EXIT_SUCCESS
