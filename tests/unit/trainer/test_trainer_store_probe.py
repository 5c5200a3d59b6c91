"""The store probe says why no store answers: a log line that tells "nothing listens" (refused)
from "dropped on the way" (timed out) points at the rendezvous pod or at the network."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from ebbflow_trainer.launch import rendezvous

pytestmark = pytest.mark.unit


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_a_listening_store_answers(listening: int) -> None:
    assert rendezvous.probe_store("127.0.0.1", listening) is None


def test_nothing_listening_is_a_refusal_named_in_the_reason() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]  # free once the server closes
    error = rendezvous.probe_store("127.0.0.1", port)
    assert isinstance(error, ConnectionRefusedError)
    assert "refused" in rendezvous._reason(error).lower()


def test_a_timeout_without_a_message_is_named_by_its_type() -> None:
    assert rendezvous._reason(TimeoutError()) == "TimeoutError"
    assert rendezvous._reason(None) == "no attempt yet"
