"""Which samples a virtual node sees, and which worker runs which virtual node.

Samples depend only on (seed, data position, virtual node), never on the world size, so a step means
the same thing whatever the number of workers and a resumed run continues the exact sample sequence.

The data is a stream of epochs, each a permutation of the dataset drawn from (seed, epoch). A step
of global batch B takes the next B samples of its epoch, virtual node k the k-th B/V of them; when
fewer than B remain, the rest of the epoch is skipped and the step starts the next one. While B
stays the same, step s therefore starts at epoch s // (N // B), offset (s mod (N // B)) x B.
:class:`DataPosition` anchors that arithmetic where B last changed (see :mod:`.global_batch`): the
samples after the switch continue exactly where the last step before it stopped, none skipped or
repeated, and the anchor is part of the training state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch


def derived_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions (unlike hash())."""
    digest = hashlib.blake2b(",".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Whole global batches per pass over the data; the remainder of an epoch is skipped."""
    return num_samples // global_batch_size


@dataclass(frozen=True)
class DataPosition:
    """Where the sample stream stood at ``step``: the epoch, the offset into its permutation (the
    samples of the epoch consumed so far), and the samples the job had trained on; every step from
    there on takes ``global_batch_size`` samples. The run starts at step 0 of epoch 0."""

    global_batch_size: int
    step: int = 0
    epoch: int = 0
    offset: int = 0
    samples: int = 0

    def start(self, step: int, num_samples: int) -> tuple[int, int]:
        """(epoch, offset) of the first sample of ``step`` (at or after this position's step)."""
        batch = self.global_batch_size
        done = step - self.step
        if done < 0:
            raise ValueError(f"step {step} lies before this position's step {self.step}")
        fitting = (num_samples - self.offset) // batch  # steps left in this position's epoch
        if done < fitting:
            return self.epoch, self.offset + done * batch
        epochs, in_epoch = divmod(done - fitting, steps_per_epoch(num_samples, batch))
        return self.epoch + 1 + epochs, in_epoch * batch

    def samples_at(self, step: int) -> int:
        """Samples the job has trained on before ``step``."""
        return self.samples + (step - self.step) * self.global_batch_size

    def switched(self, step: int, global_batch_size: int, num_samples: int) -> DataPosition:
        """The position at ``step`` from which steps take ``global_batch_size`` samples: the first of
        them follows the last sample of step ``step - 1``."""
        if step == self.step:
            return replace(self, global_batch_size=global_batch_size)
        epoch, offset = self.start(step - 1, num_samples)
        offset += self.global_batch_size
        return DataPosition(global_batch_size, step, epoch, offset, self.samples_at(step))


def virtual_node_indices(
    *, seed: int, step: int, virtual_node: int, num_samples: int, virtual_nodes: int, position: DataPosition
) -> torch.Tensor:
    """Sample indices of one virtual node at one global step (at or after ``position``'s step)."""
    epoch, offset = position.start(step, num_samples)
    generator = torch.Generator().manual_seed(derived_seed(seed, epoch))
    order = torch.randperm(num_samples, generator=generator)
    per_node = position.global_batch_size // virtual_nodes
    start = offset + virtual_node * per_node
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
