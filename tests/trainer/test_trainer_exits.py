"""Trainer tier: the exit code of a worker pod tells the truth.

A launcher that trained to the end exits 0 (and leaves no thread running into interpreter exit,
which once turned 1 run in 32 into SIGABRT); a step whose loss or gradient is not finite is skipped
on every worker alike, and a job that keeps diverging stops with ``contract.EXIT_NONFINITE_LOSS``.
Corrupt steps come from ``corrupt_digits.py``: the digits example with NaN samples exactly where
chosen steps draw their data.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_cluster import (
    Job,
    Node,
    assert_bitwise_equal,
    parameters_of,
    running_job,
)
from ebbflow_devtools.waiting import wait_for
from ebbflow_trainer.__main__ import STOPPED_BEFORE_JOINING

HERE = Path(__file__).resolve().parent
CORRUPT_DIGITS = str(HERE / "corrupt_digits.py")
SLOW_LOADING_DIGITS = str(HERE / "slow_loading_digits.py")
STEPS = 30  # within the digits' first epoch (56 steps at B=32), see corrupt_digits.py
CORRUPT_STEP = 10  # 0-based index: the journal calls it step 11
CLEAN_STEPS = 10  # what a diverged job keeps: the state after the last finite step


def _corrupt_env(job: Job, steps: str, **overrides: str) -> dict[str, str]:
    return job.environment(CORRUPT_STEPS=steps, **overrides)


def _skipped(node: Node) -> list[int]:
    return [r["step"] for r in node.events("step") if r["skipped"]]


def _assert_close(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    a, b = parameters_of(ours), parameters_of(reference)
    flat_a = torch.cat([a[name].flatten() for name in sorted(a)])
    flat_b = torch.cat([b[name].flatten() for name in sorted(b)])
    relative = float((flat_a - flat_b).norm() / flat_b.norm())
    assert relative <= 1e-6, f"relative difference {relative:.3e}"


def _train(root: Path, world_size: int, corrupt: str | None, **settings: Any) -> tuple[Job, list[Node]]:
    """Run a job to its end; the job object stays readable (journals, checkpoint) after the exit."""
    settings = {"min_replicas": world_size, "max_replicas": world_size, **settings}
    with running_job(root, **settings) as job:
        env = _corrupt_env(job, corrupt) if corrupt is not None else None
        nodes = [job.start_node(env=env) for _ in range(world_size)]
        job.wait_all(nodes, 300)
    return job, nodes


@pytest.fixture(scope="session")
def clean_prefix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The state after the first CLEAN_STEPS steps of a calm run: what a diverged job must keep."""
    job, [node] = _train(tmp_path_factory.mktemp("clean"), 1, None, steps=CLEAN_STEPS)
    assert node.process.returncode == 0, job.logs()
    return job.final_checkpoint()


@pytest.fixture(scope="session")
def one_corrupt_step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One worker, deterministic mode, one corrupt step: the reference every world size must match."""
    corrupt = f"{CORRUPT_STEP}:{CORRUPT_STEP + 1}"
    job, [node] = _train(
        tmp_path_factory.mktemp("one-corrupt"), 1, corrupt, steps=STEPS, script=CORRUPT_DIGITS
    )
    assert node.process.returncode == 0, job.logs()
    assert _skipped(node) == [CORRUPT_STEP + 1]
    losses = [r["loss"] for r in node.events("step")]
    assert math.isnan(losses[CORRUPT_STEP]) and all(
        math.isfinite(x) for i, x in enumerate(losses) if i != CORRUPT_STEP
    )
    final = job.final_checkpoint()
    assert final["step"] == STEPS
    assert all(torch.isfinite(t).all() for t in parameters_of(final).values())
    return final


def test_the_launcher_leaves_no_thread_running_when_it_returns(calm_run: dict[str, Any]) -> None:
    """The calm reference run's launcher is tests/trainer/launcher_probe.py (conftest.py)."""
    log: str = calm_run["log"]
    [line] = [x for x in log.splitlines() if x.startswith("threads alive at exit: ")]
    assert json.loads(line.removeprefix("threads alive at exit: ")) == [], log[-4000:]


@pytest.mark.parametrize(
    ("world_size", "mode", "batching"),
    [
        # The skip is agreed through one all-reduced flag, the same code at any world size; every
        # virtual node of the corrupt step is poisoned, so the batching cannot change who sees it.
        pytest.param(2, "deterministic", "static", id="deterministic-static-2"),
        pytest.param(2, "fast", "dynamic", id="fast-dynamic-2"),
    ],
)
def test_a_single_non_finite_step_is_skipped_everywhere_and_training_goes_on(
    tmp_path: Path, one_corrupt_step: dict[str, Any], world_size: int, mode: str, batching: str
) -> None:
    corrupt = f"{CORRUPT_STEP}:{CORRUPT_STEP + 1}"
    job, nodes = _train(
        tmp_path, world_size, corrupt, steps=STEPS, script=CORRUPT_DIGITS, mode=mode, batching=batching
    )
    assert [n.process.returncode for n in nodes] == [0] * world_size, job.logs()
    assert [_skipped(n) for n in nodes] == [[CORRUPT_STEP + 1]] * world_size, "every worker skips that step"
    final = job.final_checkpoint()
    assert final["step"] == STEPS
    if mode == "deterministic":
        assert_bitwise_equal(final, one_corrupt_step)
    else:
        _assert_close(final, one_corrupt_step)


@pytest.mark.parametrize(
    ("mode", "batching"),
    [
        pytest.param("deterministic", "static", id="deterministic-static"),
        pytest.param("fast", "dynamic", id="fast-dynamic"),
    ],
)
def test_a_diverged_job_keeps_its_last_finite_state_and_stops_with_the_nonfinite_code(
    tmp_path: Path, clean_prefix: dict[str, Any], mode: str, batching: str
) -> None:
    limit = 3
    with running_job(
        tmp_path,
        min_replicas=2,
        max_replicas=2,
        steps=STEPS,
        script=CORRUPT_DIGITS,
        mode=mode,
        batching=batching,
    ) as job:
        messages = [tmp_path / f"termination-{i}.log" for i in range(2)]
        nodes = [
            job.start_node(
                env=_corrupt_env(
                    job,
                    f"{CLEAN_STEPS}:",
                    **{
                        contract.ENV_MAX_NONFINITE_STEPS: str(limit),
                        contract.ENV_TERMINATION_MESSAGE_PATH: str(message),
                    },
                )
            )
            for message in messages
        ]
        codes = job.wait_all(nodes, 300)
    assert codes == [contract.EXIT_NONFINITE_LOSS] * 2, job.logs()
    skipped = list(range(CLEAN_STEPS + 1, CLEAN_STEPS + limit + 1))
    assert [_skipped(n) for n in nodes] == [skipped] * 2
    assert [len(n.events("generation")) for n in nodes] == [1, 1], "a diverged job must not be restarted"
    for message in messages:
        text = message.read_text()
        assert f"steps {skipped[0]}-{skipped[-1]}" in text and f"after step {CLEAN_STEPS}" in text, text
    final = job.final_checkpoint()
    assert final["step"] == skipped[-1]
    if mode == "deterministic":
        assert_bitwise_equal(final, clean_prefix)
    else:
        _assert_close(final, clean_prefix)


def _nonfinite_steps_metric(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("ebbflow_trainer_nonfinite_steps_total "):
            return float(line.split()[1])
    return None


def test_skipped_steps_are_counted_in_the_metric(tmp_path: Path) -> None:
    limit, port = 6, free_port()
    # Two-second steps leave several seconds to read the metric while the worker still runs.
    slow = ["--simulated-vnode-seconds", "0.5"]
    with running_job(
        tmp_path, min_replicas=1, max_replicas=1, steps=STEPS, script=CORRUPT_DIGITS, extra_args=slow
    ) as job:
        env = _corrupt_env(
            job, "2:", **{contract.ENV_MAX_NONFINITE_STEPS: str(limit), contract.ENV_METRICS_PORT: str(port)}
        )
        node = job.start_node(env=env)
        wait_for(lambda: len(_skipped(node)) >= 2, 240, "two skipped steps")
        seen = len(_skipped(node))
        counted = _nonfinite_steps_metric(port)
        assert counted is not None and seen <= counted <= limit, (seen, counted)
        assert job.wait_all([node], 240) == [contract.EXIT_NONFINITE_LOSS], job.logs()
    assert len(_skipped(node)) == limit


def test_sigterm_while_waiting_in_the_rendezvous_is_a_graceful_leave(tmp_path: Path) -> None:
    """A pod deleted before its worker trains (here: waiting for a second node) has nothing to hand
    over: it exits 0, not 143, like any pod that left when asked."""
    with running_job(tmp_path, min_replicas=2, max_replicas=2, steps=5) as job:
        node = job.start_node()
        wait_for(lambda: "attempts to join" in node.log.read_text(errors="replace"), 240, "the rendezvous")
        node.terminate()
        assert job.wait_all([node], 120) == [contract.EXIT_SUCCESS], job.logs()
    assert not node.events("step")


def test_sigterm_while_the_launcher_starts_leaves_at_once(tmp_path: Path) -> None:
    """A pod deleted while its launcher starts (here: loading a slow training script, before it joins
    the rendezvous) exits 0 at once and says so. In a pod the launcher is PID 1, where a signal with
    no handler is discarded: it would join, train, and be killed when the grace period ran out."""
    loading, loaded = tmp_path / "loading.marker", tmp_path / "loaded.marker"
    with running_job(tmp_path, script=SLOW_LOADING_DIGITS, steps=5) as job:
        env = job.environment(LOADING_MARKER=str(loading), LOADED_MARKER=str(loaded))
        node = job.start_node(env=env)
        wait_for(loading.exists, 120, "the launcher loading its training script")
        node.terminate()
        code = node.process.wait(timeout=30)
    log = node.log.read_text(errors="replace")
    assert code == contract.EXIT_SUCCESS, log
    assert STOPPED_BEFORE_JOINING in log, log
    assert "attempts to join" not in log, log
