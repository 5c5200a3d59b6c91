"""The elastic agent: torch's local agent, except that a worker exit no restart can cure ends it.

Torch restarts a failed worker group until ``max_restarts`` run out. A worker that exits with one of
``contract.FATAL_EXIT_REASONS`` (training diverged) would only replay the same failure, so the agent
stops at once and the launcher exits with the worker's code, which the operator reads from the pod.
"""

from __future__ import annotations

from ebbflow_api import contract
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent


class FatalWorkerExit(Exception):
    """A worker exited with a code that no restart can cure."""

    def __init__(self, code: int):
        super().__init__(f"a worker exited {code} ({contract.FATAL_EXIT_REASONS[code]})")
        self.code = code


class EbbflowAgent(LocalElasticAgent):
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        for failure in result.failures.values():
            if failure.exitcode in contract.FATAL_EXIT_REASONS:
                raise FatalWorkerExit(failure.exitcode)
        return result
