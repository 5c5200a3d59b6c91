"""Simulator identity check: fingerprints of `ebbflow-sim --json` and of every pass's placement.

    .venv/bin/python bench/sim_identity.py > new.txt
    (cd OLD_CHECKOUT && PYTHONPATH=... python /path/to/bench/sim_identity.py) > old.txt; diff old.txt new.txt

A change meant to make the simulator or the policies faster without changing a decision must leave
both fingerprints of every line unchanged: the first hashes the JSON summary the CLI prints, the
second every pass's placement (`Placer.apply`'s nodes per job, in order), so a difference that the
rounded summary would hide still shows. Small configurations (seconds each) covering spot
preemptions, time-slicing, room to grow and two GPU types, for every policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Mapping, Sequence

from ebbflow_operator.decision.allocator import Demand
from ebbflow_operator.decision.model import JobKey
from ebbflow_sim import allocation, cli

CONFIGS = (
    ("--jobs", "120", "--gpus", "256", "--seed", "0"),
    ("--jobs", "120", "--gpus", "256", "--seed", "1"),
    ("--jobs", "120", "--gpus", "256", "--seed", "2"),
    ("--jobs", "80", "--gpus", "128", "--seed", "3", "--replicas", "2"),
    ("--jobs", "80", "--gpus", "256", "--seed", "4", "--elastic-max-factor", "4"),
    ("--jobs", "80", "--gpus", "256", "--seed", "5", "--gpu-types", "A100:0.5:1,T4:0.5:0.3"),
)
POLICIES = ("fair", "goodput", "quality", "static", "restart")


def main() -> None:
    log = [hashlib.sha256()]  # the current run's placement hash
    apply = allocation.Placer.apply

    def recorded(
        self: allocation.Placer,
        demands: Sequence[Demand],
        counts: Mapping[JobKey, int],
        moves: Mapping[JobKey, Sequence[str]] | None = None,
    ) -> dict[JobKey, list[str]]:
        placed = apply(self, demands, counts, moves)
        log[0].update(json.dumps(sorted((key[1], nodes) for key, nodes in placed.items())).encode())
        return placed

    allocation.Placer.apply = recorded  # type: ignore[method-assign]
    for argv in CONFIGS:
        for policy in POLICIES:
            log[0] = hashlib.sha256()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                cli.run([*argv, "--policy", policy, "--json"])
            summary = hashlib.sha256(out.getvalue().encode()).hexdigest()[:16]
            print(" ".join(argv), policy, summary, log[0].hexdigest()[:16], flush=True)


if __name__ == "__main__":
    main()
