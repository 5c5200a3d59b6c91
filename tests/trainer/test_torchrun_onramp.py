"""Trainer tier: a script written for torchrun (examples/digits/torchrun_ddp.py: DistributedDataParallel,
init_process_group from the environment, its own checkpoint) run by ``ebbflow-train torchrun`` on real
processes, through a join, a SIGTERM and a SIGKILL, unmodified and with the opt-ins (``--elastic``).

Unmodified, every world change restarts the script, which resumes from its own checkpoint: a restart
loses at most the steps since it. With the opt-ins, a join or a leave stops every rank after the same
step and the next world starts from the state in node-local memory (0 steps lost); a SIGKILL loses the
steps since the survivors' last handoff (they hand over after every step here).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import REPO, Job, running_job
from ebbflow_devtools.waiting import wait_for

SCRIPT = str(REPO / "examples" / "digits" / "torchrun_ddp.py")
STEPS, CHECKPOINT_EVERY, GLOBAL_BATCH = 200, 20, 384
# Steps each world trains before the next event, so that every event happens mid-training.
STEPS_PER_WORLD = 20


def _events(job: Job) -> list[dict[str, Any]]:
    """Rank 0's events in the order written (every world's rank 0 appends to the same file)."""
    path = job.root / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _trains_at(job: Job, world: int, starts_before: int) -> dict[str, Any]:
    """The newest step once a world of ``world`` (started after ``starts_before`` starts) has trained
    STEPS_PER_WORLD steps."""

    def reached() -> dict[str, Any] | None:
        events = _events(job)
        starts = [i for i, e in enumerate(events) if e["event"] == "start"]
        if len(starts) <= starts_before or events[starts[-1]]["world"] != world:
            return None
        steps = [e for e in events[starts[-1] :] if e["event"] == "step"]
        return steps[-1] if len(steps) >= STEPS_PER_WORLD else None

    try:
        return wait_for(reached, 240, f"a world of {world} training {STEPS_PER_WORLD} steps")
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def _restarts(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each start after the first, with the steps it lost: the newest step logged before it, less
    the step it resumed from."""
    found, newest = [], 0
    for event in events:
        if event["event"] == "step":
            newest = event["step"]
        elif event["event"] == "start" and newest:
            found.append((event, newest - event["step"]))
    return found


@pytest.mark.parametrize("opt_ins", [False, True], ids=["unmodified", "opt-ins"])
def test_a_torchrun_script_trains_through_a_join_a_sigterm_and_a_sigkill(
    tmp_path: Path, opt_ins: bool
) -> None:
    with running_job(
        tmp_path,
        min_replicas=1,
        max_replicas=3,
        virtual_nodes=12,
        global_batch_size=GLOBAL_BATCH,
        script=SCRIPT,
    ) as job:
        args = ["--checkpoint-dir", str(tmp_path / "checkpoints"), "--steps", str(STEPS)]
        args += ["--checkpoint-every", str(CHECKPOINT_EVERY), "--events", str(tmp_path / "events.jsonl")]
        args += ["--global-batch", str(GLOBAL_BATCH), "--simulated-sample-seconds", "0.0005"]
        args += ["--elastic"] if opt_ins else []
        first, leaver = job.start_torchrun_node(*args), job.start_torchrun_node(*args)
        _trains_at(job, 2, 0)
        crasher = job.start_torchrun_node(*args)  # a join
        _trains_at(job, 3, 1)
        leaver.process.send_signal(signal.SIGTERM)  # a pod deleted: leave
        assert job.wait_all([leaver], 60) == [0], job.logs()
        _trains_at(job, 2, 2)
        crasher.kill_tree()  # a node lost: no goodbye
        _trains_at(job, 1, 3)
        assert job.wait_all([first], 300) == [0], job.logs()

    events = _events(job)
    (done,) = [e for e in events if e["event"] == "done"]
    assert done["step"] == STEPS and done["world"] == 1 and done["accuracy"] >= 0.95, done
    restarts = _restarts(events)
    assert [start["world"] for start, _ in restarts] == [3, 2, 1], restarts
    restart_counts = [e["restart"] for e in events if e["event"] == "start"]
    assert restart_counts == sorted(set(restart_counts)), (
        f"TORCHELASTIC_RESTART_COUNT counts worlds: {restart_counts}"
    )
    if opt_ins:
        # The join and the SIGTERM stop every rank after one step; the SIGKILL's survivor handed over
        # the last step it completed.
        assert [(start["source"], lost) for start, lost in restarts] == [("memory", 0)] * 3, restarts
    else:
        assert all(start["source"] == "checkpoint" for start, _ in restarts), restarts
        assert all(0 <= lost < CHECKPOINT_EVERY for _, lost in restarts), restarts
        assert all(start["step"] % CHECKPOINT_EVERY == 0 for start, _ in restarts), restarts


@pytest.mark.parametrize(
    ("source", "code", "words"),
    [
        pytest.param(
            "import sys\nsys.exit('train.py: error: unrecognized arguments: --lr')\n",
            contract.EXIT_SCRIPT_FAILED,
            "unrecognized arguments: --lr",
            id="exits-non-zero-at-once",
        ),
        pytest.param(
            "import time\ntime.sleep(1)\n",
            contract.EXIT_INVALID_CONFIG,
            "without ever calling torch.distributed.init_process_group()",
            id="never-calls-init-process-group",
        ),
    ],
)
def test_a_scripts_own_failure_ends_the_job_with_its_words(
    tmp_path: Path, source: str, code: int, words: str
) -> None:
    """Restarting would replay these, so rank 0's launcher, which holds the world's store and so can
    tell, exits with a code the operator fails the job on and says why in the pod's termination
    message, instead of restarting the script forever."""
    script = tmp_path / "broken.py"
    script.write_text(source)
    with running_job(tmp_path, min_replicas=2, max_replicas=2, script=str(script)) as job:
        messages = [tmp_path / f"termination-{index}" for index in range(2)]
        nodes = [
            job.start_torchrun_node(env=job.environment(**{contract.ENV_TERMINATION_MESSAGE_PATH: str(path)}))
            for path in messages
        ]
        ended = wait_for(
            lambda: [n for n in nodes if n.process.poll() == code] or None, 120, f"an exit {code}"
        )
    said = messages[nodes.index(ended[0])].read_text()
    assert words in said, said
