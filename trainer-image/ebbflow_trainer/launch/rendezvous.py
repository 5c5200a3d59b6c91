"""The job's rendezvous: a store served by its own process, and the handler the elastic agents use.

The store lives in the rendezvous pod (``ebbflow-train rendezvous``), not inside an agent, and
workers bootstrap every world from it under a generation number the agents of one round agree on.
:class:`GenerationRendezvousHandler` survives the store's loss (it probes the address anew and
joins a round of the replacement; :class:`StoreLost` after ``--store-loss-timeout``), reports a
waiting node when its node or another member left the world, and bounds the agent's poll so that a
store call that never returns is taken for a lost connection (``HUNG_CALL_GRACE``).

Invariants: generation numbers only increase over the job's life, whatever store hands them out;
nothing the old store held is needed to continue (the workers' state is in their own memory); while
no store answers, each call from the agent costs it at most one probe (``PROBE_TIMEOUT``).
Rounds join through :mod:`.membership`: no last call once the members are known, a dead node removed
on evidence (its liveness port refused) rather than after its heartbeats.
Why each of these, and what was seen without them: docs/design/rendezvous.md.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from ebbflow_api import contract

# torch re-exports its store classes from a C extension without declaring them public to type checkers.
from torch.distributed import (  # type: ignore[attr-defined]
    DistNetworkError,
    DistStoreError,
    PrefixStore,
    Store,
    TCPStore,
)
from torch.distributed.elastic.rendezvous import RendezvousHandler, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInfo,
    RendezvousStoreInfo,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

from ebbflow_trainer.config import ConfigError, TrainerConfig
from ebbflow_trainer.launch import declarations, liveness, membership, world_switch
from ebbflow_trainer.launch.journal import Journal

log = logging.getLogger(__name__)
_ROUND_GENERATION = "ebbflow/generation"
# A store call failing with one of these means the store process is gone (torch wraps the client's
# DistNetworkError in RendezvousConnectionError); a DistStoreError alone is a key that never came.
STORE_LOST_ERRORS = (DistNetworkError, RendezvousConnectionError)
# Seconds a probe of the rendezvous address may take, and between probes while a launcher waits.
PROBE_TIMEOUT = 1.0
PROBE_INTERVAL = 0.5
# Connecting a client once a probe succeeded: the address answers, so this is only the handshake.
CONNECT_TIMEOUT = 10.0
# Seconds beyond the store timeout that the agent's poll of torch's handler may take before its
# connection is taken for hung (see the module docstring).
HUNG_CALL_GRACE = 5.0


def method_name(depth: int = 2) -> str:
    """What torch's ``dynamic_rendezvous.get_method_name(depth)`` returns, the name of the function
    ``depth`` frames up, read from the frame instead of ``inspect.stack()`` (see the module docstring)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


dynamic_rendezvous.get_method_name = method_name


class StoreLost(Exception):
    """No store answered at the rendezvous address within ``--store-loss-timeout`` of its loss."""


class StoreCallHung(Exception):
    """A call into the store outlived its own timeout: its connection carries nothing any more."""


def call_with_bound(call: Callable[[], int], seconds: float, what: str) -> int:
    """``call()``'s result, or StoreCallHung once it has run ``seconds``; it then runs on, forgotten,
    in a daemon thread (a call blocked in C++ cannot be interrupted)."""
    outcome: list[int | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # handed to the caller below
            outcome.append(error)
        done.set()

    threading.Thread(target=run, name=f"bounded {what}", daemon=True).start()
    if not done.wait(seconds):
        raise StoreCallHung(f"{what} did not return within {seconds:.0f} s")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def probe_store(host: str, port: int) -> OSError | None:
    """Why nothing accepts TCP connections at the address (None: something does). A bare connect,
    closed at once: a TCPStore client would wait out its whole timeout and log a stack trace for
    every failed attempt. The error tells a name that does not resolve from a connection refused
    (no store listening) and from one timed out (dropped on the way, e.g. by a NetworkPolicy)."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return None
    except OSError as error:
        return error


def _reason(error: OSError | None) -> str:
    """A probe's error in a log line: its message, or its type when it has none (a bare timeout)."""
    if error is None:
        return "no attempt yet"
    return str(error) or type(error).__name__


def serve(host: str, port: int, port_file: str | None) -> int:
    """Serve the job's store until SIGTERM/SIGINT; the store outlives every worker. With the job's
    token in the environment, serve the operator's declarations of deaths too (:mod:`.declarations`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        endpoint_settings = declarations.settings_from_environment(os.environ)
    except ConfigError as error:
        print(f"ebbflow rendezvous: {error}", file=sys.stderr, flush=True)
        return contract.EXIT_INVALID_CONFIG
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True)
    endpoint = None
    if endpoint_settings is not None:
        client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
        remover = declarations.Remover(client, endpoint_settings.rendezvous)
        endpoint = declarations.DeclarationEndpoint(endpoint_settings.port, endpoint_settings.token, remover)
        print(f"ebbflow rendezvous: the operator's declarations on port {endpoint.port}", flush=True)
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
    if endpoint is not None:
        endpoint.close()
    return 0


def connect(config: TrainerConfig, timeout: float, connect_timeout: float | None = None) -> TCPStore:
    """A client of the job's store; ``connect_timeout`` bounds the connection alone (default
    ``timeout``), ``timeout`` every call made afterwards."""
    store = TCPStore(
        config.rdzv_host,
        config.rdzv_port,
        is_master=False,
        timeout=timedelta(seconds=timeout if connect_timeout is None else connect_timeout),
    )
    if connect_timeout is not None:
        store.set_timeout(timedelta(seconds=timeout))
    return store


def generation_store(config: TrainerConfig, generation: int) -> Store:
    """The store one world's workers bootstrap their process group from (never reused by a later world)."""
    base = connect(config, config.store_timeout)
    return PrefixStore(world_switch.generation_prefix(config.rdzv_id, generation), base)


class GenerationRendezvousHandler(RendezvousHandler):
    """Torch's dynamic c10d rendezvous, plus a job-wide generation number for every completed round,
    surviving the store's loss (see the module's docstring)."""

    def __init__(self, config: TrainerConfig):
        # Called with each completed round's generation, before the agent starts that world's workers.
        self.on_generation: Callable[[int], None] = lambda generation: None
        self._config = config
        self._journal = Journal(config.journal)  # each new world's change from the last: `world` events
        self._bootstrap = RendezvousStoreInfo(master_addr=config.rdzv_host, master_port=config.rdzv_port)
        self._join_timeout = config.join_timeout
        self._last_generation = 0  # the newest generation this node ran, whatever store gave it
        self._last_world: frozenset[str] = frozenset()  # the nodes of that generation's world
        self._peers_liveness: dict[str, str] = {}  # its other nodes' liveness addresses
        self._store_returned_at: float | None = None  # a new store answered, its first round not joined
        self._dropped_generation = 0  # the generation whose world this node was last dropped from
        self._member_gone_generation = 0  # the generation whose world last lost another member
        self._round_delegate: DynamicRendezvousHandler | None = None  # the handler of the last round
        self._store: TCPStore | None = None
        self._delegate: DynamicRendezvousHandler | None = None
        # Whether the agent's last poll saw nodes waiting for the next round (newcomers, or members that
        # left this round to join it) and no member of this node's world gone.
        self.newcomers_waiting = False
        # When the store was found gone (None while it answers); a pod may also start before its store.
        self._lost_since: float | None = time.monotonic()
        self._probe_error: OSError | None = None  # why the last probe found no store
        # Open while this launcher runs: peers that lost it in a collective find it gone here.
        self._liveness = liveness.LivenessEndpoint(liveness.node_address(config.node_addr))
        if not self._reconnect():
            log.warning(
                "no rendezvous store answers at %s yet (%s); waiting up to %.0f s (--store-loss-timeout)",
                config.rdzv_endpoint,
                _reason(self._probe_error),
                config.store_loss_timeout,
            )

    def _new_delegate(self, store: TCPStore) -> DynamicRendezvousHandler:
        """Torch's handler over ``store``; its backend marks the state key present (a no-op when it is)."""
        config = self._config
        delegate: DynamicRendezvousHandler = DynamicRendezvousHandler.from_backend(
            run_id=config.rdzv_id,
            store=store,
            backend=C10dRendezvousBackend(store, config.rdzv_id),
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
        return delegate

    # --- store loss ------------------------------------------------------------------------------
    def _store_lost(self, error: Exception) -> None:
        """The store stopped answering: stop this node's heartbeats and drop the client (it never
        reconnects); the running world, if any, trains on. After a hung call, the heartbeat thread
        may be stuck in the same store: it is told to stop, not waited for."""
        if isinstance(error, StoreCallHung) and self._delegate is not None:
            threading.Thread(
                target=self._delegate._stop_heartbeats, name="stop hung heartbeats", daemon=True
            ).start()
        else:
            self.stop_heartbeats()
        self._store, self._delegate = None, None
        if self._lost_since is None:
            self._lost_since = time.monotonic()
            log.warning(
                "the rendezvous store at %s stopped answering (%s); the world trains on while it can, "
                "and re-forms once a store answers at that address (waiting up to %.0f s, "
                "--store-loss-timeout)",
                self._config.rdzv_endpoint,
                error,
                self._config.store_loss_timeout,
            )

    def _reconnect(self) -> bool:
        """If a store answers at the address, connect to it afresh; whether this node has a store now."""
        config = self._config
        self._probe_error = probe_store(config.rdzv_host, config.rdzv_port)
        if self._probe_error is not None:
            return False
        try:
            store = connect(config, config.store_timeout, connect_timeout=CONNECT_TIMEOUT)
            delegate = self._new_delegate(store)
            store.set(liveness.liveness_key(repr(delegate._this_node)), self._liveness.address)
            if config.pod_name:  # where the operator's declarations of a dead pod find its node
                store.set(declarations.pod_key(config.pod_name), repr(delegate._this_node))
        except (RuntimeError, RendezvousError) as error:  # e.g. it went away again meanwhile
            log.info("a store answers at %s, but connecting failed (%s)", config.rdzv_endpoint, error)
            return False
        if self._lost_since is not None and self._last_generation:
            log.warning(
                "a rendezvous store answers at %s again, %.1f s after the loss; re-forming the world",
                config.rdzv_endpoint,
                time.monotonic() - self._lost_since,
            )
        self._store, self._delegate, self._lost_since = store, delegate, None
        if self._last_generation:  # a store with no trace of this node's world: see _survivors
            self._store_returned_at = time.monotonic()
        return True

    def _lost_for_too_long(self) -> StoreLost | None:
        if self._lost_since is None:
            return None
        timeout = self._config.store_loss_timeout
        if time.monotonic() - self._lost_since < timeout:
            return None
        return StoreLost(
            f"no rendezvous store answered at {self._config.rdzv_endpoint} for {timeout:.0f} s "
            f"(--store-loss-timeout; last attempt: {_reason(self._probe_error)}): the rendezvous pod "
            "was not replaced in time, or its Service does not reach it"
        )

    def _await_store(self) -> None:
        """Until a store answers, or raise StoreLost. Not ``wait_for``: it takes any exception from its
        condition for "not yet", and would swallow the SignalException that a SIGTERM (a pod deletion)
        raises in this thread while it probes; a plain sleep between probes lets it through."""
        while self._lost_since is not None and not self._reconnect():
            too_long = self._lost_for_too_long()
            if too_long is not None:
                raise too_long
            time.sleep(PROBE_INTERVAL)

    # --- rounds ----------------------------------------------------------------------------------
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round; if its rank 0 dies before publishing the round's keys, join another.

        Right after a round completes, its rank 0 publishes torch's bootstrap address and our
        generation number, and the others wait for them. A rank 0 killed in that instant (preemption,
        a peer's SIGKILL) would make every other agent crash with a store timeout and its pod exit 1,
        a failure the operator counts; instead they leave that round and join the next, which forms
        without the dead node once its heartbeats expire, as after any failed world. A store lost
        before or during the round: wait for a new one at the same address and join a round there.
        """
        deadline = time.monotonic() + self._join_timeout
        while True:
            self._await_store()
            try:
                return self._join_round()
            except STORE_LOST_ERRORS as error:
                self._store_lost(error)
            except DistStoreError as error:
                if time.monotonic() >= deadline:
                    raise
                log.warning("the round's rank 0 never published its keys (%s); joining the next round", error)

    def _join_round(self) -> RendezvousInfo:
        store, delegate = self._store, self._delegate
        assert store is not None and delegate is not None, "joined a round without a store"
        self._raise_generation_floor(store)
        log.info("node %s attempts to join the next round of the rendezvous", delegate._this_node)
        departures = membership.StoreDepartures(store)
        join = membership.KnownMembershipJoinOp(
            self._last_world, self._last_generation, departures, self._survivors()
        )
        rank, world_size, round_store = membership.join_round(delegate, join)
        self._store_returned_at = None
        self._round_delegate = delegate
        if rank == 0:
            generation = store.add(membership.GENERATION_COUNTER, 1)
            round_store.set(_ROUND_GENERATION, str(generation))
        last_generation, last_world = self._last_generation, self._last_world
        self._last_generation = int(round_store.get(_ROUND_GENERATION).decode())
        self._last_world = membership.world_nodes(delegate)
        self._peers_liveness = self._liveness_addresses(store, self._last_world - {repr(delegate._this_node)})
        log.info(
            "joined generation %d as rank %d of %d%s",
            self._last_generation,
            rank,
            world_size,
            " (its members known: the last world less those that departed, no last call)"
            if join.completed_early
            else "",
        )
        if last_world:
            self._record_change(departures, last_generation, last_world)
        self.on_generation(self._last_generation)
        return RendezvousInfo(round_store, rank, world_size, self._bootstrap)

    def _survivors(self) -> membership.SurvivorsOnANewStore | None:
        """On a new store, the first round awaits the last world's members whose launchers still answer,
        for at most the heartbeat budget from the store's return (docs/design/rendezvous.md, "The first
        round on a new store"); on the same store the last round's participants hold it anyway."""
        if self._store_returned_at is None or not self._peers_liveness:
            return None
        budget = self._config.keep_alive_interval * self._config.keep_alive_max_attempt
        return membership.SurvivorsOnANewStore(self._peers_liveness, self._store_returned_at + budget)

    @staticmethod
    def _liveness_addresses(store: TCPStore, nodes: frozenset[str]) -> dict[str, str]:
        """The liveness addresses `nodes` published in `store` (every member does before it joins);
        kept for a store's loss, which takes them with it."""
        ordered = sorted(nodes)
        keys = [liveness.liveness_key(node) for node in ordered]
        if not keys or not store.check(keys):
            return {}
        return {node: value.decode() for node, value in zip(ordered, store.multi_get(keys), strict=True)}

    def _record_change(
        self, departures: membership.StoreDepartures, last_generation: int, last_world: frozenset[str]
    ) -> None:
        """Log and journal how the world just joined differs from this node's last, and why."""
        gone = last_world - self._last_world
        recorded = departures.values(last_generation, gone) if gone else {}
        change = membership.world_change(
            self._last_generation, last_generation, last_world, self._last_world, recorded
        )
        log.info("generation %d after %d: %s", change.generation, last_generation, change.describe())
        self._journal.write("world", **change.record())

    def _raise_generation_floor(self, store: TCPStore) -> None:
        """A new store counts generations from zero: lift its counter to the newest generation this node
        ran. Every member does so before joining, hence before the round's rank 0 takes the next number."""
        current = int(store.add(membership.GENERATION_COUNTER, 0))
        while current < self._last_generation:
            swapped = store.compare_set(
                membership.GENERATION_COUNTER, str(current), str(self._last_generation)
            )
            current = int(swapped)

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join, which makes the agent re-form its world at a step boundary. While the
        store is lost: 0, so the world trains on; once a new store answers: 1, so every member re-forms
        there. At least 1 while this node's world runs but the rendezvous dropped it or another of its
        members (see the module docstring). Raises StoreLost when none answered within
        ``--store-loss-timeout``."""
        if self._delegate is not None:
            delegate = self._delegate
            bound = self._config.store_timeout + HUNG_CALL_GRACE
            try:
                waiting = call_with_bound(delegate.num_nodes_waiting, bound, "the rendezvous poll")
            except (*STORE_LOST_ERRORS, StoreCallHung) as error:
                self._store_lost(error)
            else:
                broken = self._dropped_from_the_world() or self._member_gone()
                self.newcomers_waiting = waiting > 0 and not broken
                return max(waiting, 1) if broken else waiting
        self.newcomers_waiting = False
        if self._reconnect():
            return 1
        too_long = self._lost_for_too_long()
        if too_long is not None:
            raise too_long
        return 0

    @property
    def generation(self) -> int:
        """The generation of the last round this node joined."""
        return self._last_generation

    def count_ready(self, generation: int, workers: int) -> int:
        """Add ``workers`` to ``generation``'s count of workers ready to enter it; the count after."""
        assert self._store is not None, "counted before joining a round"
        return int(self._store.add(world_switch.ready_key(self._config.rdzv_id, generation), workers))

    def _dropped_from_the_world(self) -> bool:
        """Whether the others declared this running node dead (see "Dropped from the world" in the
        module docstring); read from the state torch's handler has just synced."""
        assert self._delegate is not None
        if self._delegate is not self._round_delegate:  # a new store: _reconnect has asked to re-form
            return False
        # Torch keeps these private; num_nodes_waiting() has just synced the state from the store.
        state = self._delegate._state_holder.state
        if self._delegate._this_node in state.participants:
            return False
        if self._dropped_generation == self._last_generation:  # said once; the agent polls often
            return True
        self._dropped_generation = self._last_generation
        log.warning(
            "this node was dropped from the rendezvous (its heartbeats missed the %.0f s budget: "
            "a stalled process or an overloaded machine) while its world of generation %d trained on; "
            "stopping at a step boundary to join the job's current round",
            self._config.keep_alive_interval * self._config.keep_alive_max_attempt,
            self._last_generation,
        )
        return True

    def _member_gone(self) -> bool:
        """Whether another member of this node's world has left the rendezvous (its leave on SIGTERM, or
        its heartbeats expired): the world is broken even where no collective of this node's workers
        failed (docs/design/rendezvous.md, "A member gone"); read from the state torch's handler has
        just synced."""
        assert self._delegate is not None
        if self._delegate is not self._round_delegate:  # a new store: _reconnect has asked to re-form
            return False
        state = self._delegate._state_holder.state
        # A member waiting for the next round is not gone: it left a round to join the next (a join in
        # place begins so, before this node's agent has seen the newcomer).
        present = {repr(node) for node in (*state.participants, *state.wait_list)}
        gone = self._last_world - present
        if not gone or repr(self._delegate._this_node) in gone:  # this node's own absence: dropped
            return False
        if self._member_gone_generation != self._last_generation:  # said once; the agent polls often
            self._member_gone_generation = self._last_generation
            log.warning(
                "%d member(s) of the world of generation %d left the rendezvous: stopping at a step "
                "boundary to re-form without them",
                len(gone),
                self._last_generation,
            )
        return True

    def leave(self) -> None:
        """Drop this node from the rendezvous now, so the others need not wait for its heartbeats to
        expire, and record its departure, so that their next round completes as soon as they are in.

        Torch has no public call for this (``shutdown`` closes the rendezvous for everyone), so this
        uses the handler's own exit operation; if torch's internals change it only logs, and the others
        notice the departure after ``keep_alive_interval * keep_alive_max_attempt`` as before. With the
        store lost there is no rendezvous to leave.
        """
        self.stop_heartbeats()
        if self._delegate is None or self._store is None:
            return
        try:
            if self._last_generation:
                node = repr(self._delegate._this_node)
                self._store.set(membership.departure_key(self._last_generation, node), membership.LEFT)
            exit_op = dynamic_rendezvous._RendezvousExitOp()
            self._delegate._op_executor.run(exit_op, time.monotonic() + 10)
        except Exception as error:  # best effort by design, see the docstring
            log.warning("could not leave the rendezvous early (%s); peers wait for heartbeat expiry", error)

    def close_finished(self) -> None:
        """The job trained to its last step: close the rendezvous, so that a node still trying to join
        (one that arrived, or was dropped from the world, as the others finished) learns there is
        nothing left to train instead of waiting out its join timeout. Only then: a pod that leaves a
        running job must never close it (see the launcher). Best effort: with the store gone, no node
        can be waiting on it."""
        if self._delegate is None:
            return
        try:
            self._delegate.set_closed()
        except Exception as error:  # best effort by design, see the docstring
            log.warning("could not close the finished job's rendezvous (%s)", error)

    def stop_heartbeats(self) -> None:
        """Stop and join the keep-alive thread; every agent must call this before its interpreter exits.

        Torch runs the heartbeats in a daemon thread that it deliberately leaves running at exit. Each
        heartbeat is a store call made with the GIL released; if the interpreter finalizes meanwhile,
        the thread is torn down by ``pthread_exit`` on its way back into Python, the forced unwind hits
        pybind11's ``noexcept`` GIL guard, and ``std::terminate`` aborts the process (exit 134,
        "terminate called without an active exception") after a run that succeeded. A handler dropped
        at a store's loss had its heartbeats stopped then.
        """
        if self._delegate is not None:
            self._delegate._stop_heartbeats()

    def close(self) -> None:
        """This launcher is done: stop the heartbeats (see stop_heartbeats) and close the liveness
        port, whose peers may now take this node for gone."""
        self.stop_heartbeats()
        self._liveness.close()

    def get_backend(self) -> str:
        return "c10d"

    @property
    def use_agent_store(self) -> bool:
        return False

    def is_closed(self) -> bool:
        return self._delegate is not None and bool(self._delegate.is_closed())

    def set_closed(self) -> None:
        if self._delegate is not None:
            self._delegate.set_closed()

    def get_run_id(self) -> str:
        return self._config.rdzv_id

    def shutdown(self) -> bool:
        return self._delegate is not None and bool(self._delegate.shutdown())
