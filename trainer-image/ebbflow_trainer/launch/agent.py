"""The elastic agent: torch's local agent, except that a worker exit no restart can cure ends it.

Torch restarts a failed worker group until ``max_restarts`` run out. A worker that exits with one of
``contract.FATAL_EXIT_REASONS`` (training diverged) would only replay the same failure, so the agent
stops at once and the launcher exits with the worker's code, which the operator reads from the pod.

After the pod's SIGTERM the agent gives the workers the leave grace (less the launcher's margin) to
exit, then kills them; `outlived_grace` says whether it had to (the launcher reports it). Workers get
SIGTERM for a restart into the next world too; `on_pod_leaving` runs first only when the pod leaves.

The trainer runs on torch >= 2.4 (a vendor's torch in the image's base, docs/images.md), and the
agent's constructor grew options since: `shutdown_option` passes only what the installed one takes.
"""

from __future__ import annotations

import inspect
import logging
import signal
import time
from collections.abc import Callable
from typing import TypedDict

from ebbflow_api import contract
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

log = logging.getLogger(__name__)

# What torch's agent gives its workers to exit after a signal where it takes no `shutdown_timeout`.
TORCH_FIXED_SHUTDOWN_SECONDS = 30


class ShutdownOption(TypedDict, total=False):
    shutdown_timeout: int


def shutdown_option(agent: type, seconds: int) -> ShutdownOption:
    """How long the workers get to exit after the pod's SIGTERM, as `agent`'s constructor takes it.
    An older torch's agent (2.11's, for one) takes no such option and gives them a fixed 30 s, which
    the pod's own grace period cuts short or the worker's handoff outlasts: said once in the log."""
    if "shutdown_timeout" in inspect.signature(agent).parameters:
        return {"shutdown_timeout": seconds}
    if seconds != TORCH_FIXED_SHUTDOWN_SECONDS:
        log.warning(
            "this torch's elastic agent gives workers a fixed %d s to exit after a signal, not the %d s "
            "the leave grace asks for (a newer torch takes it)",
            TORCH_FIXED_SHUTDOWN_SECONDS,
            seconds,
        )
    return {}


class FatalWorkerExit(Exception):
    """A worker exited with a code that no restart can cure."""

    def __init__(self, code: int):
        super().__init__(f"a worker exited {code} ({contract.FATAL_EXIT_REASONS[code]})")
        self.code = code


# Workers whose shutdown after SIGTERM took this close to its timeout were still running at its end.
OUTLIVED_MARGIN_S = 0.5


class EbbflowAgent(LocalElasticAgent):
    # The seconds the workers were given after SIGTERM and outlived (then killed); None if they exited.
    outlived_grace: int | None = None
    # Called before the workers get the pod's SIGTERM, not a restart's (their shards then go to heirs).
    on_pod_leaving: Callable[[], None] | None = None
    _restarting = False

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """A restart into the next world (a newcomer waits, a peer failed): the workers stay."""
        self._restarting = True
        try:
            super()._stop_workers(worker_group)
        finally:
            self._restarting = False

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        started = time.monotonic()
        if death_sig == signal.SIGTERM and not self._restarting and self.on_pod_leaving is not None:
            self.on_pod_leaving()
        super()._shutdown(death_sig, timeout)
        if death_sig == signal.SIGTERM and time.monotonic() - started >= timeout - OUTLIVED_MARGIN_S:
            self.outlived_grace = timeout

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        for failure in result.failures.values():
            if failure.exitcode in contract.FATAL_EXIT_REASONS:
                raise FatalWorkerExit(failure.exitcode)
        return result
