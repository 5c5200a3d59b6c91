"""Training code teams already have, submitted as the examples show it: the unmodified torchrun DDP
script (examples/jobs/digits-torchrun.yaml) and the Hugging Face Trainer script
(examples/jobs/hf-trainer.yaml), side by side through a node taken away and given back.

Each worker of the torchrun job takes three of a node's four GPUs and each Trainer worker one, so each
node runs one worker of each job and the node taken away (neither job's rendezvous store on it)
takes a worker from both. Both scripts keep their checkpoints on a ReadWriteMany volume (the
hostPath claim of examples/volumes/shared-checkpoints.yaml, made for this test) and write rank 0's
events there, which the test reads from the host's side of the nodes' /shared mount.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ebbflow_devtools.demo import target_accuracy
from ebbflow_devtools.kind import E2E_NAMESPACE, Kind, poll
from ebbflow_devtools.kind_jobs import example
from ebbflow_devtools.waiting import NotYet
from ebbflow_operator.decision.manifests import rendezvous_name

from . import jobs
from .jobs import JOB_DEADLINE_S

CLAIM = "e2e-own-loops"
DDP_STEPS, DDP_CHECKPOINT_EVERY = 400, 20
# Device time per sample: 0.2 s a step in a world of three (128 samples a worker), 0.3 s in a world of
# two, so the script is still training when its world of three forms again: the node's return is
# timed by Kubernetes, not by the script (docs/ci.md, stop 61), and the Trainer beside it takes as long.
DDP_SAMPLE_SECONDS = 0.0016
ON_TWO_STEPS = 20
HF_STEPS = 60  # examples/jobs/hf-trainer.yaml's --max-steps
# 1.2 s a step in a world of three (8 samples a worker): the Trainer is still training when the node
# is taken away and after its world re-forms (unpaced, it can finish its 60 steps before either).
HF_SAMPLE_SECONDS = 0.15


@pytest.fixture
def shared_claim(kind: Kind, namespace: str) -> Iterator[Path]:
    with jobs.shared_claim(kind, CLAIM, ("digits-torchrun", "hf-trainer")) as shared:
        yield shared


def _job(name: str, gpus: int, extra_args: list[str]) -> dict[str, Any]:
    """The example's job on this test's claim, with `gpus` GPUs a worker."""
    (job,) = example(f"jobs/{name}.yaml")
    job = copy.deepcopy(job)
    pod = job["spec"]["template"]["spec"]
    pod["volumes"][0]["persistentVolumeClaim"]["claimName"] = CLAIM
    container = pod["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = gpus
    container["command"] += extra_args
    return dict(job)


def _events(shared: Path, job: str) -> list[dict[str, Any]]:
    path = shared / job / "events.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # The last line may be half written: every complete line is.
    return [json.loads(line) for line in lines if line.endswith("}")]


def _starts(shared: Path, job: str) -> list[dict[str, Any]]:
    return [e for e in _events(shared, job) if e["event"] == "start"]


def _last_step(shared: Path, job: str) -> int:
    return max((e["step"] for e in _events(shared, job) if e["event"] in ("step", "start")), default=0)


def _world_of(shared: Path, job: str, size: int, after: int) -> dict[str, Any] | NotYet:
    """The first world of `size` that started after the first `after` starts, once it trained a step;
    else what rank 0 wrote last (a timeout's message then says where the script stopped)."""
    events = _events(shared, job)
    later = [s for s in _starts(shared, job)[after:] if s["world"] == size]
    if later and any(e["event"] == "step" and e["time"] > later[0]["time"] for e in events):
        return later[0]
    return NotYet(f"{job}'s last events: {events[-3:]}")


def _node_to_take(kind: Kind) -> str:
    """A node with a worker of each job and neither job's rendezvous store."""
    stores = {
        kind.json("-n", E2E_NAMESPACE, "get", "pod", rendezvous_name(job))["spec"]["nodeName"]
        for job in ("digits-torchrun", "hf-trainer")
    }
    hosts = [set(jobs.status(kind, job)["workerNodes"].values()) for job in ("digits-torchrun", "hf-trainer")]
    candidates = sorted((hosts[0] & hosts[1]) - stores)
    assert candidates, f"no node hosts both jobs' workers away from their stores: {hosts}, stores {stores}"
    return str(candidates[0])


def test_a_torchrun_script_and_a_hugging_face_trainer_train_through_a_node_taken_away_and_given_back(
    kind: Kind, namespace: str, operator: str, shared_claim: Path
) -> None:
    ddp_args = ["--steps", str(DDP_STEPS), "--simulated-sample-seconds", str(DDP_SAMPLE_SECONDS)]
    jobs.apply(kind, _job("digits-torchrun", 3, ddp_args))
    jobs.apply(kind, _job("hf-trainer", 1, ["--simulated-sample-seconds", str(HF_SAMPLE_SECONDS)]))

    def three_each() -> bool:
        latest = [_starts(shared_claim, job)[-1:] for job in ("digits-torchrun", "hf-trainer")]
        on_three = all(s and s[0]["world"] == 3 for s in latest)
        return on_three and _last_step(shared_claim, "digits-torchrun") >= 2 * DDP_CHECKPOINT_EVERY

    poll(three_each, JOB_DEADLINE_S, "both jobs training on three workers")
    node = _node_to_take(kind)
    before = {job: len(_starts(shared_claim, job)) for job in ("digits-torchrun", "hf-trainer")}
    taken_at = time.monotonic()
    kind.take_node_away(node)
    pair = poll(
        lambda: _world_of(shared_claim, "digits-torchrun", 2, before["digits-torchrun"]),
        JOB_DEADLINE_S,
        "the torchrun script training on two workers",
    )
    resumed_s = time.monotonic() - taken_at
    # A world change restarts the script, which resumes from its own checkpoint, as under torchrun.
    assert pair["source"] == "checkpoint" and pair["step"] % DDP_CHECKPOINT_EVERY == 0, pair
    poll(
        lambda: _world_of(shared_claim, "hf-trainer", 2, before["hf-trainer"]),
        JOB_DEADLINE_S,
        "the Trainer on two workers",
    )

    step = _last_step(shared_claim, "digits-torchrun")
    poll(
        lambda: _last_step(shared_claim, "digits-torchrun") >= step + ON_TWO_STEPS,
        JOB_DEADLINE_S,
        f"{ON_TWO_STEPS} steps on two",
    )
    # Counted before the node returns: its world of three may start while bring_node_back still waits.
    middle = {job: len(_starts(shared_claim, job)) for job in ("digits-torchrun", "hf-trainer")}
    kind.bring_node_back(node)
    poll(
        lambda: _world_of(shared_claim, "digits-torchrun", 3, middle["digits-torchrun"]),
        JOB_DEADLINE_S,
        "the torchrun script on three workers again",
    )

    ddp = jobs.wait_phase(kind, "digits-torchrun", "Succeeded", timeout=2 * JOB_DEADLINE_S)
    (done,) = [e for e in _events(shared_claim, "digits-torchrun") if e["event"] == "done"]
    assert done["step"] == DDP_STEPS and done["accuracy"] >= target_accuracy(), done
    # Without reports from the script the operator ran it on its priors; its status still counts the
    # worlds the job went through.
    assert ddp.get("preemptions", 0) >= 1, ddp

    hf = jobs.wait_phase(kind, "hf-trainer", "Succeeded", timeout=2 * JOB_DEADLINE_S)
    hf_starts = _starts(shared_claim, "hf-trainer")
    # Every world keeps the global batch of 24: 2 samples a device x accumulation x world size.
    assert all(s["accumulation"] * 2 * s["world"] == 24 for s in hf_starts), hf_starts
    # A graceful leave (the drained node's SIGTERM) hands the Trainer's checkpoint over in memory.
    assert any(s["source"] == "memory" for s in hf_starts[1:]), hf_starts
    assert [e["step"] for e in _events(shared_claim, "hf-trainer") if e["event"] == "done"][-1] == HF_STEPS
    progress = hf["progress"]
    assert progress["step"] == HF_STEPS and progress["eval"]["metrics"]["loss"] > 0, progress
    jobs.record_figures(
        "own-loops",
        {
            "node_taken_to_torchrun_world_of_two_seconds": round(resumed_s, 1),
            "torchrun_starts": _starts(shared_claim, "digits-torchrun"),
            "hf_starts": hf_starts,
        },
    )
