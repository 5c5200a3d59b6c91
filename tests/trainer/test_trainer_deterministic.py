"""Trainer tier: deterministic mode's exact sums give the same bits for every world size, with real
processes and gloo: V=12 virtual nodes dealt to 1, 3 or 4 workers, B=48 on the digits example.
(Every assignment of 12 virtual nodes to 2, 3, 4 and 6 workers, even and uneven, is covered in the
unit tier, tests/unit/trainer/test_trainer_engine.py; here the exact sums cross real gloo
all-reduces, odd and even worlds. The row table, which small models use by default, is covered by
the V=4 scenarios of test_trainer_elastic.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ebbflow_devtools.testing.trainer_cluster import assert_bitwise_equal, running_job

V, B, STEPS = 12, 48, 20
# The digits model's 12 rows (245 kB) would go as a row table; these tests are about exact sums.
EXACT_SUMS = ["--row-table-limit", "0"]


def _train(root: Path, world_size: int) -> dict[str, Any]:
    settings = {"virtual_nodes": V, "global_batch_size": B, "steps": STEPS, "extra_args": EXACT_SUMS}
    with running_job(root, min_replicas=world_size, max_replicas=world_size, **settings) as job:
        nodes = [job.start_node() for _ in range(world_size)]
        assert job.wait_all(nodes, 300) == [0] * world_size, job.logs()
        assert set(job.world_sizes_by_step().values()) == {world_size}
        final = job.final_checkpoint()
    assert final["step"] == STEPS
    return final


@pytest.fixture(scope="session")
def one_worker_v12(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference: one worker running all 12 virtual nodes."""
    return _train(tmp_path_factory.mktemp("v12-reference"), 1)


@pytest.mark.parametrize("world_size", [3, 4])
def test_twelve_virtual_nodes_give_the_same_bits_on_any_number_of_workers(
    tmp_path: Path, one_worker_v12: dict[str, Any], world_size: int
) -> None:
    assert_bitwise_equal(_train(tmp_path, world_size), one_worker_v12)
