"""A launcher's liveness endpoint: accepted while its process listens, refused once it is closed (as
the kernel closes it when the process dies)."""

from __future__ import annotations

from ebbflow_trainer.launch import liveness


def test_an_open_endpoint_accepts_every_probe_and_a_closed_one_refuses() -> None:
    endpoint = liveness.LivenessEndpoint("127.0.0.1")
    # More probes than the listening backlog: the endpoint's thread accepts them all.
    assert not any(liveness.refused(endpoint.address) for _ in range(100))
    endpoint.close()
    assert liveness.refused(endpoint.address)


def test_an_address_nothing_resolves_is_no_evidence() -> None:
    assert not liveness.refused("no-such-host.invalid:1")
