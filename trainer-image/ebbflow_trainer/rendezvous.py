"""The job's rendezvous: a store served by its own process, and the handler the elastic agents use.

Stock torchrun hosts the c10d store inside the first agent (its death ends the job) and hands workers
a bootstrap store on the rank-0 agent that it caches for the agent's lifetime, so after rank 0 dies the
survivors keep dialling a dead address. Here the store lives in the rendezvous pod
(``ebbflow-train rendezvous``) and workers bootstrap every world from it, under a generation number
that the agents of one rendezvous round agree on.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

# torch re-exports its store classes from a C extension without declaring them public to type checkers.
from torch.distributed import DistStoreError, PrefixStore, Store, TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

from ebbflow_trainer.config import TrainerConfig

log = logging.getLogger(__name__)
_GENERATION_COUNTER = "ebbflow/generation-counter"
_ROUND_GENERATION = "ebbflow/generation"


def serve(host: str, port: int, port_file: str | None) -> int:
    """Serve the job's store until SIGTERM/SIGINT; the store outlives every worker."""
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if port_file:
        written = Path(port_file)
        temporary = written.with_name(written.name + ".tmp")
        temporary.write_text(str(store.port))
        os.replace(temporary, written)
    print(f"ebbflow rendezvous store serving on {host}:{store.port}", flush=True)
    stop.wait()
    return 0


def connect(config: TrainerConfig, timeout: float) -> TCPStore:
    return TCPStore(
        config.rdzv_host,
        config.rdzv_port,
        is_master=False,
        timeout=timedelta(seconds=timeout),
    )


def generation_store(config: TrainerConfig, generation: int) -> Store:
    """The store one world's workers bootstrap their process group from (never reused by a later world)."""
    base = connect(config, config.store_timeout)
    return PrefixStore(f"ebbflow/{config.rdzv_id}/generation/{generation}", base)


class GenerationRendezvousHandler(RendezvousHandler):
    """Torch's dynamic c10d rendezvous, plus a job-wide generation number for every completed round."""

    def __init__(self, config: TrainerConfig):
        # Called with each completed round's generation, before the agent starts that world's workers.
        self.on_generation: Callable[[int], None] = lambda generation: None
        self._store = connect(config, config.store_timeout)
        backend = C10dRendezvousBackend(self._store, config.rdzv_id)
        self._delegate = DynamicRendezvousHandler.from_backend(
            run_id=config.rdzv_id,
            store=self._store,
            backend=backend,
            min_nodes=config.min_replicas,
            max_nodes=config.max_replicas,
            local_addr=config.node_addr or None,
            timeout=RendezvousTimeout(
                join=timedelta(seconds=config.join_timeout),
                last_call=timedelta(seconds=config.last_call_timeout),
                close=timedelta(seconds=30),
                heartbeat=timedelta(seconds=config.keep_alive_interval * config.keep_alive_max_attempt),
            ),
            # Torch types this as int seconds but only ever passes it to timedelta(seconds=...).
            keep_alive_interval=config.keep_alive_interval,  # type: ignore[arg-type]
            keep_alive_max_attempt=config.keep_alive_max_attempt,
        )
        self._bootstrap = RendezvousStoreInfo(master_addr=config.rdzv_host, master_port=config.rdzv_port)
        self._join_timeout = config.join_timeout

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round; if its rank 0 dies before publishing the round's keys, join another.

        Right after a round completes, its rank 0 publishes torch's bootstrap address and our
        generation number, and the others wait for them. A rank 0 killed in that instant (preemption,
        a peer's SIGKILL) would make every other agent crash with a store timeout and its pod exit 1,
        a failure the operator counts; instead they leave that round and join the next, which forms
        without the dead node once its heartbeats expire, as after any failed world.
        """
        deadline = time.monotonic() + self._join_timeout
        while True:
            try:
                return self._join_round()
            except DistStoreError as error:
                if time.monotonic() >= deadline:
                    raise
                log.warning("the round's rank 0 never published its keys (%s); joining the next round", error)

    def _join_round(self) -> RendezvousInfo:
        info = self._delegate.next_rendezvous()
        round_store = info.store
        if info.rank == 0:
            generation = self._store.add(_GENERATION_COUNTER, 1)
            round_store.set(_ROUND_GENERATION, str(generation))
        self.on_generation(int(round_store.get(_ROUND_GENERATION).decode()))
        return RendezvousInfo(round_store, info.rank, info.world_size, self._bootstrap)

    def leave(self) -> None:
        """Drop this node from the rendezvous now, so the others need not wait for its heartbeats to expire.

        Torch has no public call for this (``shutdown`` closes the rendezvous for everyone), so this
        uses the handler's own exit operation; if torch's internals change it only logs, and the others
        notice the departure after ``keep_alive_interval * keep_alive_max_attempt`` as before.
        """
        try:
            from torch.distributed.elastic.rendezvous import dynamic_rendezvous

            self.stop_heartbeats()
            exit_op = dynamic_rendezvous._RendezvousExitOp()
            self._delegate._op_executor.run(exit_op, time.monotonic() + 10)
        except Exception as error:  # best effort by design, see the docstring
            log.warning("could not leave the rendezvous early (%s); peers wait for heartbeat expiry", error)

    def stop_heartbeats(self) -> None:
        """Stop and join the keep-alive thread; every agent must call this before its interpreter exits.

        Torch runs the heartbeats in a daemon thread that it deliberately leaves running at exit. Each
        heartbeat is a store call made with the GIL released; if the interpreter finalizes meanwhile,
        the thread is torn down by ``pthread_exit`` on its way back into Python, the forced unwind hits
        pybind11's ``noexcept`` GIL guard, and ``std::terminate`` aborts the process (exit 134,
        "terminate called without an active exception") after a run that succeeded.
        """
        self._delegate._stop_heartbeats()

    def get_backend(self) -> str:
        return str(self._delegate.get_backend())

    @property
    def use_agent_store(self) -> bool:
        return False

    def is_closed(self) -> bool:
        return bool(self._delegate.is_closed())

    def set_closed(self) -> None:
        self._delegate.set_closed()

    def num_nodes_waiting(self) -> int:
        return int(self._delegate.num_nodes_waiting())

    def get_run_id(self) -> str:
        return str(self._delegate.get_run_id())

    def shutdown(self) -> bool:
        return bool(self._delegate.shutdown())
