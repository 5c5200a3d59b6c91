"""What sharded fast mode promises about its bits (issue 46, item 4): the same world trained twice.

Two calm runs of the trainer tier's sharded digits job (``sharding="fsdp"``, fast mode, two workers
on gloo, 200 steps, the same virtual-node assignment) are compared bitwise, parameter by parameter,
and each against a calm one-worker sharded run (relative difference of the flattened parameters).
Deterministic mode stays refused for sharded jobs; this is what fast mode gives instead.

    .venv/bin/python bench/sharded_repeatable.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from ebbflow_devtools.testing.trainer_cluster import SHARDED_DIGITS, parameters_of, running_job


def _final_parameters(workers: int) -> dict[str, torch.Tensor]:
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as root:
        settings = {
            "min_replicas": workers,
            "max_replicas": workers,
            "mode": "fast",
            "script": SHARDED_DIGITS,
        }
        with running_job(Path(root), **settings) as job:
            nodes = [job.start_node() for _ in range(workers)]
            assert job.wait_all(nodes, 300) == [0] * workers, job.logs()
            return parameters_of(job.final_checkpoint())


def _relative(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    flat_ours = torch.cat([ours[name].flatten() for name in sorted(ours)])
    flat_theirs = torch.cat([theirs[name].flatten() for name in sorted(theirs)])
    return float((flat_ours - flat_theirs).norm() / flat_theirs.norm())


def main() -> None:
    first, second, alone = _final_parameters(2), _final_parameters(2), _final_parameters(1)
    print(
        json.dumps(
            {
                "two_workers_twice_bitwise_equal": all(torch.equal(first[k], second[k]) for k in first),
                "two_workers_vs_one_relative": _relative(first, alone),
            }
        )
    )


if __name__ == "__main__":
    main()
