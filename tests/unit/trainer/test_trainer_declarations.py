"""The operator's declarations of deaths, as the rendezvous pod takes them: the request's parsing and
authentication, the endpoint's settings, and the removal from a rendezvous state kept in a store
built here (torch's HashStore, the c10d backend's state) — no process, no network."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest
from ebbflow_api import contract
from ebbflow_trainer.config import ConfigError
from ebbflow_trainer.launch import declarations, membership
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_rdzv
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

RUN_ID = "job-uid"
A, B = torch_rdzv._NodeDesc("10.0.0.1", 101, 0), torch_rdzv._NodeDesc("worker_1.pods", 102, 3)


@pytest.mark.parametrize(
    ("body", "pods", "error"),
    [
        pytest.param(b'{"pods": {"w-1": "node gone"}}', {"w-1": "node gone"}, None, id="one-pod"),
        pytest.param(
            b'{"pods": {"w-1": "", "w-2": "failed"}}', {"w-1": "", "w-2": "failed"}, None, id="two-pods"
        ),
        pytest.param(b"not json", None, "not JSON", id="not-json"),
        pytest.param(b'["w-1"]', None, '"pods" must be a non-empty object', id="a-list"),
        pytest.param(b'{"pods": {}}', None, '"pods" must be a non-empty object', id="no-pods"),
        pytest.param(b'{"pods": {"w-1": 3}}', None, "both strings", id="evidence-not-text"),
        pytest.param(b'{"pods": {"": "x"}}', None, "both strings", id="empty-name"),
    ],
)
def test_a_declaration_names_pods_and_evidence(
    body: bytes, pods: dict[str, str] | None, error: str | None
) -> None:
    if error is None:
        assert declarations.parse_declaration(body) == pods
    else:
        with pytest.raises(declarations.BadDeclaration, match=error):
            declarations.parse_declaration(body)


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        pytest.param("Bearer s3cret", True, id="the-token"),
        pytest.param("Bearer s3cre", False, id="a-prefix"),
        pytest.param("Bearer s3cret2", False, id="longer"),
        pytest.param("s3cret", False, id="no-scheme"),
        pytest.param("Basic s3cret", False, id="another-scheme"),
        pytest.param(None, False, id="no-header"),
    ],
)
def test_only_the_jobs_token_is_authorized(header: str | None, ok: bool) -> None:
    assert declarations.authorized(header, "s3cret") is ok


@pytest.mark.parametrize("node", [A, B], ids=["ip", "underscores-in-the-address"])
def test_a_node_descriptor_parses_back_from_its_text(node: torch_rdzv._NodeDesc) -> None:
    assert declarations.parse_node(repr(node)) == node


ENDPOINT_ENV = {
    contract.ENV_RDZV_TOKEN: "t",
    contract.ENV_RDZV_ID: RUN_ID,
    contract.ENV_MIN_REPLICAS: "2",
    contract.ENV_MAX_REPLICAS: "4",
}


@pytest.mark.parametrize(
    ("env", "expected", "error"),
    [
        pytest.param({}, None, None, id="no-token-no-endpoint"),
        pytest.param(
            ENDPOINT_ENV,
            declarations.EndpointSettings(
                contract.DECLARATIONS_PORT, "t", declarations.Rendezvous(RUN_ID, 2, 4)
            ),
            None,
            id="defaults-to-the-contract-port",
        ),
        pytest.param(
            {**ENDPOINT_ENV, contract.ENV_DECLARATIONS_PORT: "0"},
            declarations.EndpointSettings(0, "t", declarations.Rendezvous(RUN_ID, 2, 4)),
            None,
            id="port-0-any-free-port",
        ),
        pytest.param(
            {**ENDPOINT_ENV, contract.ENV_MAX_REPLICAS: ""}, None, contract.ENV_MAX_REPLICAS, id="no-max"
        ),
        pytest.param(
            {**ENDPOINT_ENV, contract.ENV_DECLARATIONS_PORT: "x"}, None, "whole number", id="bad-port"
        ),
        pytest.param({**ENDPOINT_ENV, contract.ENV_RDZV_ID: ""}, None, contract.ENV_RDZV_ID, id="no-run-id"),
    ],
)
def test_the_endpoint_settings_come_from_the_rendezvous_pods_environment(
    env: dict[str, str], expected: declarations.EndpointSettings | None, error: str | None
) -> None:
    if error is None:
        assert declarations.settings_from_environment(env) == expected
    else:
        with pytest.raises(ConfigError, match=error):
            declarations.settings_from_environment(env)


def _store_with_world(
    *nodes: torch_rdzv._NodeDesc, generation: int = 7, waiting: tuple[torch_rdzv._NodeDesc, ...] = ()
) -> HashStore:
    """A store holding a completed round of `nodes` and `waiting` nodes on its wait list, each
    published under pod `pod-<pid>`."""
    store = HashStore()
    state = torch_rdzv._RendezvousState()
    state.complete = True
    for rank, node in enumerate(nodes):
        state.participants[node] = rank
    state.wait_list.update(waiting)
    for node in (*nodes, *waiting):
        state.last_heartbeats[node] = datetime.now(UTC)
        store.set(declarations.pod_key(f"pod-{node.pid}"), repr(node))
    C10dRendezvousBackend(store, RUN_ID).set_state(pickle.dumps(state))
    store.add(membership.GENERATION_COUNTER, generation)
    return store


def _state(store: HashStore) -> torch_rdzv._RendezvousState:
    saved = C10dRendezvousBackend(store, RUN_ID).get_state()
    assert saved is not None
    state: torch_rdzv._RendezvousState = pickle.loads(saved[0])
    return state


def _participants(store: HashStore) -> set[torch_rdzv._NodeDesc]:
    return set(_state(store).participants)


def test_a_declared_pod_leaves_the_rendezvous_with_its_departure_recorded() -> None:
    store = _store_with_world(A, B)
    remover = declarations.Remover(store, declarations.Rendezvous(RUN_ID, 1, 3))
    answer = remover.declare({"pod-102": "node n2 is gone", "pod-5": "never ran"})
    assert answer == {"pod-102": declarations.REMOVED, "pod-5": declarations.UNKNOWN_POD}
    assert _participants(store) == {A}
    recorded = store.get(membership.departure_key(7, repr(B))).decode()
    assert membership.departure_evidence(recorded) == "found gone: declared by the operator: node n2 is gone"
    assert remover.declare({"pod-102": "again"}) == {"pod-102": declarations.NOT_A_MEMBER}


def test_a_declaration_keeps_a_leave_the_node_recorded_itself() -> None:
    store = _store_with_world(A, B)
    store.set(membership.departure_key(7, repr(B)), membership.LEFT)
    declarations.Remover(store, declarations.Rendezvous(RUN_ID, 1, 3)).declare({"pod-102": "pod failed"})
    assert store.get(membership.departure_key(7, repr(B))).decode() == membership.LEFT
    assert _participants(store) == {A}


def test_heartbeats_never_expire_at_the_declarations_hand() -> None:
    """The remover syncs the state with an endless heartbeat budget: a node whose heartbeats are old
    (the launchers' budget decides that) stays, unless declared."""
    store = _store_with_world(A, B)
    saved = C10dRendezvousBackend(store, RUN_ID).get_state()
    assert saved is not None
    state = pickle.loads(saved[0])
    state.last_heartbeats[A] = datetime.now(UTC) - timedelta(days=365)
    C10dRendezvousBackend(store, RUN_ID).set_state(pickle.dumps(state), saved[1])
    declarations.Remover(store, declarations.Rendezvous(RUN_ID, 1, 3)).declare({"pod-102": "pod failed"})
    assert _participants(store) == {A}


def test_a_declared_pod_waiting_to_join_leaves_the_wait_list() -> None:
    """A newcomer that died while waiting for the next round: off the wait list, no departure (it was
    in no world)."""
    c = torch_rdzv._NodeDesc("10.0.0.3", 103, 0)
    store = _store_with_world(A, B, waiting=(c,))
    answer = declarations.Remover(store, declarations.Rendezvous(RUN_ID, 1, 3)).declare(
        {"pod-103": "node gone"}
    )
    assert answer == {"pod-103": declarations.REMOVED}
    assert _state(store).wait_list == set() and _participants(store) == {A, B}
    assert not store.check([membership.departure_key(7, repr(c))])
