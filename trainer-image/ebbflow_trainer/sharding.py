"""Which samples a virtual node sees, and which worker runs which virtual node.

Samples depend only on (seed, epoch, step, virtual node), never on the world size, so a step means
the same thing whatever the number of workers and a resumed run continues the exact sample sequence.
"""

from __future__ import annotations

import hashlib

import torch


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions (unlike hash())."""
    digest = hashlib.blake2b(",".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Whole global batches per pass over the data; the remainder of an epoch is skipped."""
    return num_samples // global_batch_size


def virtual_node_indices(
    *, seed: int, step: int, virtual_node: int, num_samples: int, global_batch_size: int, virtual_nodes: int
) -> torch.Tensor:
    """Sample indices of one virtual node at one global step."""
    per_epoch = steps_per_epoch(num_samples, global_batch_size)
    epoch, step_in_epoch = divmod(step, per_epoch)
    generator = torch.Generator().manual_seed(derived_seed(seed, epoch))
    order = torch.randperm(num_samples, generator=generator)
    per_node = global_batch_size // virtual_nodes
    start = step_in_epoch * global_batch_size + virtual_node * per_node
    return order[start : start + per_node]


def even_counts(virtual_nodes: int, world_size: int) -> list[int]:
    """Virtual nodes per worker when all workers are equally fast: as even as possible, low ranks first."""
    base, extra = divmod(virtual_nodes, world_size)
    return [base + (1 if rank < extra else 0) for rank in range(world_size)]


def ranges_from_counts(counts: list[int]) -> list[list[int]]:
    """Contiguous virtual-node ids per worker, in rank order."""
    ranges, start = [], 0
    for count in counts:
        ranges.append(list(range(start, start + count)))
        start += count
    return ranges
