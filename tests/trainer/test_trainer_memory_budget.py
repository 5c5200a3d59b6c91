"""Trainer tier: memory elasticity (spec.bandLimit) with real launchers, elastic agents, workers and
gloo on CPU.

The test plays the operator and the kubelet: it writes the memory budget into the file the workers'
environment names, atomically, as the kubelet swaps a projected volume's files. The band-limited
digits CNN (examples/digits_cnn) trains with V=4, B=32 on two workers; a budget of 1 MiB fits no rate
(the largest, 0.75, is used), a budget of a terabyte fits the full spectrum again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_api.waiting import wait_for

from tests.trainer.trainer_cluster import Job, Node, running_job

CNN = str(Path(__file__).resolve().parents[2] / "examples" / "digits_cnn" / "train.py")
STEPS = 60
# Modelled device time per virtual node: the run lasts long enough to change the budget twice.
SLOW_STEPS = ["--simulated-vnode-seconds", "0.02"]


def _write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _band_limited(job: Job, budget_file: Path) -> dict[str, str]:
    return job.environment(
        **{contract.ENV_BAND_LIMIT: "true", contract.ENV_MEMORY_BUDGET_FILE: str(budget_file)}
    )


def _await(job: Job, condition: Any, timeout: float, what: str) -> Any:
    try:
        return wait_for(condition, timeout, what)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def _switched(nodes: list[Node], count: int) -> bool:
    return all(len(n.events("rate")) >= count for n in nodes)


def test_every_worker_follows_the_budget_at_the_same_step_and_no_step_is_lost(tmp_path: Path) -> None:
    budget = tmp_path / "memory-budget-mib"
    with running_job(
        tmp_path, min_replicas=2, max_replicas=2, steps=STEPS, script=CNN, extra_args=SLOW_STEPS
    ) as job:
        nodes = [job.start_node(env=_band_limited(job, budget)) for _ in range(2)]
        _await(job, lambda: (nodes[0].last_step() or {}).get("step", 0) >= 3, 180, "training")
        _write(budget, "1")
        _await(job, lambda: _switched(nodes, 1), 60, "every worker to compress")
        _write(budget, str(1 << 20))
        _await(job, lambda: _switched(nodes, 2), 60, "every worker back to the full spectrum")
        assert job.wait_all(nodes, 180) == [0, 0], job.logs()
        final = job.final_checkpoint()
        progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
        logs = job.logs()
    switches = [[(e["step"], e["rate"], e["previous"]) for e in n.events("rate")] for n in nodes]
    assert switches[0] == switches[1], "the same switches at the same steps on every worker"
    (down, rate, was), (up, back, before) = switches[0]
    assert (rate, was, back, before) == (0.75, 0.0, 0.0, 0.75) and 3 <= down < up < STEPS
    for node in nodes:
        trained = [(e["step"], e["world"]) for e in node.events("step")]
        assert trained == [(step, 2) for step in range(1, STEPS + 1)], "every step once, in one world"
    assert final["step"] == STEPS and final["compression_rate"] == 0.0
    assert final["footprint"] is not None, "the measurement travels in the state"
    assert progress["step"] == STEPS and progress["compressionRate"] == 0.0
    assert logs.count("no compression rate fits the memory budget of 1 MiB") == 1, "rank 0 alone, once"
