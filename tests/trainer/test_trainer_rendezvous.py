"""Trainer tier: the generation rendezvous against a real c10d store and torch's real dynamic rendezvous.

Two nodes in one process (each a real handler with its own heartbeats): in the first test one plays a
node that completes a round as its rank 0 and dies before publishing the round's keys; in the second,
a running node whose heartbeats stall while a newcomer joins. The third puts a proxy between a node
and its store that stops carrying packets, as a network partition does.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from contextlib import suppress
from datetime import timedelta
from typing import Any

from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_config import trainer_config
from ebbflow_devtools.waiting import wait_for
from ebbflow_trainer.launch.rendezvous import HUNG_CALL_GRACE, GenerationRendezvousHandler
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

HEARTBEAT, MISSED = 0.5, 3
STORE_TIMEOUT = 3.0


class Partition:
    """A TCP proxy to a store that can stop carrying packets, as a network partition does: while cut,
    open connections carry nothing (calls on them hang) and nothing listens for new ones."""

    def __init__(self, target_port: int):
        self._cut = threading.Event()
        self._target = target_port
        # Out of the ephemeral range: while cut, no client socket can take the port heal() binds again.
        self.port = free_port()
        self.heal()

    def cut(self) -> None:
        self._cut.set()
        self._listener.shutdown(socket.SHUT_RDWR)  # stops listening now and wakes the accept()
        self._listener.close()

    def heal(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))  # the same port again
        self._cut.clear()
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        with suppress(OSError):  # closed by cut()
            while True:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._target))
                threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        while True:
            readable, _, _ = select.select([a, b], [], [], 0.1)
            if self._cut.is_set():
                continue
            for source in readable:
                data = source.recv(65536)
                if not data:
                    return
                (b if source is a else a).sendall(data)


def _torch_node(store: TCPStore, run_id: str) -> DynamicRendezvousHandler:
    """A plain torch node: it joins rounds but never publishes Ebbflow's generation number."""
    return DynamicRendezvousHandler.from_backend(
        run_id=run_id,
        store=store,
        backend=C10dRendezvousBackend(store, run_id),
        min_nodes=1,
        max_nodes=2,
        timeout=RendezvousTimeout(
            join=timedelta(seconds=60),
            last_call=timedelta(seconds=2),
            heartbeat=timedelta(seconds=HEARTBEAT * MISSED),
        ),
        keep_alive_interval=HEARTBEAT,  # type: ignore[arg-type]
        keep_alive_max_attempt=MISSED,
    )


def _generation_node(port: int, run_id: str, max_replicas: int = 2) -> GenerationRendezvousHandler:
    return GenerationRendezvousHandler(
        trainer_config(
            rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_id=run_id,
            min_replicas=1,
            max_replicas=max_replicas,
            last_call_timeout=2.0,
            keep_alive_interval=HEARTBEAT,
            keep_alive_max_attempt=MISSED,
            store_timeout=STORE_TIMEOUT,
            join_timeout=60.0,
        )
    )


def test_a_rank_zero_that_dies_before_publishing_the_round_does_not_crash_the_others() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    run_id = "rank-zero-dies"
    client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    doomed = _torch_node(client, run_id)  # created first: the lower node id, rank 0 of a shared round
    survivor = _generation_node(server.port, run_id)
    generations: list[int] = []
    survivor.on_generation = generations.append
    doomed_round: dict[str, Any] = {}

    def join_and_die() -> None:
        info = doomed.next_rendezvous()
        doomed_round.update(rank=info.rank, world_size=info.world_size)
        doomed._stop_heartbeats()  # dead: no heartbeats, no exit from the round, no generation key

    thread = threading.Thread(target=join_and_die)
    thread.start()
    try:
        info = survivor.next_rendezvous()
    finally:
        thread.join(timeout=60)
        survivor.stop_heartbeats()
    assert doomed_round == {"rank": 0, "world_size": 2}, "the scenario needs the doomed node as rank 0"
    # The survivor waited for the dead rank 0's keys, gave up on that round and formed the next alone.
    assert (info.rank, info.world_size) == (0, 1)
    assert generations == [1]


def test_a_node_dropped_for_missed_heartbeats_rejoins_instead_of_training_on_alone() -> None:
    """The split brain once seen on a loaded e2e cluster, at the handler: a running node's heartbeats
    stall past the budget while a newcomer waits, the newcomer drops it and forms a world of its own;
    when the stalled node's agent next asks, it must hear "re-form", and both then form one world."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    run_id = "dropped-node"
    stalled = _generation_node(server.port, run_id)
    assert stalled.next_rendezvous().world_size == 1
    stalled.stop_heartbeats()  # its agent stalls: no heartbeat, no store call
    newcomer = _generation_node(server.port, run_id)
    try:
        alone = newcomer.next_rendezvous()  # waits for a place, drops the stalled node, forms alone
        assert (alone.rank, alone.world_size) == (0, 1)
        assert stalled.num_nodes_waiting() >= 1, "the dropped node would train on in a world of its own"

        rejoined: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: rejoined.update(info=stalled.next_rendezvous()))
        thread.start()
        wait_for(lambda: newcomer.num_nodes_waiting() >= 1, 30, "the newcomer sees it waiting")
        together = newcomer.next_rendezvous()
        thread.join(timeout=60)
        assert together.world_size == rejoined["info"].world_size == 2
    finally:
        stalled.stop_heartbeats()
        newcomer.stop_heartbeats()


def test_a_store_connection_that_stops_carrying_packets_is_dropped_and_the_world_re_forms() -> None:
    """TCPStore calls on such a connection outlive their timeout (the heartbeat thread hung in one,
    holding the lock the agent's poll needs): the poll must come back within its bound, take the
    store for lost (the world trains on), and once packets flow again ask for a new world."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    partition = Partition(server.port)
    node = _generation_node(partition.port, "partitioned")
    generations: list[int] = []
    node.on_generation = generations.append
    try:
        assert node.next_rendezvous().world_size == 1
        partition.cut()
        # The agent polls; torch's handler answers from a cached state for a second, then asks the
        # store, and that poll (or its heartbeat thread, holding the lock) meets the cut connection.
        polls: list[float] = []
        deadline = time.monotonic() + 60
        while not polls or polls[-1] < STORE_TIMEOUT:
            assert time.monotonic() < deadline, f"no poll met the cut connection: {polls}"
            started = time.monotonic()
            assert node.num_nodes_waiting() == 0, "while the store is unreachable the world trains on"
            polls.append(time.monotonic() - started)
        assert polls[-1] < STORE_TIMEOUT + HUNG_CALL_GRACE + 5, f"the poll hung with the connection: {polls}"
        partition.heal()
        assert node.num_nodes_waiting() == 1, "a store answering again must re-form the world"
        assert node.next_rendezvous().world_size == 1
        assert generations == [1, 2]
    finally:
        node.stop_heartbeats()
