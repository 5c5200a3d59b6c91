"""When a forming round's members are already known, complete it without waiting out the last call.

Torch completes a round below ``max_nodes`` only once its last call has passed, since it cannot know
who else is coming. After a graceful leave or a death it can: the round's members are the last
world's nodes less those that departed, plus any node already waiting (:func:`membership_known`,
pure, run inside torch's join operation by :class:`KnownMembershipJoinOp`). Departures are recorded
by the node that leaves (:func:`departure_key`), or by a survivor that found it gone (its liveness
port refused, :mod:`.liveness`). Each new world is compared with the last (:func:`world_change`).
On a new store, which knows nothing of the last world, the first round waits for the survivors whose
launchers still answer (:class:`SurvivorsOnANewStore`) instead of completing after its last call.

Invariants: a round completes early only when every node expected is a participant and none waits;
a node is removed only on a recorded departure or a refused liveness port; torch's operation decides
every other state, except that it never completes a round that awaits survivors. A forming round's
state is read every ``RENDEZVOUS_POLL_S`` (torch: 1 s). Why: docs/design/rendezvous.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Set
from dataclasses import dataclass
from typing import Protocol

# torch re-exports Store from a C extension without declaring it public to type checkers.
from torch.distributed import Store  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.elastic.rendezvous.utils import _delay as _torch_delay

from ebbflow_trainer.launch import liveness

log = logging.getLogger(__name__)

# Seconds between reads of the shared state while a round forms, and how long a read is reused.
RENDEZVOUS_POLL_S = 0.1
# Seconds between two checks of the same waiting node's liveness (each a store read and a probe).
LIVENESS_CHECK_INTERVAL_S = 0.5
_TORCH_SYNC_DELAY_S = 1  # what torch's executor sleeps between polls (`_delay(seconds=1)` on SYNC)
_TORCH_STATE_READ_REUSE_S = 1  # how long torch's state holder reuses a read (its cache_duration)


def _poll_delay(seconds: float | tuple[float, float]) -> None:
    """Torch's `_delay`, except that the executor's poll while a round forms waits RENDEZVOUS_POLL_S."""
    _torch_delay(RENDEZVOUS_POLL_S if seconds == _TORCH_SYNC_DELAY_S else seconds)


dynamic_rendezvous._delay = _poll_delay  # type: ignore[attr-defined]  # torch's module-level helper


# The store key counting the job's generations: the newest one handed out (a round's rank 0 adds 1).
GENERATION_COUNTER = "ebbflow/generation-counter"


def departure_key(generation: int, node: str) -> str:
    """The store key saying that `node` (torch's node descriptor, as text) left generation's world."""
    return f"ebbflow/departed/{generation}/{node}"


def membership_known(
    participants: Collection[str],
    waiting: Collection[str],
    last_world: Set[str],
    departed: Set[str],
    min_nodes: int,
) -> bool:
    """Whether a forming round may complete now: it has its minimum, nobody waits to join it, and
    every node of the last world that did not depart is among its participants. Nodes are torch's
    node descriptors as text; an empty `last_world` (a node's first round) knows nothing."""
    if not last_world or waiting or len(participants) < min_nodes:
        return False
    return (last_world - departed) <= set(participants)


# What a departure key holds: written by the node that leaves, or "gone: <evidence>" by a survivor.
LEFT = "left"
GONE_PREFIX = "gone: "


def departure_evidence(recorded: str | None) -> str:
    """Why a member of the last world is not in the new one, from its departure key's value."""
    if recorded is None:
        return "no departure recorded: its heartbeats expired, or it did not rejoin before the round closed"
    if recorded.startswith(GONE_PREFIX):
        return "found gone: " + recorded.removeprefix(GONE_PREFIX)
    return "left gracefully" if recorded == LEFT else recorded


@dataclass(frozen=True)
class WorldChange:
    """How a node's new world differs from its last: who joined, who left and why (node -> evidence).
    A change with neither is a re-formation no membership change caused (a worker restarted)."""

    generation: int
    last_generation: int
    joined: frozenset[str]
    left: Mapping[str, str]

    @property
    def membership_changed(self) -> bool:
        return bool(self.joined or self.left)

    def describe(self) -> str:
        if not self.membership_changed:
            return "the same members as the last world: no membership change (a worker failed or restarted)"
        parts = [f"{node} joined" for node in sorted(self.joined)]
        parts += [f"{node} left ({why})" for node, why in sorted(self.left.items())]
        return "; ".join(parts)

    def record(self) -> dict[str, object]:
        """The journal's ``world`` event fields."""
        return {
            "generation": self.generation,
            "last_generation": self.last_generation,
            "joined": sorted(self.joined),
            "left": dict(sorted(self.left.items())),
            "membership_changed": self.membership_changed,
        }


def world_change(
    generation: int,
    last_generation: int,
    last_world: Set[str],
    new_world: Set[str],
    recorded: Mapping[str, str],
) -> WorldChange:
    """The change from `last_world` to `new_world`; `recorded` holds the departure keys' values of the
    last generation for the nodes that left (a node without one left without a record)."""
    left = {node: departure_evidence(recorded.get(node)) for node in last_world - new_world}
    return WorldChange(generation, last_generation, frozenset(new_world - last_world), left)


class Departures(Protocol):
    """What the job's store says about nodes of a generation's world (see the handler)."""

    def recorded(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        """Those of `nodes` whose departure from `generation` is recorded."""
        ...

    def confirm_gone(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        """Those of `nodes` whose departure is recorded or whose launcher is found gone now (then
        recorded, with the evidence)."""
        ...


class StoreDepartures:
    """Departures as the job's store records them; a node found gone is recorded there first."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def recorded(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        return frozenset(n for n in nodes if self._store.check([departure_key(generation, n)]))

    def values(self, generation: int, nodes: frozenset[str]) -> dict[str, str]:
        """The recorded departures of `nodes` from `generation`, by node (what their keys hold)."""
        keys = {node: departure_key(generation, node) for node in self.recorded(generation, nodes)}
        return {node: self._store.get(key).decode() for node, key in keys.items()}

    def confirm_gone(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        recorded = self.recorded(generation, nodes)
        found = frozenset(n for n in nodes - recorded if self._found_gone(generation, n))
        return recorded | found

    def _found_gone(self, generation: int, node: str) -> bool:
        key = liveness.liveness_key(node)
        if not self._store.check([key]):
            return False  # it published no liveness address: no evidence either way
        address = self._store.get(key).decode()
        if not liveness.refused(address):
            return False
        evidence = f"its launcher's liveness port {address} refused a connection"
        self._store.set(departure_key(generation, node), GONE_PREFIX + evidence)
        log.warning(
            "node %s of generation %d is gone (%s): removing it from the rendezvous without waiting "
            "for its heartbeats to expire",
            node,
            generation,
            evidence,
        )
        return True


def awaited_survivors(
    last_world: Mapping[str, str] | Set[str], participants: Set[str], released: Set[str]
) -> frozenset[str]:
    """The members of the last world that the first round on a new store still waits for: those not
    in it yet and not released (departed, or their launcher stopped answering)."""
    return frozenset(last_world) - participants - released


class SurvivorsOnANewStore:
    """The last world's other members, awaited by this node's first round on a new store.

    The new store holds no trace of the last world, so torch would complete the round after its last
    call with whoever found the store first; a survivor later by more than that would join the next
    round as a newcomer and take the state from a peer instead of its own memory. A member is awaited
    while its launcher's liveness port accepts (running, or frozen), until it joins, departs or stops
    accepting, or `until` (monotonic) passes; one lost with the store (a timeout) is not awaited.
    """

    def __init__(
        self,
        liveness_addresses: Mapping[str, str],
        until: float,
        accepts: Callable[[str], bool] = liveness.accepts,
    ) -> None:
        self._addresses = dict(liveness_addresses)
        self._until = until
        self._accepts = accepts
        self._released: set[str] = set()
        self._next_check = 0.0
        self._announced = False  # whether the wait was logged

    def awaited(
        self, participants: Set[str], departed: Callable[[frozenset[str]], frozenset[str]], now: float
    ) -> frozenset[str]:
        """Those still awaited now; `departed` says which of some nodes recorded their departure. Each
        awaited member's port is asked at most every LIVENESS_CHECK_INTERVAL_S."""
        pending = awaited_survivors(self._addresses, participants, self._released)
        if pending and now >= self._until:
            log.warning("the first round on the new store stops waiting for %s", ", ".join(sorted(pending)))
            self._released |= pending
            return frozenset()
        if pending and now >= self._next_check:
            self._next_check = now + LIVENESS_CHECK_INTERVAL_S
            self._released |= departed(pending)
            self._released |= {n for n in pending - self._released if not self._accepts(self._addresses[n])}
            pending = awaited_survivors(self._addresses, participants, self._released)
        if pending and not self._announced:
            self._announced = True
            log.info(
                "the first round on the new store waits for %s of the last world (their launchers answer)",
                ", ".join(sorted(pending)),
            )
        return pending


class KnownMembershipJoinOp(dynamic_rendezvous._RendezvousJoinOp):
    """Torch's join operation, which also removes the last world's members found gone from the round
    it waits on, completes a forming round once its membership is known, and on a new store holds it
    for the survivors still awaited."""

    def __init__(
        self,
        last_world: Set[str],
        generation: int,
        departures: Departures,
        survivors: SurvivorsOnANewStore | None = None,
    ) -> None:
        self._last_world = frozenset(last_world)
        self._generation = generation
        self._departures = departures
        self._survivors = survivors
        self._next_check = 0.0  # monotonic time of the next liveness check of stragglers
        self.completed_early = False
        self.removed: frozenset[str] = frozenset()  # the nodes this operation found gone

    def __call__(
        self, ctx: dynamic_rendezvous._RendezvousContext, deadline: float
    ) -> dynamic_rendezvous._Action:
        state = ctx.state
        if state.complete and ctx.node not in state.participants and self._remove_gone(ctx):
            return dynamic_rendezvous._Action.KEEP_ALIVE  # torch's executor then writes the state
        forming = not state.closed and not state.complete and ctx.node in state.participants
        if forming and self._known(state, ctx.settings.min_nodes):
            self.completed_early = True
            return dynamic_rendezvous._Action.MARK_RENDEZVOUS_COMPLETE
        action: dynamic_rendezvous._Action = super().__call__(ctx, deadline)
        if action is dynamic_rendezvous._Action.MARK_RENDEZVOUS_COMPLETE and self._awaits_survivors(ctx):
            keep_alive = dynamic_rendezvous._should_keep_alive(ctx)
            return dynamic_rendezvous._Action.KEEP_ALIVE if keep_alive else dynamic_rendezvous._Action.SYNC
        return action

    def _awaits_survivors(self, ctx: dynamic_rendezvous._RendezvousContext) -> bool:
        """Whether this round on a new store still waits for survivors of the last world (a full round
        never does)."""
        participants = ctx.state.participants
        if self._survivors is None or len(participants) >= ctx.settings.max_nodes:
            return False
        joined = {repr(node) for node in participants}

        def departed(nodes: frozenset[str]) -> frozenset[str]:
            return self._departures.recorded(self._generation, nodes)

        return bool(self._survivors.awaited(joined, departed, time.monotonic()))

    def _remove_gone(self, ctx: dynamic_rendezvous._RendezvousContext) -> bool:
        """The round this node waits on still holds members of its last world: remove those found
        gone, as torch removes a node whose heartbeats expired; whether any was."""
        state = ctx.state
        stragglers = {repr(node): node for node in state.participants if repr(node) in self._last_world}
        if not stragglers or time.monotonic() < self._next_check:
            return False
        self._next_check = time.monotonic() + LIVENESS_CHECK_INTERVAL_S
        gone = self._departures.confirm_gone(self._generation, frozenset(stragglers))
        for name in gone:
            del state.participants[stragglers[name]]
            state.last_heartbeats.pop(stragglers[name], None)
        if not gone:
            return False
        dynamic_rendezvous._remove_participant_epilogue(state, ctx.settings)
        self.removed |= gone
        return True

    def _known(self, state: dynamic_rendezvous._RendezvousState, min_nodes: int) -> bool:
        participants = {repr(node) for node in state.participants}
        # A node on the wait list or the redundancy list joins this round at its next poll.
        waiting = {repr(node) for node in (*state.wait_list, *state.redundancy_list)}
        # Cheap checks first: the store is asked about departures only when they could decide.
        if not membership_known(participants, waiting, self._last_world, self._last_world, min_nodes):
            return False
        absent = self._last_world - participants
        departed = self._departures.recorded(self._generation, absent) if absent else frozenset()
        return membership_known(participants, waiting, self._last_world, departed, min_nodes)


def join_round(delegate: DynamicRendezvousHandler, op: KnownMembershipJoinOp) -> tuple[int, int, Store]:
    """What torch's ``next_rendezvous`` does, with `op` as its join operation: leave the previous
    round, join the next, resume heartbeats; the round's rank, world size and store."""
    # Torch keeps these private; their behaviour is that of its next_rendezvous (torch 2.4-2.15).
    delegate._stop_heartbeats()
    deadline = delegate._get_deadline(delegate._settings.timeout.join)
    # While the round forms, each poll reads the state afresh (torch reuses a read for 1 s); the
    # agent's polls while a world trains keep torch's pace. Torch types the duration as int; it only
    # compares it with seconds.
    holder = delegate._state_holder
    holder._cache_duration = RENDEZVOUS_POLL_S  # type: ignore[attr-defined]
    try:
        delegate._op_executor.run(dynamic_rendezvous._RendezvousExitOp(), deadline)
        delegate._op_executor.run(op, deadline, delegate._get_deadline)
    finally:
        holder._cache_duration = _TORCH_STATE_READ_REUSE_S  # type: ignore[attr-defined]
    delegate._start_heartbeats()
    rank, world_size = delegate._get_world()
    return rank, world_size, delegate._get_store()


def world_nodes(delegate: DynamicRendezvousHandler) -> frozenset[str]:
    """The members of the round `delegate` has just joined, as text."""
    return frozenset(repr(node) for node in delegate._state_holder.state.participants)
