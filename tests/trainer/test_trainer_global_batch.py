"""Trainer tier: batch-size co-adaptation with real launchers, elastic agents, workers and gloo on CPU.

The test plays the operator and the kubelet: it writes the global batch B into the file the
workers' environment names (atomically, as the kubelet swaps a projected volume's files). The digits
example trains with V=4 from B=32; with spec.maxGlobalBatchSize=64 and adascale B may go up to 64.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import (
    HELD_DIGITS,
    Job,
    Node,
    admissions,
    assert_bitwise_equal,
    running_job,
)
from ebbflow_devtools.waiting import wait_for

V, B, MAX = 4, 32, 64
# Modelled device time per virtual node: the run lasts long enough to change B along the way.
SLOW_STEPS = ["--simulated-vnode-seconds", "0.02"]


def _write(path: Path, text: str) -> None:
    """What the kubelet does to a projected file: the new content appears whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _adaptive(job: Job, batch_file: Path, **overrides: str) -> dict[str, str]:
    return job.environment(
        **{
            contract.ENV_LR_SCALING: "adascale",
            contract.ENV_MAX_GLOBAL_BATCH_SIZE: str(MAX),
            contract.ENV_GLOBAL_BATCH_SIZE_FILE: str(batch_file),
            **overrides,
        }
    )


def _await(job: Job, condition: Any, timeout: float, what: str) -> Any:
    try:
        return wait_for(condition, timeout, what)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def _batches_by_step(nodes: list[Node]) -> dict[int, set[int]]:
    """The global batch every worker trained each completed step with."""
    found: dict[int, set[int]] = {}
    for node in nodes:
        for record in node.events("step"):
            found.setdefault(record["step"], set()).add(record["batch"])
    return found


def _assert_samples_add_up(job: Job, nodes: list[Node], steps: int) -> int:
    """Every step's B agreed by all workers, and the samples the job trained on are their sum: no
    sample skipped or repeated at a switch. Returns that sum."""
    batches = _batches_by_step(nodes)
    assert sorted(batches) == list(range(1, steps + 1))
    assert all(len(seen) == 1 for seen in batches.values()), batches
    total = sum(next(iter(seen)) for seen in batches.values())
    final = job.final_checkpoint()
    assert final["step"] == steps
    assert (
        final["position"]["samples"] + (steps - final["position"]["step"]) * final["global_batch_size"]
        == total
    )
    progress = json.loads((job.checkpoint_dir / "progress.json").read_text())
    assert (progress["step"], progress["samples"]) == (steps, total)
    assert progress["microBatch"] * V == final["global_batch_size"], "the operator reads B as microBatch x V"
    return total


def test_every_worker_switches_to_a_new_global_batch_at_the_same_step(tmp_path: Path) -> None:
    steps = 100
    batch_file = tmp_path / "global-batch-size"
    with running_job(tmp_path, min_replicas=2, max_replicas=2, steps=steps, extra_args=SLOW_STEPS) as job:
        nodes = [job.start_node(env=_adaptive(job, batch_file)) for _ in range(2)]
        _await(job, lambda: (nodes[0].last_step() or {}).get("step", 0) >= 5, 120, "training")
        _write(batch_file, "34")  # not a multiple of V: ignored with one log line
        ignored = "ignoring the global batch size '34'"
        _await(
            job, lambda: any(ignored in n.log.read_text() for n in nodes), 60, "the ignored value's log line"
        )
        _write(batch_file, str(MAX))
        _await(job, lambda: all(n.events("batch") for n in nodes), 120, "every worker to switch")
        assert job.wait_all(nodes, 300) == [0, 0], job.logs()
        switches = [n.events("batch") for n in nodes]
        total = _assert_samples_add_up(job, nodes, steps)
        logs = "".join(n.log.read_text() for n in nodes)
    assert all(len(found) == 1 for found in switches), switches
    (at,) = {found[0]["step"] for found in switches}
    assert {(found[0]["batch"], found[0]["previous"]) for found in switches} == {(MAX, B)}
    assert _batches_by_step(nodes) == {s: {B if s <= at else MAX} for s in range(1, steps + 1)}
    assert total == at * B + (steps - at) * MAX
    assert logs.count(ignored) == 1, "an ignored value is logged once, by rank 0"
    assert "multiple of spec.virtualNodes" in logs


def test_without_a_largest_batch_the_file_changes_nothing(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    """The operator may project the annotation into every pod: without spec.maxGlobalBatchSize the
    trainer never reads it, and the run is bitwise the calm one (V=4, B=32, 200 steps). A static
    world of two giving the calm one-worker bits is also deterministic mode's promise in its plainest
    form (larger worlds: tests/trainer/test_trainer_deterministic.py, test_trainer_multiproc.py)."""
    batch_file = tmp_path / "global-batch-size"
    _write(batch_file, str(MAX))
    with running_job(tmp_path, min_replicas=2, max_replicas=2) as job:
        env = job.environment(**{contract.ENV_GLOBAL_BATCH_SIZE_FILE: str(batch_file)})
        nodes = [job.start_node(env=env) for _ in range(2)]
        assert job.wait_all(nodes, 300) == [0, 0], job.logs()
        assert not any(n.events("batch") for n in nodes)
        assert _assert_samples_add_up(job, nodes, 200) == 200 * B
        assert set(job.world_sizes_by_step().values()) == {2}
        final = job.final_checkpoint()
    assert final["step"] == calm_reference["step"] == 200
    assert_bitwise_equal(final, calm_reference)


def test_a_newcomer_trains_at_the_global_batch_of_the_state_it_receives(tmp_path: Path) -> None:
    """The first two workers switch to B=64; a third joins whose file asks for nothing (it is empty,
    as a new pod's is before the kubelet's first sync): it receives B with the state, and the job
    keeps training at 64 whichever worker becomes rank 0."""
    steps, hold = 60, tmp_path / "hold"
    batch_file, newcomer_file = tmp_path / "global-batch-size", tmp_path / "newcomer-global-batch-size"
    _write(batch_file, str(MAX))
    _write(newcomer_file, "")
    with running_job(
        tmp_path, min_replicas=2, max_replicas=3, steps=steps, extra_args=SLOW_STEPS, script=HELD_DIGITS
    ) as job:
        first = [job.start_node(env=_adaptive(job, batch_file, DIGITS_HOLD=str(hold))) for _ in range(2)]
        _await(job, lambda: all(n.events("batch") for n in first), 120, "the first world to switch")
        # Hold training while the newcomer starts; release it once both agents admitted it (gave their
        # workers its world, or asked them to stop at the next step boundary, well within the leave
        # grace of 30 s after which they would kill them).
        hold.touch()
        newcomer = job.start_node(env=_adaptive(job, newcomer_file, DIGITS_HOLD=str(hold)))
        _await(
            job,
            lambda: all(admissions(n.log.read_text()) > 0 for n in first),
            180,
            "the agents to admit the newcomer",
        )
        hold.unlink()
        assert job.wait_all([*first, newcomer], 300) == [0, 0, 0], job.logs()
        nodes = [*first, newcomer]
        _assert_samples_add_up(job, nodes, steps)
        # Its first world: with both others, or (a node left behind on a busy machine) with one.
        joined = newcomer.events("generation")[0]
        final = job.final_checkpoint()
    assert joined["source"] == "peer" and 1 <= joined["step"] < steps
    assert not newcomer.events("batch"), "the newcomer never switched: it started at the state's B"
    assert {r["batch"] for r in newcomer.events("step")} == {MAX}
    assert final["global_batch_size"] == MAX
