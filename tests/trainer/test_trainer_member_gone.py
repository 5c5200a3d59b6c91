"""Trainer tier: a world re-forms when one of its members goes, even when no collective of the others
fails (tests/trainer/quiet_script.py never calls one after its process group forms): the rendezvous
tells the survivors' agents (docs/design/rendezvous.md, "A member gone"). Real processes, a real
torch elastic rendezvous: three nodes; one leaves (SIGTERM, a pod deleted), one is lost whole
(SIGKILL of its process tree, a node gone, found by its heartbeats' expiry); one, frozen, is declared
gone by the operator (through the rendezvous pod's endpoint) before its heartbeats expire.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from ebbflow_api.contract import ENV_POD_NAME
from ebbflow_devtools.testing.trainer_cluster import Job, running_job
from ebbflow_devtools.waiting import NotYet, wait_for

QUIET_SCRIPT = str(Path(__file__).with_name("quiet_script.py"))
# Longer than the whole test: a world ends only when the rendezvous re-forms it.
WORLD_SECONDS = 900
WORLD_DEADLINE_S = 120


def _worlds(events: Path) -> list[int]:
    if not events.exists():
        return []
    return [json.loads(line)["world"] for line in events.read_text().splitlines()]


def _world_forms(job: Job, events: Path, size: int, after: int) -> int:
    """Once the newest world, started after the first `after`, has `size` members; the number of
    worlds started by then."""

    def formed() -> int | NotYet:
        worlds = _worlds(events)
        return len(worlds) if len(worlds) > after and worlds[-1] == size else NotYet(f"worlds: {worlds}")

    try:
        return wait_for(formed, WORLD_DEADLINE_S, f"a world of {size}")
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def test_a_world_re_forms_when_a_member_leaves_or_is_lost_though_no_collective_fails(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    with running_job(tmp_path, min_replicas=1, max_replicas=3, script=QUIET_SCRIPT) as job:
        args = ("--events", str(events), "--seconds", str(WORLD_SECONDS))
        first, leaver, lost = (job.start_torchrun_node(*args) for _ in range(3))
        started = _world_forms(job, events, 3, 0)
        leaver.process.send_signal(signal.SIGTERM)
        started = _world_forms(job, events, 2, started)
        lost.kill_tree()
        _world_forms(job, events, 1, started)
        assert first.process.poll() is None, job.logs()


def test_a_member_the_operator_declares_gone_leaves_the_rendezvous_at_once(tmp_path: Path) -> None:
    """A frozen node (its liveness port accepts, its heartbeats have not expired yet) declared gone by
    the operator, through the rendezvous pod's endpoint with the job's token: the rendezvous removes it,
    and the survivors re-form without it, naming the operator's evidence."""
    events = tmp_path / "events.jsonl"
    settings = {"min_replicas": 1, "max_replicas": 3, "script": QUIET_SCRIPT, "rendezvous_token": "job-token"}
    with running_job(tmp_path, **settings) as job:
        args = ("--events", str(events), "--seconds", str(WORLD_SECONDS))
        nodes = [
            job.start_torchrun_node(*args, env=job.environment(**{ENV_POD_NAME: f"pod-{i}"}))
            for i in range(3)
        ]
        started = _world_forms(job, events, 3, 0)
        nodes[2].freeze()
        assert job.declare_gone({"pod-2": "its node is gone"}, token="another job's")[0] == 401
        status, answer = job.declare_gone({"pod-2": "its node is gone", "pod-9": "never ran"})
        assert (status, answer) == (200, {"pod-2": "removed", "pod-9": "unknown pod"}), job.logs()
        _world_forms(job, events, 2, started)
        assert job.declare_gone({"pod-2": "its node is gone"}) == (200, {"pod-2": "not a member"})
        evidence = "left (found gone: declared by the operator: its node is gone)"
        assert all(evidence in node.log.read_text() for node in nodes[:2]), job.logs()
