"""The training process for a torchrun script (``ebbflow-train torchrun``): the script runs as
``__main__`` with the environment torchrun gives its workers, one world at a time.

The elastic agent sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK and the rest before
this runs. Two values differ from what the agent would give:

- MASTER_ADDR/MASTER_PORT: the agent points them at the job's rendezvous store, which serves every
  world of the job, where a script's process group would meet the keys of earlier worlds. Each world's
  rank 0 hosts a fresh store instead, before the script starts (so no port can be taken meanwhile),
  publishes its address under the world's generation in the job's store, and every rank connects to
  it as torch's workers connect to an agent's store (TORCHELASTIC_USE_AGENT_STORE).
- TORCHELASTIC_RESTART_COUNT: the worlds the job had before this one (generation - 1), the same on
  every worker, where torch counts each agent's own failed restarts.

Invariant: when its script succeeded, rank 0's process, which holds that store, exits only after every
rank's script returned (or ``STORE_LINGER_SECONDS`` passed), so no rank loses the store during its
last collective.
"""

from __future__ import annotations

import logging
import os
import runpy
import socket
import sys
import time
import traceback
from datetime import timedelta

from ebbflow_api import contract
from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch.rendezvous import generation_store

# The configuration the launcher resolved, for `ebbflow_trainer.elastic` inside the script.
ENV_TRAINER_CONFIG = "EBBFLOW_TRAINER_CONFIG"
_ADDRESS_KEY = "script/master"
_FINISHED_KEY = "script/finished"
STORE_LINGER_SECONDS = 30.0
log = logging.getLogger(__name__)


def node_address(config: TrainerConfig) -> str:
    """The address the other workers reach this node at: --node-addr, else the IP its hostname
    resolves to (a pod's own IP, from the hosts file the kubelet writes)."""
    return config.node_addr or socket.gethostbyname(socket.gethostname())


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
    host = node_address(config)
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


def run_path(script: str, args: tuple[str, ...]) -> int:
    """Run ``script`` as ``__main__`` with ``args`` as its command line; its exit status."""
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        return exit_code_of(exit)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


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
    code = run_path(config.spec, config.script_args)
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
