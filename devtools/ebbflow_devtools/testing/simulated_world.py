"""Simulated workers in one process: each engine computes its share of a step as a worker does, and
the shares are combined as the world's collectives would combine them.

Fast mode: each engine runs ``reduce_step`` in a world of one, so its message holds its own sum;
the sum of those messages is what the bucketed all-reduce gives. Deterministic mode: the rows'
grid agreements are combined with MAX before packing, then the messages are summed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from ebbflow_trainer.sharding import even_counts, ranges_from_counts
from ebbflow_trainer.step.engine import NO_REQUESTS, Requests, StepResult, VirtualNodeEngine, WorldOfOne


def reduce_world(
    workers: list[VirtualNodeEngine],
    step: int,
    assignment: list[list[int]],
    *,
    leave_rank: int | None = None,
    requests: Sequence[Requests] = (),
) -> tuple[torch.Tensor, list[float]]:
    """The all-reduced message of ``step`` with worker r holding ``assignment[r]``, and each worker's
    compute seconds. Worker ``leave_rank`` asks to leave; worker r sends ``requests[r]`` (default:
    none from anyone)."""
    size = len(workers)
    requests = list(requests) or [NO_REQUESTS] * size
    if workers[0].method == "sum":
        shares = [
            engine.reduce_step(
                step,
                assignment[rank],
                rank=rank,
                world_size=size,
                leave=lambda rank=rank: rank == leave_rank,  # type: ignore[misc]
                comm=WorldOfOne(),
                requests=requests[rank],
            )
            for rank, engine in enumerate(workers)
        ]
        return torch.stack([message.clone() for message, _ in shares]).sum(0), [s for _, s in shares]
    computed = [engine.compute_rows(step, assignment[rank]) for rank, engine in enumerate(workers)]
    reduced = combine_rows(workers, computed, leave_rank=leave_rank, requests=requests)
    return reduced, [seconds for _, seconds in computed]


Computed = tuple[dict[int, torch.Tensor], float]


def combine_rows(
    workers: list[VirtualNodeEngine],
    computed: list[Computed],
    *,
    leave_rank: int | None = None,
    requests: Sequence[Requests] = (),
) -> torch.Tensor:
    """Deterministic mode's collectives over each worker's (rows, compute seconds): MAX over the grid
    agreements (exact sums), then the sum of the packed messages."""
    agreements = [engine.agreement(rows) for engine, (rows, _) in zip(workers, computed, strict=True)]
    agreement = None
    if agreements[0] is not None:
        agreement = torch.stack([a for a in agreements if a is not None]).amax(0)
    messages = [
        engine.pack(
            rows,
            rank=rank,
            world_size=len(workers),
            compute_seconds=seconds,
            leave=rank == leave_rank,
            agreement=agreement,
            requests=requests[rank] if requests else NO_REQUESTS,
        )
        for rank, (engine, (rows, seconds)) in enumerate(zip(workers, computed, strict=True))
    ]
    return torch.stack(messages).sum(0)


def step_world(
    workers: list[VirtualNodeEngine],
    step: int,
    counts: list[int] | None = None,
    requests: Sequence[Requests] = (),
) -> list[StepResult]:
    """One global step of ``workers`` holding ``counts`` virtual nodes each (default: even shares),
    worker r sending ``requests[r]``."""
    virtual_nodes = workers[0].config.virtual_nodes
    assignment = ranges_from_counts(counts or even_counts(virtual_nodes, len(workers)))
    reduced, _ = reduce_world(workers, step, assignment, requests=requests)
    return [engine.apply(reduced.clone(), len(workers)) for engine in workers]
