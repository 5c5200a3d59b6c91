"""Leader election: the pure decisions table by table, then electors sharing an in-memory Lease that
refuses stale writes as the API server does (409 on a resourceVersion that moved)."""

from __future__ import annotations

import copy

import pytest
from ebbflow_operator.decision.model import Json
from ebbflow_operator.errors import KubeError
from ebbflow_operator.leader import (
    ElectionConfig,
    Elector,
    Lease,
    LeaseAction,
    leads,
    lease_body,
    next_action,
    parse_lease,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("lease", "action"),
    [
        pytest.param(None, LeaseAction.CREATE, id="no-lease"),
        pytest.param(Lease("me", NOW - 1, 15), LeaseAction.RENEW, id="mine-fresh"),
        pytest.param(Lease("me", NOW - 60, 15), LeaseAction.RENEW, id="mine-expired-renew-anyway"),
        pytest.param(Lease("other", NOW - 1, 15), LeaseAction.STAND_BY, id="others-fresh"),
        pytest.param(Lease("other", NOW - 14.9, 15), LeaseAction.STAND_BY, id="others-just-before-expiry"),
        pytest.param(Lease("other", NOW - 15, 15), LeaseAction.TAKE_OVER, id="others-expired-exactly"),
        pytest.param(Lease("other", NOW - 60, 15), LeaseAction.TAKE_OVER, id="others-long-expired"),
        pytest.param(Lease(None, NOW - 1, 15), LeaseAction.TAKE_OVER, id="released"),
        pytest.param(Lease("other", None, 15), LeaseAction.TAKE_OVER, id="never-renewed"),
        pytest.param(Lease("other", NOW + 5, 15), LeaseAction.STAND_BY, id="holder-clock-ahead"),
    ],
)
def test_next_action(lease: Lease | None, action: LeaseAction) -> None:
    assert next_action(lease, "me", NOW) is action


@pytest.mark.parametrize(
    ("last_renewal", "leading"),
    [
        pytest.param(None, False, id="never-renewed"),
        pytest.param(NOW - 1, True, id="renewed-recently"),
        pytest.param(NOW - 9.9, True, id="just-inside-deadline"),
        pytest.param(NOW - 10, False, id="deadline-passed"),
    ],
)
def test_leads_only_within_the_renew_deadline(last_renewal: float | None, leading: bool) -> None:
    assert leads(last_renewal, NOW, renew_deadline=10) is leading


def test_a_config_whose_deadline_outlives_the_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        ElectionConfig("ns", "me", lease_duration=10, renew_deadline=10)


def test_lease_body_round_trips_and_counts_take_overs() -> None:
    config = ElectionConfig("ns", "me")
    current = Lease("other", NOW - 60, 15, transitions=3, resource_version="41")
    body = lease_body(config, LeaseAction.TAKE_OVER, current, NOW)
    assert body["metadata"] == {"name": config.name, "namespace": "ns", "resourceVersion": "41"}
    assert parse_lease(body) == Lease("me", pytest.approx(NOW), 15, transitions=4, resource_version="41")
    renewed = lease_body(config, LeaseAction.RENEW, parse_lease(body), NOW + 5)
    assert renewed["spec"]["leaseTransitions"] == 4 and "acquireTime" not in renewed["spec"]


class MemoryLease:
    """One Lease with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.object: Json | None = None
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise KubeError(0, "ConnectionRefused")

    def read_lease(self, namespace: str, name: str) -> Json | None:
        self._check()
        return copy.deepcopy(self.object)

    def create_lease(self, namespace: str, body: Json) -> Json:
        self._check()
        if self.object is not None:
            raise KubeError(409, "AlreadyExists")
        return self._store(body)

    def replace_lease(self, namespace: str, name: str, body: Json) -> Json:
        self._check()
        assert self.object is not None
        if body["metadata"].get("resourceVersion") != self.object["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict")
        return self._store(body)

    def _store(self, body: Json) -> Json:
        self.version += 1
        self.object = copy.deepcopy(body)
        self.object["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.object)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def electors(lease: MemoryLease, clock: Clock, *names: str) -> list[Elector]:
    return [Elector(lease, ElectionConfig("ns", name), clock=clock) for name in names]


def test_exactly_one_of_two_replicas_leads() -> None:
    lease, clock = MemoryLease(), Clock()
    a, b = electors(lease, clock, "a", "b")
    assert a.tick() is LeaseAction.CREATE and b.tick() is LeaseAction.STAND_BY
    for _ in range(10):
        clock.now += 2
        a.tick()
        b.tick()
        assert (a.leading(), b.leading()) == (True, False)


def test_a_race_for_an_expired_lease_has_one_winner() -> None:
    lease, clock = MemoryLease(), Clock()
    [dead] = electors(lease, clock, "dead")
    dead.tick()
    clock.now += 20
    b, c = electors(lease, clock, "b", "c")
    # Both read the expired Lease before either writes: the second write carries a stale version.
    raw = lease.read_lease("ns", "ebbflow-operator")
    lease.read_lease = lambda namespace, name: copy.deepcopy(raw)  # type: ignore[method-assign]
    assert b.tick() is LeaseAction.TAKE_OVER
    assert c.tick() is None, "the loser's write must be refused"
    assert (b.leading(), c.leading()) == (True, False)


def test_a_killed_leader_is_replaced_after_the_lease_expires_and_not_before() -> None:
    lease, clock = MemoryLease(), Clock()
    a, b = electors(lease, clock, "a", "b")
    a.tick()
    b.tick()
    for _ in range(7):  # a stops renewing (SIGKILL); 14 s later the Lease is still a's
        clock.now += 2
        b.tick()
        assert not b.leading()
    clock.now += 2
    assert b.tick() is LeaseAction.TAKE_OVER and b.leading()
    assert parse_lease(lease.object or {}).transitions == 1


def test_a_leader_cut_off_from_the_api_stops_before_anyone_may_take_over() -> None:
    lease, clock = MemoryLease(), Clock()
    [a] = electors(lease, clock, "a")
    a.tick()
    lease.down = True
    clock.now += 9
    assert a.tick() is None and a.leading()
    clock.now += 1  # renew deadline (10 s) passed, lease duration (15 s) not yet
    assert not a.leading()


def test_release_hands_the_lease_over_at_once() -> None:
    lease, clock = MemoryLease(), Clock()
    a, b = electors(lease, clock, "a", "b")
    changes: list[bool] = []
    a.on_change = changes.append
    a.tick()
    b.tick()
    a.release()
    assert not a.leading() and changes == [True, False]
    clock.now += 2
    assert b.tick() is LeaseAction.TAKE_OVER and b.leading()
