"""Preemptions with notice in the simulator: an elastic job that loses every worker hands its state
over (the trainer checkpoints on SIGTERM) instead of rolling back to its last periodic checkpoint."""

from __future__ import annotations

import pytest
from ebbflow_sim.cluster import initial_nodes
from ebbflow_sim.simulation import Simulation

from .test_sim import config, job


@pytest.mark.parametrize(
    ("policy", "notice", "loses_work"),
    [
        pytest.param("fair", False, True, id="elastic-no-notice-rolls-back"),
        pytest.param("fair", True, False, id="elastic-with-notice-hands-over"),
        pytest.param("goodput", True, False, id="goodput-with-notice-hands-over"),
        pytest.param("static", True, True, id="a-rigid-job-rolls-back-whatever-the-notice"),
    ],
)
def test_a_job_losing_every_worker(policy: str, notice: bool, loses_work: bool) -> None:
    """One job on the only node, which is preempted 300 s in (no periodic checkpoint by then)."""
    cfg = config(gpus=4, per_node=4, spot=1.0, preemption_notice=notice)
    simulation = Simulation([job("a", lo=1, hi=1, seconds=600.0)], policy, cfg)
    (node,) = initial_nodes(cfg.cluster)
    simulation.preempt_at(300.0, node)
    simulation.run()
    state = simulation.states["a"]
    assert state.preemptions == 1 and state.finished_s is not None
    assert (state.lost_samples > 0) is loses_work
