"""The elastic agent's options across torch versions: only what the installed agent takes is passed."""

from __future__ import annotations

import logging

import pytest
from ebbflow_trainer.launch.agent import TORCH_FIXED_SHUTDOWN_SECONDS, EbbflowAgent, shutdown_option


class AgentWithShutdownTimeout:
    def __init__(self, spec: object, exit_barrier_timeout: float = 300, shutdown_timeout: int = 30) -> None:
        pass


class AgentWithoutShutdownTimeout:  # torch 2.11's LocalElasticAgent takes no shutdown_timeout
    def __init__(self, spec: object, exit_barrier_timeout: float = 300) -> None:
        pass


@pytest.mark.parametrize(
    ("agent", "seconds", "option", "warned"),
    [
        pytest.param(AgentWithShutdownTimeout, 25, {"shutdown_timeout": 25}, False, id="taken"),
        pytest.param(AgentWithoutShutdownTimeout, 25, {}, True, id="not-taken-warns"),
        pytest.param(
            AgentWithoutShutdownTimeout, TORCH_FIXED_SHUTDOWN_SECONDS, {}, False, id="not-taken-same-as-torch"
        ),
    ],
)
def test_the_shutdown_timeout_is_passed_only_to_an_agent_that_takes_it(
    agent: type, seconds: int, option: dict[str, int], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ebbflow_trainer.launch.agent"):
        assert shutdown_option(agent, seconds) == option
    assert bool(caplog.records) is warned


def test_the_installed_agent_is_built_with_the_option_it_gets() -> None:
    """Whatever torch is installed, the launcher's call is one its agent accepts."""
    option = shutdown_option(EbbflowAgent, 25)
    assert set(option) <= {"shutdown_timeout"}
