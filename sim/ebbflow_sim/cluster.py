"""The simulated cluster: typed GPU nodes (time-sliced or not) and the spot nodes' preemptions and
replacements.

A node has `physical` devices advertised as `physical * replicas` GPUs (`NodeDevices`, as the
policies see time-slicing), all of one GPU type (`GpuType`: a product name and its true compute
speed; the policies only know the speeds they learn from measurements, as the operator does). A
fraction of the nodes is spot: each is preempted after an exponential time (a Poisson process,
`preempt_rate_per_hour` per node-hour) and a fresh spot node (a new name, the same type) joins
`replace_delay_s` later, with its own clock. Invariants: a node's lifetime depends only on the config,
seed and its name, and its type only on the config and its name, never on the jobs, so every policy of
one run faces the same cluster and the same preemptions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ebbflow_operator.policies import NodeDevices

GOLDEN = 0.6180339887498949  # spreads types over node indexes evenly and independently of spot


@dataclass(frozen=True)
class GpuType:
    """A GPU product: its name (`nvidia.com/gpu.product`), the share of nodes that have it and its true
    compute speed relative to the others (a job's compute time is divided by it)."""

    name: str
    share: float = 1.0
    speed: float = 1.0


@dataclass(frozen=True)
class ClusterConfig:
    gpus: int = 512
    gpus_per_node: int = 8
    replicas: int = 1  # time-slicing: advertised GPUs per physical device
    spot_fraction: float = 0.5
    preempt_rate_per_hour: float = 0.05
    replace_delay_s: float = 900.0
    gpu_types: tuple[GpuType, ...] = (GpuType(""),)

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    def devices(self, spot: bool = False, gpu_type: str = "", speed: float = 1.0) -> NodeDevices:
        """What the policies see of a node; `speed` is what they know of its type (learned)."""
        return NodeDevices(
            physical=self.gpus_per_node,
            replicas=self.gpus_per_node * self.replicas,
            spot=spot,
            gpu_type=gpu_type,
            speed=speed,
        )


def initial_nodes(config: ClusterConfig) -> dict[str, bool]:
    """Node name -> spot; the first `spot_fraction` of the nodes are spot."""
    spot = round(config.nodes * config.spot_fraction)
    return {f"node-{i:05d}": i < spot for i in range(config.nodes)}


def node_type(config: ClusterConfig, node: str) -> GpuType:
    """The GPU type of `node` (and of the nodes that replace it): the type whose slice of [0, 1), in
    proportion to the shares, holds the golden-ratio sequence at the node's index, so every type's
    share of the nodes is met to within a node or two, spread over spot and on-demand nodes alike."""
    types = config.gpu_types
    if len(types) == 1:
        return types[0]
    index = int(node.partition(".")[0].rsplit("-", 1)[1])
    point = ((index + 0.5) * GOLDEN) % 1.0 * sum(t.share for t in types)
    for gpu_type in types:
        point -= gpu_type.share
        if point < 0:
            return gpu_type
    return types[-1]


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
