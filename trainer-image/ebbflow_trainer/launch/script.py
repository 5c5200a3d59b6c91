"""The training process for a torchrun script (``ebbflow-train torchrun``): the script runs as
``__main__`` with what torchrun gives its workers (the agent sets RANK, WORLD_SIZE and the rest), one
world at a time. Two values differ from torch's agent (docs/trainer.md, "An unmodified torchrun
script"): MASTER_ADDR/MASTER_PORT name a fresh store that each world's rank 0 serves (the job's store
serves every world, where a process group would meet an earlier world's keys), every rank its client
as of an agent's store; TORCHELASTIC_RESTART_COUNT counts the worlds before this one, the same on
every worker.

A failure no restart can cure ends the job, said in rank 0's termination message: the script failed
while the world's store held no key (no rank began its process group: its own error) exits
``contract.EXIT_SCRIPT_FAILED``; it returned in a world of several without using that store (never
called ``init_process_group()``) exits ``contract.EXIT_INVALID_CONFIG``.

Invariant: rank 0's process holds the world's store; after a successful script it exits only once
every rank's script returned (or ``STORE_LINGER_SECONDS`` passed).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

from ebbflow_api import contract
from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch.liveness import node_address
from ebbflow_trainer.launch.rendezvous import generation_store
from ebbflow_trainer.termination import write_termination_message

# The configuration the launcher resolved, for `ebbflow_trainer.elastic` inside the script.
ENV_TRAINER_CONFIG = "EBBFLOW_TRAINER_CONFIG"
_ADDRESS_KEY = "script/master"
_FINISHED_KEY = "script/finished"
STORE_LINGER_SECONDS = 30.0
log = logging.getLogger(__name__)


def world_store_address(
    config: TrainerConfig, job_store: Store, rank: int
) -> tuple[str, int, TCPStore | None]:
    """Rank 0 serves the world's store and publishes where; the others read it. Returns the address
    and, on rank 0, the server (kept alive for as long as the script runs)."""
    if rank != 0:
        host, _, port = job_store.get(_ADDRESS_KEY).decode().rpartition(":")
        return host, int(port), None
    server = TCPStore(
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=config.store_timeout)
    )
    host = node_address(config.node_addr)
    job_store.set(_ADDRESS_KEY, f"{host}:{server.port}")
    return host, server.port, server


def script_environment(config: TrainerConfig, generation: int, host: str, port: int) -> dict[str, str]:
    """What this world's script finds in its environment beyond what the agent set."""
    return {
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": str(True),
        "TORCHELASTIC_RESTART_COUNT": str(generation - 1),
        contract.ENV_WORLD_GENERATION: str(generation),
        ENV_TRAINER_CONFIG: config.to_json(),
    }


def exit_code_of(exit: SystemExit) -> int:
    """The process exit status `sys.exit(value)` would give."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


@dataclass(frozen=True)
class ScriptExit:
    code: int
    why: str  # the exception's last line, or the exit status, for the termination message


def run_path(script: str, args: tuple[str, ...]) -> ScriptExit:
    """Run ``script`` as ``__main__`` with ``args`` as its command line; how it ended."""
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        code = exit_code_of(exit)
        return ScriptExit(code, exit.code if isinstance(exit.code, str) else f"exited {code}")
    except BaseException as error:
        traceback.print_exc()
        return ScriptExit(1, traceback.format_exception_only(error)[-1].strip())
    return ScriptExit(0, "returned")


def fatal_exit(ended: ScriptExit, world_size: int, store_used: bool | None) -> tuple[int, str] | None:
    """The exit code and message that end the job when the way the script ended is its own fault.
    ``store_used``: whether any rank used the world's store (a process group formed there); None
    on the ranks that do not hold it."""
    if ended.code != contract.EXIT_SUCCESS and store_used is False:
        return contract.EXIT_SCRIPT_FAILED, (
            f"the training script failed before it joined its world's process group ({ended.why}): "
            "an error of its own, which a restart would repeat; fix the script or its arguments"
        )
    if ended.code == contract.EXIT_SUCCESS and world_size > 1 and store_used is False:
        return contract.EXIT_INVALID_CONFIG, (
            f"the training script returned in a world of {world_size} without ever calling "
            "torch.distributed.init_process_group(): each worker trained alone; call it (the default "
            "env:// method reads what ebbflow-train torchrun sets), or run the job with replicas.max 1"
        )
    return None


def _wait_for_every_rank(job_store: Store, world_size: int) -> None:
    """Rank 0 holds the world's store: keep it until every rank's script has returned."""
    deadline = time.monotonic() + STORE_LINGER_SECONDS
    while time.monotonic() < deadline:
        if int(job_store.add(_FINISHED_KEY, 0)) >= world_size:
            return
        time.sleep(0.05)
    log.warning("not every rank finished within %.0f s; closing the world's store", STORE_LINGER_SECONDS)


def run_script(config_json: str, generation: int) -> int:
    """The agent's entrypoint for one world: set the environment up, run the script, report its exit."""
    config = TrainerConfig.from_json(config_json)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    job_store = generation_store(config, generation)
    host, port, server = world_store_address(config, job_store, rank)
    os.environ.update(script_environment(config, generation, host, port))
    ended = run_path(config.spec, config.script_args)
    code = ended.code
    # Rank 0 holds the world's store, so it alone can tell; its pod's exit code fails the job.
    fatal = fatal_exit(ended, world_size, None if server is None else server.num_keys() > 0)
    if fatal is not None:
        code, why = fatal
        log.error("%s", why)
        write_termination_message(config.termination_message_path, why)
    try:
        job_store.add(_FINISHED_KEY, 1)
        # A failed script's world is over (a peer lost, or this rank broke it): nobody needs its store.
        if server is not None and code == contract.EXIT_SUCCESS:
            _wait_for_every_rank(job_store, world_size)
    except RuntimeError as error:  # torch's DistError: the job's store is gone; the script is done
        log.warning("could not record the script's end in the job's store: %s", error)
    sys.stdout.flush()
    sys.stderr.flush()
    if code == contract.EXIT_SUCCESS:
        return code
    os._exit(code)
