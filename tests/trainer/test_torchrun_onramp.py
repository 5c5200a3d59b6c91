"""Trainer tier: scripts written for torchrun run by ``ebbflow-train torchrun`` on real processes, through
a join, a SIGTERM and a SIGKILL: examples/digits/torchrun_ddp.py (DistributedDataParallel,
init_process_group from the environment, its own checkpoint) unmodified and with the opt-ins
(``--elastic``), and examples/hf_trainer/train.py (a Hugging Face ``Trainer`` with ebbflow_trainer.hf).

Unmodified, every world change restarts the script, which resumes from its own checkpoint: a restart
loses at most the steps since it. With the opt-ins, a join or a leave stops every rank after the same
step and the next world starts from the state in node-local memory (0 steps lost); a SIGKILL loses the
steps since the survivors' last handoff (they hand over after every step here). The Trainer hands over
at a stop only, so its SIGKILL falls back to the newest of the handoff and its own checkpoints.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import REPO, Job, Node, running_job
from ebbflow_devtools.waiting import wait_for

SCRIPT = str(REPO / "examples" / "digits" / "torchrun_ddp.py")
HF_TRAINER = str(REPO / "examples" / "hf_trainer" / "train.py")
STEPS, CHECKPOINT_EVERY, GLOBAL_BATCH = 200, 20, 384
# Steps each world trains before the next event, so that every event happens mid-training.
STEPS_PER_WORLD = 20


def _events(job: Job) -> list[dict[str, Any]]:
    """Rank 0's events in the order written (every world's rank 0 appends to the same file)."""
    path = job.root / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _trains_at(job: Job, world: int, starts_before: int, steps_per_world: int = STEPS_PER_WORLD) -> None:
    """Once a world of ``world`` (started after ``starts_before`` starts) has trained ``steps_per_world``
    steps."""

    def reached() -> dict[str, Any] | None:
        events = _events(job)
        starts = [i for i, e in enumerate(events) if e["event"] == "start"]
        if len(starts) <= starts_before or events[starts[-1]]["world"] != world:
            return None
        steps = [e for e in events[starts[-1] :] if e["event"] == "step"]
        return steps[-1] if len(steps) >= steps_per_world else None

    try:
        wait_for(reached, 240, f"a world of {world} training {steps_per_world} steps")
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


def _through_a_join_a_sigterm_and_a_sigkill(
    job: Job, start: Callable[[], Node], steps_per_world: int = STEPS_PER_WORLD
) -> list[dict[str, Any]]:
    """Two nodes, a third joins, one leaves (SIGTERM: a pod deleted), one is lost (SIGKILL of its
    whole process tree: a node gone), each after ``steps_per_world`` steps; rank 0's events once the
    last node has finished alone."""
    first, leaver = start(), start()
    _trains_at(job, 2, 0, steps_per_world)
    crasher = start()
    _trains_at(job, 3, 1, steps_per_world)
    leaver.process.send_signal(signal.SIGTERM)
    assert job.wait_all([leaver], 60) == [0], job.logs()
    _trains_at(job, 2, 2, steps_per_world)
    crasher.kill_tree()
    _trains_at(job, 1, 3, steps_per_world)
    assert job.wait_all([first], 300) == [0], job.logs()
    return _events(job)


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
        events = _through_a_join_a_sigterm_and_a_sigkill(job, lambda: job.start_torchrun_node(*args))

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


HF_STEPS, HF_SAVE_STEPS, HF_STEPS_PER_WORLD = 80, 40, 10
# B = 2 samples a device x accumulation x world: 24 makes whole accumulations for worlds of 1, 2, 3.
HF_PER_DEVICE, HF_GLOBAL_BATCH = 2, 24
# The disturbed run's loss, averaged over windows of HF_WINDOW steps, against the calm run's: what
# differs is the summation order over a different number of ranks and each rank's dropout draws.
HF_WINDOW, HF_LOSS_TOLERANCE = 10, 0.02


def _hf_job(root: Path) -> tuple[Job, list[str]]:
    root.mkdir()
    job = Job(root=root, min_replicas=1, max_replicas=3, virtual_nodes=12, script=HF_TRAINER)
    job.global_batch_size = HF_GLOBAL_BATCH
    args = ["--output-dir", str(root / "output"), "--max-steps", str(HF_STEPS)]
    args += ["--save-steps", str(HF_SAVE_STEPS), "--eval-steps", str(HF_SAVE_STEPS)]
    args += ["--per-device-batch", str(HF_PER_DEVICE)]
    return job, [*args, "--events", str(root / "events.jsonl")]


def _window_means(events: list[dict[str, Any]]) -> list[float]:
    """Mean loss per window of steps, each step's loss from the world that trained it last."""
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "step"}
    assert sorted(losses) == list(range(1, HF_STEPS + 1)), "every step trained"
    return [
        sum(losses[s] for s in range(w, w + HF_WINDOW)) / HF_WINDOW for w in range(1, HF_STEPS + 1, HF_WINDOW)
    ]


def test_a_hugging_face_trainer_trains_through_a_join_a_sigterm_and_a_sigkill_as_a_calm_run(
    tmp_path: Path,
) -> None:
    """The global batch stays HF_GLOBAL_BATCH in every world (the accumulation each world chose); a join
    and a leave resume from the checkpoint handed over in memory, losing no step; the crash resumes
    from the newest checkpoint; the loss curve matches a calm run of one process."""
    calm, calm_args = _hf_job(tmp_path / "calm")
    disturbed, args = _hf_job(tmp_path / "disturbed")
    calm.start_rendezvous()
    disturbed.start_rendezvous()
    try:
        calm_node = calm.start_torchrun_node(*calm_args)
        events = _through_a_join_a_sigterm_and_a_sigkill(
            disturbed, lambda: disturbed.start_torchrun_node(*args), HF_STEPS_PER_WORLD
        )
        assert calm.wait_all([calm_node], 300) == [0], calm.logs()
    finally:
        calm.shutdown()
        disturbed.shutdown()

    starts = [e for e in events if e["event"] == "start"]
    assert [e["world"] for e in starts] == [2, 3, 2, 1], starts
    assert all(e["accumulation"] * HF_PER_DEVICE * e["world"] == HF_GLOBAL_BATCH for e in starts), starts
    restarts = _restarts(events)
    join, leave, crash = restarts
    assert [join[0]["source"], leave[0]["source"]] == ["memory", "memory"] and join[1] == leave[1] == 0, (
        restarts
    )
    assert crash[0]["source"] in ("memory", "checkpoint") and crash[1] <= HF_STEPS_PER_WORLD + 1, crash
    assert [e["step"] for e in events if e["event"] == "done"][-1] == HF_STEPS
    # The last step's progress is reported, not only one every few seconds (outside a cluster the
    # report is progress.json under the checkpoint path).
    progress = json.loads((disturbed.checkpoint_dir / "progress.json").read_text())
    assert progress["step"] == HF_STEPS and progress["worldSize"] == 1, progress
    # ... with the evaluation the Trainer ran at that step (the callback's on_evaluate).
    assert progress["eval"]["step"] == HF_STEPS and progress["eval"]["metrics"]["loss"] > 0, progress
    disturbed_means, calm_means = _window_means(events), _window_means(_events(calm))
    differences = [abs(d - c) / c for d, c in zip(disturbed_means, calm_means, strict=True)]
    assert max(differences) <= HF_LOSS_TOLERANCE, (disturbed_means, calm_means)
    assert calm_means[-1] < 0.6 * calm_means[0], f"the calm run learns: {calm_means}"


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


IGNORES_THE_STOP_FLAG = """
import sys, time
from pathlib import Path
import torch, torch.distributed as dist
from ebbflow_trainer import elastic
dist.init_process_group("gloo")
out = Path(sys.argv[1])
elastic.should_stop()  # from here SIGTERM is a flag...
torch.save({"step": 7}, out / "own.pt")
(out / "ready").write_text("")
while True:  # ...which the script never reads again
    time.sleep(0.1)
"""


def test_a_script_that_ignores_the_stop_flag_is_killed_after_the_grace_with_its_words(tmp_path: Path) -> None:
    """SIGTERM with a leave grace of 8 s: the launcher gives the script 3 s (its own margin is 5),
    kills it, says why in the termination message and exits with the leave-timed-out code (a leave,
    not a failure); what the script saved stays."""
    out, message = tmp_path / "out", tmp_path / "termination"
    out.mkdir()
    script = out / "stubborn.py"
    script.write_text(IGNORES_THE_STOP_FLAG)
    overrides = {contract.ENV_TERMINATION_MESSAGE_PATH: str(message), contract.ENV_LEAVE_GRACE_SECONDS: "8"}
    with running_job(tmp_path, min_replicas=1, max_replicas=1, script=str(script)) as job:
        node = job.start_torchrun_node(str(out), env=job.environment(**overrides))
        wait_for(lambda: (out / "ready").exists(), 120, "the script past its first should_stop()")
        node.terminate()
        code = node.process.wait(timeout=60)
    said = message.read_text()
    assert code == contract.EXIT_LEAVE_TIMED_OUT, (code, said)
    assert "did not stop within 3 s of SIGTERM" in said and "elastic.should_stop()" in said, said
    assert torch.load(out / "own.pt")["step"] == 7
