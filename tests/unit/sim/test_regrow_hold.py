"""The regrowth hold in the simulator: a job the policy shrank keeps that size for the policy's
`regrow_hold_s`, as the operator's `decide` caps it (`planner.regrow_cap`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ebbflow_operator.policies.greedy import REGROW_HOLD_S
from ebbflow_sim import simulation
from ebbflow_sim.allocation import demand
from ebbflow_sim.job_state import JobState

from .test_sim import config, job, sim


@pytest.mark.parametrize(
    ("reclaimed", "now", "maximum"),
    [
        pytest.param(None, 100.0, 4, id="never-shrunk"),
        pytest.param((90.0, 2), 100.0, 2, id="shrunk-10s-ago-held-at-its-size"),
        pytest.param((90.0, 0), 100.0, 1, id="shrunk-to-none-may-come-back-at-its-minimum"),
        pytest.param((90.0, 2), 90.0 + REGROW_HOLD_S, 4, id="the-hold-is-over"),
    ],
)
def test_the_demand_is_capped_while_the_hold_lasts(
    reclaimed: tuple[float, int] | None, now: float, maximum: int
) -> None:
    state = JobState(job(lo=1, hi=4), reclaimed=reclaimed)
    assert demand(state, frozenset({"n0"}), now, REGROW_HOLD_S).max == maximum
    assert demand(state, frozenset({"n0"})).max == 4  # the rigid baselines hold nothing


@pytest.mark.parametrize("policy", ["goodput", "quality"])
def test_a_job_grown_onto_a_placement_slower_than_predicted_flips_back_once_a_hold(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy packs the job's second worker beside its first; the scheduler spreads it onto the
    other node, where sync is 40x slower; measured there, the job is shrunk, then grown again."""
    slow_across_nodes = replace(job("a", lo=1, hi=2, seconds=600.0), alpha_net=0.2)
    cfg = config(gpus=8, per_node=4, tick_s=5.0, debounce_s=0.0, rescale_pause_s=2.8)
    held = sim([slow_across_nodes], policy, cfg).states["a"]
    assert held.finished_s is not None
    round_trips = held.finished_s / REGROW_HOLD_S + 1
    assert held.rescales <= 2 * round_trips
    monkeypatch.setattr(
        simulation, "demand", lambda state, eligible, now=0.0, hold=0.0: demand(state, eligible)
    )
    unheld = sim([slow_across_nodes], policy, cfg).states["a"]
    assert unheld.rescales > 2 * round_trips  # a flip at nearly every pass
    assert held.finished_s < unheld.finished_s
