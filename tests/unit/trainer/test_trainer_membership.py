"""A round whose members are known completes without torch's last call: the pure decision, and torch's
join operation with it, on rendezvous states built here (no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from ebbflow_trainer.launch import membership
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_rdzv

A, B, C, D = (torch_rdzv._NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(1, 5))


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
) -> torch_rdzv._RendezvousContext:
    state = torch_rdzv._RendezvousState()
    state.participants = {p: 0 for p in participants}
    state.wait_list = set(waiting)
    state.complete = complete
    now = datetime.now(UTC)
    state.last_heartbeats = {p: now for p in (*participants, *waiting)}
    # The last call torch would wait out: an hour, so that only the early completion can end the round.
    state.deadline = now + timedelta(hours=1)
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
