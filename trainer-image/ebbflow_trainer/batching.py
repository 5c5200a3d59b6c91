"""Dynamic batching (Tyagi & Sharma; OmniLearn's controller): give fast workers more virtual nodes.

Each worker measures the compute time of its share of a step. The proportional rule
b_i' = b_i * mean(t) / t_i, rescaled so the shares still sum to V, gives every worker a share that
takes the same time. Virtual nodes are whole units, so a share is rounded by largest remainder with at
least one per worker, and a change smaller than the dead-band is ignored so noise never makes the
assignment flap. Every worker sees the same all-reduced times and runs the same arithmetic, so all
reach the same decision without extra messages or a new rendezvous.
"""

from __future__ import annotations

import math


def proportional_shares(counts: list[int], compute_seconds: list[float]) -> list[float]:
    """b_i * mean(t) / t_i for every worker, rescaled to keep the total equal to sum(counts)."""
    if len(counts) != len(compute_seconds):
        raise ValueError("one compute time per worker is needed")
    mean_time = sum(compute_seconds) / len(compute_seconds)
    raw = [b * mean_time / t for b, t in zip(counts, compute_seconds, strict=True)]
    scale = sum(counts) / sum(raw)
    return [share * scale for share in raw]


def round_shares(shares: list[float], total: int) -> list[int]:
    """Whole virtual nodes closest to the shares, at least one each, summing to ``total``."""
    if total < len(shares):
        raise ValueError("each worker needs at least one virtual node")
    counts = [max(1, math.floor(s)) for s in shares]
    # Largest remainders first; ties go to the lower rank so every worker picks the same order.
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    while sum(counts) < total:
        for i in order:
            if sum(counts) == total:
                break
            counts[i] += 1
    while sum(counts) > total:
        # Take from the workers furthest above their share, never below one.
        i = max((j for j in range(len(counts)) if counts[j] > 1), key=lambda j: (counts[j] - shares[j], -j))
        counts[i] -= 1
    return counts


class DynamicBatchingController:
    """Turns measured compute times into a new assignment of virtual nodes, with a dead-band.

    It tracks time per virtual node (an exponential moving average per worker), which stays valid when
    the assignment changes, so a reassignment never has to wait for fresh measurements.
    """

    def __init__(self, virtual_nodes: int, world_size: int, *, dead_band: float, smoothing: float = 0.3):
        self.virtual_nodes = virtual_nodes
        self.dead_band = dead_band
        self.smoothing = smoothing
        self._per_node_seconds: list[float] | None = None
        self._world_size = world_size

    def observe(self, counts: list[int], compute_seconds: list[float]) -> list[int] | None:
        """Record one step's times; return the new counts when a change beyond the dead-band pays off."""
        if len(counts) != self._world_size or any(t <= 0 for t in compute_seconds):
            return None
        per_node = [t / b for t, b in zip(compute_seconds, counts, strict=True)]
        if self._per_node_seconds is None:
            self._per_node_seconds = per_node
        else:
            a = self.smoothing
            self._per_node_seconds = [
                a * new + (1 - a) * old for new, old in zip(per_node, self._per_node_seconds, strict=True)
            ]
        expected = [b * u for b, u in zip(counts, self._per_node_seconds, strict=True)]
        shares = proportional_shares(counts, expected)
        largest_change = max(abs(s - b) / b for s, b in zip(shares, counts, strict=True))
        if largest_change < self.dead_band:
            return None
        proposal = round_shares(shares, self.virtual_nodes)
        return proposal if proposal != counts else None
