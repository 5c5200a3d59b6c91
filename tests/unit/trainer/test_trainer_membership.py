"""A round whose members are known completes without torch's last call: the pure decision, and torch's
join operation with it, on rendezvous states built here (no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from ebbflow_trainer.launch import membership
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_rdzv

A, B, C, D, E = (torch_rdzv._NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(1, 6))


@pytest.mark.parametrize(
    ("participants", "waiting", "last_world", "departed", "min_nodes", "known"),
    [
        pytest.param({"a", "b"}, set(), {"a", "b", "c"}, {"c"}, 2, True, id="c-left"),
        pytest.param({"a", "b"}, set(), {"a", "b", "c"}, set(), 2, False, id="c-live-not-in-yet"),
        pytest.param({"a", "b"}, {"d"}, {"a", "b", "c"}, {"c"}, 2, False, id="a-newcomer-waits"),
        pytest.param({"a", "b", "d"}, set(), {"a", "b", "c"}, {"c"}, 2, True, id="c-left-d-joined"),
        pytest.param({"a"}, set(), {"a", "b"}, {"b"}, 2, False, id="below-the-minimum"),
        pytest.param({"a", "b"}, set(), set(), set(), 2, False, id="first-round-knows-nothing"),
        pytest.param({"a", "b", "c"}, set(), {"a", "b", "c"}, set(), 1, True, id="everyone-back"),
    ],
)
def test_membership_is_known_when_every_expected_node_is_in_and_nobody_waits(
    participants: set[str],
    waiting: set[str],
    last_world: set[str],
    departed: set[str],
    min_nodes: int,
    known: bool,
) -> None:
    assert membership.membership_known(participants, waiting, last_world, departed, min_nodes) is known


def _context(
    node: torch_rdzv._NodeDesc,
    participants: list[torch_rdzv._NodeDesc],
    *,
    waiting: tuple[torch_rdzv._NodeDesc, ...] = (),
    complete: bool = False,
    min_nodes: int = 2,
    last_call_passed: bool = False,
) -> torch_rdzv._RendezvousContext:
    state = torch_rdzv._RendezvousState()
    state.participants = {p: 0 for p in participants}
    state.wait_list = set(waiting)
    state.complete = complete
    now = datetime.now(UTC)
    state.last_heartbeats = {p: now for p in (*participants, *waiting)}
    # The last call torch would wait out: an hour, so that only the early completion can end the round
    # (or an hour ago, so that torch's operation completes it).
    state.deadline = now + timedelta(hours=-1 if last_call_passed else 1)
    settings = torch_rdzv.RendezvousSettings(
        run_id="job",
        min_nodes=min_nodes,
        max_nodes=4,
        timeout=torch_rdzv.RendezvousTimeout(last_call=timedelta(hours=1)),
        # Contexts are built when the tests are collected: heartbeats an hour apart keep torch's
        # operation from asking for one however long the tier runs before these tests.
        keep_alive_interval=timedelta(hours=1),
        keep_alive_max_attempt=10,
    )
    return torch_rdzv._RendezvousContext(node, state, settings)


class FakeDepartures:
    """Departures from generation 7: `left` recorded, `dead` found gone when asked; the calls made."""

    def __init__(
        self, left: tuple[torch_rdzv._NodeDesc, ...] = (), dead: tuple[torch_rdzv._NodeDesc, ...] = ()
    ):
        self.left = {repr(n) for n in left}
        self.dead = {repr(n) for n in dead}
        self.asked: list[str] = []

    def recorded(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        self.asked.append("recorded")
        return frozenset(n for n in nodes if generation == 7 and n in self.left)

    def confirm_gone(self, generation: int, nodes: frozenset[str]) -> frozenset[str]:
        self.asked.append("confirm_gone")
        return frozenset(n for n in nodes if generation == 7 and n in self.left | self.dead)


LAST_WORLD = frozenset(repr(n) for n in (A, B, C))


@pytest.mark.parametrize(
    ("context", "left", "action", "asks_the_store"),
    [
        pytest.param(_context(A, [A, B]), (C,), "MARK_RENDEZVOUS_COMPLETE", True, id="c-left-complete-now"),
        pytest.param(_context(A, [A, B]), (), "SYNC", True, id="c-not-departed-wait-for-it"),
        pytest.param(_context(A, [A, B], waiting=(D,)), (C,), "SYNC", False, id="newcomer-waiting"),
        pytest.param(_context(A, [A]), (B, C), "SYNC", False, id="below-the-minimum"),
        pytest.param(_context(A, [B]), (C,), "ADD_TO_PARTICIPANTS", False, id="not-in-yet-torch-adds"),
        pytest.param(_context(A, [A, B], complete=True), (C,), "FINISH", False, id="complete-torch-finishes"),
    ],
)
def test_the_join_operation_completes_a_known_round_and_leaves_the_rest_to_torch(
    context: torch_rdzv._RendezvousContext,
    left: tuple[torch_rdzv._NodeDesc, ...],
    action: str,
    asks_the_store: bool,
) -> None:
    departures = FakeDepartures(left)
    join = membership.KnownMembershipJoinOp(LAST_WORLD, 7, departures)
    # The context's node sent its heartbeat within the interval: torch's operation sends no keep-alive.
    assert join(context, deadline=float("inf")) == torch_rdzv._Action[action]
    assert join.completed_early is (action == "MARK_RENDEZVOUS_COMPLETE")
    assert (departures.asked == ["recorded"]) is asks_the_store


def test_a_member_found_gone_is_removed_from_the_round_its_survivors_wait_on() -> None:
    """A and B left their world of three after C died; the round still holds C, complete."""
    context = _context(A, [C], complete=True)
    departures = FakeDepartures(dead=(C,))
    join = membership.KnownMembershipJoinOp(LAST_WORLD, 7, departures)
    assert join(context, deadline=float("inf")) == torch_rdzv._Action.KEEP_ALIVE  # torch writes the state
    state = context.state
    assert (state.participants, state.complete, state.round, join.removed) == ({}, False, 1, {repr(C)})
    assert C not in state.last_heartbeats
    # The next round forms: A joins it.
    assert join(context, deadline=float("inf")) == torch_rdzv._Action.ADD_TO_PARTICIPANTS


@pytest.mark.parametrize(
    ("participants", "dead", "asks"),
    [
        pytest.param([C], (), 1, id="alive-straggler-stays"),
        pytest.param([D], (D,), 0, id="not-of-the-last-world-never-asked"),
    ],
)
def test_a_straggler_not_found_gone_is_left_to_torch_and_asked_about_at_most_every_interval(
    participants: list[torch_rdzv._NodeDesc], dead: tuple[torch_rdzv._NodeDesc, ...], asks: int
) -> None:
    context = _context(A, participants, complete=True)
    departures = FakeDepartures(dead=dead)
    join = membership.KnownMembershipJoinOp(LAST_WORLD, 7, departures)
    assert join(context, deadline=float("inf")) == torch_rdzv._Action.ADD_TO_WAIT_LIST
    context.state.wait_list.add(A)  # what torch's executor does with that action
    # Asked again within the interval: torch's operation polls, nobody is probed again.
    assert join(context, deadline=float("inf")) == torch_rdzv._Action.SYNC
    assert [repr(p) for p in context.state.participants] == [repr(p) for p in participants]
    assert departures.asked == ["confirm_gone"] * asks


@pytest.mark.parametrize(
    ("participants", "released", "awaited"),
    [
        pytest.param({"a"}, set(), {"b", "c"}, id="none-in-yet"),
        pytest.param({"a", "b"}, set(), {"c"}, id="b-joined"),
        pytest.param({"a"}, {"c"}, {"b"}, id="c-released"),
        pytest.param({"a", "b", "c"}, set(), set(), id="all-in"),
    ],
)
def test_the_survivors_awaited_are_those_neither_in_nor_released(
    participants: set[str], released: set[str], awaited: set[str]
) -> None:
    assert membership.awaited_survivors({"b": "x", "c": "y"}, participants, released) == awaited


class Ports:
    """Liveness ports by address: those in `accepting` accept; every probe recorded."""

    def __init__(self, *accepting: str) -> None:
        self.accepting = set(accepting)
        self.probed: list[str] = []

    def accepts(self, address: str) -> bool:
        self.probed.append(address)
        return address in self.accepting


PEERS = {"b": "10.0.0.2:41", "c": "10.0.0.3:41"}


def _no_departures(nodes: frozenset[str]) -> frozenset[str]:
    return frozenset()


def test_survivors_whose_launchers_answer_are_awaited_and_asked_at_most_every_interval() -> None:
    ports = Ports(PEERS["b"])  # c was lost with the store: its address answers nothing
    survivors = membership.SurvivorsOnANewStore(PEERS, until=100.0, accepts=ports.accepts)
    assert survivors.awaited({"a"}, _no_departures, now=10.0) == {"b"}
    assert sorted(ports.probed) == sorted(PEERS.values())
    assert survivors.awaited({"a"}, _no_departures, now=10.1) == {"b"}  # within the interval: not asked
    assert len(ports.probed) == 2
    next_check = 10.0 + membership.LIVENESS_CHECK_INTERVAL_S
    assert survivors.awaited({"a"}, _no_departures, now=next_check) == {"b"}
    assert ports.probed[2:] == [PEERS["b"]]  # c, released, is never asked again
    assert survivors.awaited({"a", "b"}, _no_departures, now=next_check + 1) == set()


def test_a_survivor_that_stops_answering_or_departs_is_no_longer_awaited() -> None:
    ports = Ports(*PEERS.values())
    survivors = membership.SurvivorsOnANewStore(PEERS, until=100.0, accepts=ports.accepts)
    assert survivors.awaited({"a"}, _no_departures, now=10.0) == {"b", "c"}
    ports.accepting.discard(PEERS["b"])  # its launcher died meanwhile

    def c_departed(nodes: frozenset[str]) -> frozenset[str]:
        return nodes & {"c"}

    assert survivors.awaited({"a"}, c_departed, now=11.0) == set()
    assert ports.probed[2:] == [PEERS["b"]]  # c's recorded departure needs no probe
    ports.accepting.add(PEERS["b"])  # once released, released for this round
    assert survivors.awaited({"a"}, _no_departures, now=12.0) == set()


def test_survivors_are_awaited_until_the_budget_passes() -> None:
    ports = Ports(*PEERS.values())
    survivors = membership.SurvivorsOnANewStore(PEERS, until=20.0, accepts=ports.accepts)
    assert survivors.awaited({"a"}, _no_departures, now=19.9) == {"b", "c"}
    assert survivors.awaited({"a"}, _no_departures, now=20.0) == set()
    assert survivors.awaited({"a"}, _no_departures, now=20.6) == set()  # given up for good


@pytest.mark.parametrize(
    ("participants", "accepting", "action"),
    [
        pytest.param([A], (PEERS["b"],), "SYNC", id="b-answers-held-past-the-last-call"),
        pytest.param([A], (), "MARK_RENDEZVOUS_COMPLETE", id="nobody-answers-torch-completes"),
        pytest.param([A, C, D, E], (PEERS["b"],), "MARK_RENDEZVOUS_COMPLETE", id="a-full-round-is-not-held"),
    ],
)
def test_the_first_round_on_a_new_store_is_not_completed_while_survivors_are_awaited(
    participants: list[torch_rdzv._NodeDesc], accepting: tuple[str, ...], action: str
) -> None:
    peers = {repr(B): PEERS["b"]}
    context = _context(A, participants, min_nodes=1, last_call_passed=True)
    survivors = membership.SurvivorsOnANewStore(peers, until=float("inf"), accepts=Ports(*accepting).accepts)
    join = membership.KnownMembershipJoinOp(frozenset({repr(A), *peers}), 7, FakeDepartures(), survivors)
    assert join(context, deadline=float("inf")) == torch_rdzv._Action[action]


@pytest.mark.parametrize(
    ("asked", "slept"),
    [
        pytest.param(1, membership.RENDEZVOUS_POLL_S, id="torch-sync-poll-shortened"),
        pytest.param((0, 0.3), (0, 0.3), id="first-round-jitter-kept"),
        pytest.param(2.5, 2.5, id="other-delays-kept"),
    ],
)
def test_torch_polls_a_forming_round_every_rendezvous_poll(
    monkeypatch: pytest.MonkeyPatch, asked: float | tuple[float, float], slept: float | tuple[float, float]
) -> None:
    delays: list[float | tuple[float, float]] = []
    monkeypatch.setattr(membership, "_torch_delay", delays.append)
    assert torch_rdzv._delay is membership._poll_delay  # type: ignore[attr-defined]
    torch_rdzv._delay(asked)  # type: ignore[attr-defined]
    assert delays == [slept]


GONE = "gone: its launcher's liveness port 10.0.0.3:41000 refused a connection"


@pytest.mark.parametrize(
    ("last_world", "new_world", "recorded", "joined", "left"),
    [
        pytest.param(
            {"a", "b", "c"}, {"a", "b"}, {"c": "left"}, set(), {"c": "left gracefully"}, id="graceful-leave"
        ),
        pytest.param(
            {"a", "b", "c"},
            {"a", "b"},
            {"c": GONE},
            set(),
            {"c": "found gone: its launcher's liveness port 10.0.0.3:41000 refused a connection"},
            id="found-gone-with-its-evidence",
        ),
        pytest.param(
            {"a", "b", "c"},
            {"a", "b"},
            {},
            set(),
            {"c": membership.departure_evidence(None)},
            id="no-record-heartbeats-expired",
        ),
        pytest.param({"a", "b"}, {"a", "b", "d"}, {}, {"d"}, {}, id="a-newcomer"),
        pytest.param(
            {"a", "b", "c"}, {"a", "b", "d"}, {"c": "left"}, {"d"}, {"c": "left gracefully"}, id="replaced"
        ),
        pytest.param({"a", "b"}, {"a", "b"}, {}, set(), {}, id="same-members-a-worker-restarted"),
    ],
)
def test_each_new_world_says_who_joined_and_who_left_on_what_evidence(
    last_world: set[str],
    new_world: set[str],
    recorded: dict[str, str],
    joined: set[str],
    left: dict[str, str],
) -> None:
    change = membership.world_change(8, 7, frozenset(last_world), frozenset(new_world), recorded)
    assert (change.joined, dict(change.left)) == (joined, left)
    assert change.membership_changed is bool(joined or left)
    record = change.record()
    assert record["generation"] == 8 and record["last_generation"] == 7
    assert record["membership_changed"] is change.membership_changed
    described = change.describe()
    for node in (*joined, *left):
        assert node in described
    if not change.membership_changed:
        assert "no membership change" in described


def test_the_store_gives_the_recorded_departures_of_a_generation_by_node() -> None:
    store = HashStore()
    store.set(membership.departure_key(7, "a"), membership.LEFT)
    store.set(membership.departure_key(7, "b"), GONE)
    store.set(membership.departure_key(6, "c"), membership.LEFT)  # another generation's
    departures = membership.StoreDepartures(store)
    assert departures.values(7, frozenset({"a", "b", "c"})) == {"a": "left", "b": GONE}
