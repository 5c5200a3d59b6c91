"""The simulated cluster: GPU nodes (time-sliced or not) and the spot nodes' preemptions and replacements.

A node has `physical` devices advertised as `physical * replicas` GPUs (`NodeDevices`, as the
policies see time-slicing). A fraction of the nodes is spot: each is preempted after an exponential
time (a Poisson process, `preempt_rate_per_hour` per node-hour) and a fresh spot node (a new name)
joins `replace_delay_s` later, with its own clock. Invariant: a node's lifetime depends only on the
config, seed and its name, never on the jobs, so every policy of one run faces the same preemptions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..policies import NodeDevices


@dataclass(frozen=True)
class ClusterConfig:
    gpus: int = 512
    gpus_per_node: int = 8
    replicas: int = 1  # time-slicing: advertised GPUs per physical device
    spot_fraction: float = 0.5
    preempt_rate_per_hour: float = 0.05
    replace_delay_s: float = 900.0

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    def devices(self, spot: bool = False) -> NodeDevices:
        return NodeDevices(
            physical=self.gpus_per_node, replicas=self.gpus_per_node * self.replicas, spot=spot
        )


def initial_nodes(config: ClusterConfig) -> dict[str, bool]:
    """Node name -> spot; the first `spot_fraction` of the nodes are spot."""
    spot = round(config.nodes * config.spot_fraction)
    return {f"node-{i:05d}": i < spot for i in range(config.nodes)}


def lifetime_s(config: ClusterConfig, seed: int, node: str) -> float | None:
    """How long spot `node` lives before its preemption (None: never); a function of (seed, name)
    only, so the schedule does not depend on the order in which the engine asks."""
    rate = config.preempt_rate_per_hour / 3600.0
    if rate <= 0:
        return None
    return random.Random(f"{seed}/{node}").expovariate(rate)


def replacement(node: str) -> str:
    """The name of the node that replaces preempted `node` (node-00003 -> node-00003.1 -> .2)."""
    base, _, generation = node.partition(".")
    return f"{base}.{int(generation or 0) + 1}"
