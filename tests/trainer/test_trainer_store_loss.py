"""Trainer tier: the rendezvous store is lost mid-run and a new, empty one comes up at the same address.

That is what a Kubernetes cluster gives when the rendezvous pod's node goes: the operator starts a
replacement pod behind the same Service, and the new store holds nothing (no rendezvous state, no
generation counter, no last step). The world trains on while the store is away, re-forms on the new
store once it answers, and resumes from memory, ending bitwise equal to a calm run; a world that
breaks meanwhile (a node killed) hands its state over and waits for the new store; a store that never
comes back stops the launchers at a step boundary after ``--store-loss-timeout``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ebbflow_api import contract
from ebbflow_devtools.testing.trainer_cluster import HELD_DIGITS, Job, Node, assert_bitwise_equal, running_job
from ebbflow_devtools.waiting import wait_for
from ebbflow_trainer.launch.launcher import EXIT_STORE_LOST

# About 0.1 s per step at world size 2 (two virtual nodes each): 200 steps outlast the outage.
SLOW_STEPS = ["--simulated-vnode-seconds", "0.05"]
KILL_AT_STEP = 10
# The store stays away at least this long (three heartbeat intervals: every launcher notices), and
# until the world has trained this many steps without it.
DOWN_SECONDS = 3.0
STEPS_WITHOUT_STORE = 10
# What a survivor logs when its first round on the new store, past its last call, awaits another.
AWAITING_SURVIVORS = "the first round on the new store waits for"


def _step(node: Node) -> int:
    last = node.last_step()
    return last["step"] if last else 0


def _wait_for_step(job: Job, nodes: list[Node], step: int, what: str) -> None:
    try:
        wait_for(lambda: all(_step(n) >= step for n in nodes), 240, what)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{job.diagnose()}") from None


def _lose_the_store(job: Job, nodes: list[Node]) -> tuple[float, int]:
    """Kill the store mid-run; wait until the world has trained on without it. When, and at which step."""
    _wait_for_step(job, nodes, KILL_AT_STEP, f"step {KILL_AT_STEP}")
    lost_at = time.time()
    job.kill_rendezvous()
    killed_step = max(_step(n) for n in nodes)

    def trained_on() -> bool:
        for node in nodes:  # an exit ends the wait at once
            assert node.process.poll() is None, f"{node.name} exited without its store:\n{job.logs()}"
        return time.time() >= lost_at + DOWN_SECONDS and all(
            _step(n) >= killed_step + STEPS_WITHOUT_STORE for n in nodes
        )

    wait_for(trained_on, 240, f"{STEPS_WITHOUT_STORE} steps trained without the store")
    return lost_at, killed_step


def _generations(nodes: list[Node]) -> list[dict[str, Any]]:
    return [g for n in nodes for g in n.events("generation")]


def _assert_resumed_where_the_old_world_stopped(
    nodes: list[Node], before: list[dict[str, Any]], after: list[dict[str, Any]], size: int
) -> None:
    """The first world on the new store: a generation past every earlier one (the new store's
    counter started at zero; the launchers lifted it past what they ran), `size` workers, resumed
    from memory at the step where the old world stopped (a step boundary: no step lost)."""
    first_after = min(g["generation"] for g in after)
    assert first_after > max(g["generation"] for g in before)
    resumed = [g for g in after if g["generation"] == first_after]
    assert {g["world"] for g in resumed} == {size}
    sources = {g["source"] for g in resumed}
    assert "memory" in sources and sources <= {"memory", "peer"}, sources
    old_steps = [r["step"] for n in nodes for r in n.events("step") if r["generation"] < first_after]
    assert {g["step"] for g in resumed} == {max(old_steps)}


def test_a_new_store_at_the_same_address_lets_the_world_re_form_from_memory(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    with running_job(tmp_path, min_replicas=2, max_replicas=2, extra_args=SLOW_STEPS) as job:
        nodes = [job.start_node() for _ in range(2)]
        lost_at, _ = _lose_the_store(job, nodes)
        job.restart_rendezvous()
        assert job.wait_all(nodes, 300) == [0, 0], job.logs()

        before = [g for g in _generations(nodes) if g["time"] < lost_at]
        after = [g for g in _generations(nodes) if g["time"] >= lost_at]
        assert after, f"the world never re-formed on the new store\n{job.logs()}"
        _assert_resumed_where_the_old_world_stopped(nodes, before, after, size=2)
        assert max(r["step"] for n in nodes for r in n.events("step")) == 200
        final = job.final_checkpoint()
    assert_bitwise_equal(final, calm_reference)


def test_a_survivor_late_to_the_new_store_is_awaited_and_the_world_re_forms_from_memory(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    """One survivor finds the new store long after the other (its launcher stopped meanwhile): the
    early one, which could form a world alone (the minimum is 1), holds its round past the last call
    because the late one's launcher still answers, and the two re-form together from memory."""
    with running_job(tmp_path, min_replicas=1, max_replicas=2, extra_args=SLOW_STEPS) as job:
        early, late = nodes = [job.start_node() for _ in range(2)]
        lost_at, _ = _lose_the_store(job, nodes)
        late.pause_launcher()
        job.restart_rendezvous()

        def early_awaits_or_formed() -> bool:
            awaits = AWAITING_SURVIVORS in early.log.read_text()
            return awaits or any(g["time"] >= lost_at for g in early.events("generation"))

        wait_for(early_awaits_or_formed, 120, "the early survivor's first round on the new store")
        late.resume_launcher()
        assert AWAITING_SURVIVORS in early.log.read_text(), job.logs()
        assert job.wait_all(nodes, 300) == [0, 0], job.logs()

        before = [g for g in _generations(nodes) if g["time"] < lost_at]
        after = [g for g in _generations(nodes) if g["time"] >= lost_at]
        _assert_resumed_where_the_old_world_stopped(nodes, before, after, size=2)
        final = job.final_checkpoint()
    assert_bitwise_equal(final, calm_reference)


def test_a_world_broken_while_the_store_is_away_waits_for_the_new_store_and_resumes_from_memory(
    tmp_path: Path, calm_reference: dict[str, Any]
) -> None:
    with running_job(
        tmp_path, min_replicas=2, max_replicas=3, extra_args=SLOW_STEPS, script=HELD_DIGITS
    ) as job:
        nodes = job.start_held(3)

        def world_of_three() -> bool:
            return all((n.last_step() or {}).get("world") == 3 and _step(n) >= KILL_AT_STEP for n in nodes)

        wait_for(world_of_three, 240, f"a world of 3 at step {KILL_AT_STEP}")
        lost_at = time.time()
        job.kill_rendezvous()
        victim, survivors = nodes[2], nodes[:2]
        victim.kill_tree()
        # The broken world cannot re-form without a store: each survivor hands its state over at a step
        # boundary and its launcher waits (running) for a store at the same address.
        handoffs = [n.state_dir / "local-0" / "handoff.pt" for n in survivors]

        def handed_over() -> bool:
            for node in survivors:
                assert node.process.poll() is None, f"{node.name} exited without its store:\n{job.logs()}"
            written = all(h.exists() and h.stat().st_mtime >= lost_at for h in handoffs)
            return written and time.time() >= lost_at + DOWN_SECONDS

        wait_for(handed_over, 240, "the survivors' handoffs, their launchers waiting")
        restarted_at = time.time()
        job.restart_rendezvous()
        assert job.wait_all(survivors, 300) == [0, 0], job.logs()

        before = [g for g in _generations(survivors) if g["time"] < lost_at]
        after = [g for g in _generations(survivors) if g["time"] >= restarted_at]
        assert [g for g in _generations(survivors) if lost_at <= g["time"] < restarted_at] == []
        # At most the step the kill interrupted is redone.
        _assert_resumed_where_the_old_world_stopped(survivors, before, after, size=2)
        final = job.final_checkpoint()
    assert final["step"] == 200
    assert_bitwise_equal(final, calm_reference)


def test_a_store_that_never_comes_back_stops_the_launchers_at_a_step_boundary(tmp_path: Path) -> None:
    timeout = 5.0
    args = [*SLOW_STEPS, "--store-loss-timeout", str(timeout)]
    with running_job(tmp_path, min_replicas=2, max_replicas=2, extra_args=args) as job:
        messages = [tmp_path / f"termination-{i}.log" for i in range(2)]
        nodes = [
            job.start_node(env=job.environment(**{contract.ENV_TERMINATION_MESSAGE_PATH: str(m)}))
            for m in messages
        ]
        lost_at, killed_step = _lose_the_store(job, nodes)
        assert job.wait_all(nodes, timeout + 90) == [EXIT_STORE_LOST] * 2, job.logs()
        stopped_in = time.time() - lost_at

    assert stopped_in >= timeout
    for message in messages:
        assert "--store-loss-timeout" in message.read_text(), job.logs()
    # Every worker stopped at the same step boundary with its state handed over (the one asked to leave
    # records "left", the other "reform"), and rank 0 saved that step as the checkpoint.
    stops = [r for n in nodes for r in n.events() if r["event"] in ("left", "reform")]
    assert len(stops) == 2 and len({r["step"] for r in stops}) == 1, stops
    stopped_at = stops[0]["step"]
    assert killed_step + STEPS_WITHOUT_STORE <= stopped_at < 200
    assert max(_step(n) for n in nodes) == stopped_at
    assert job.final_checkpoint()["step"] == stopped_at
