"""The GPU memory budget of a job with spec.bandLimit: how many MiB each of its workers may use. Pure.

Why the operator decides it and not the trainers: a time-sliced GPU gives every pod on it the whole
device's memory with no isolation, so a trainer cannot see how much of it is its own. The node can:
NVIDIA's GPU feature discovery labels it with the memory of one physical GPU
(`nvidia.com/gpu.memory`, MiB) and the time-slicing replicas per GPU (`nvidia.com/gpu.replicas`), and
a worker's `nvidia.com/gpu` limit counts replicas. So a worker's share is
`gpus x memory // replicas`. The workers train in lockstep at one compression rate, so the job's
budget is the smallest of its workers' shares. A budget the user wrote (`memoryBudgetMiB`) wins.

Invariants: a function of (job, its workers, the nodes) alone; None when nothing says how much
memory there is (no spec value and no scheduled worker on a node labelled with its GPU memory), and
then the workers' annotations are left as they are, so the trainers keep the rate they use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import LABEL_GPU_MEMORY, LABEL_GPU_REPLICAS, Job, Node, Pod


def _positive_label(node: Node, key: str) -> int | None:
    """A label holding a positive decimal integer; None when absent or anything else."""
    value = node.labels.get(key, "")
    return int(value) if value.isdecimal() and int(value) > 0 else None


def worker_share_mib(node: Node, gpus: int) -> int | None:
    """The GPU memory a worker holding `gpus` (time-sliced replicas when the node shares its GPUs)
    may use on `node`; None when the node does not say its GPUs' memory or the worker holds none."""
    memory = _positive_label(node, LABEL_GPU_MEMORY)
    if memory is None or gpus < 1:
        return None
    replicas = _positive_label(node, LABEL_GPU_REPLICAS) or 1
    return gpus * memory // replicas


def job_budget_mib(job: Job, workers: Sequence[Pod], nodes: Mapping[str, Node]) -> int | None:
    """spec.bandLimit.memoryBudgetMiB when set; else the smallest share among the scheduled
    `workers` whose node is known and labelled; None without spec.bandLimit or any such worker."""
    band_limit = job.spec.band_limit
    if band_limit is None:
        return None
    if band_limit.memory_budget_mib is not None:
        return band_limit.memory_budget_mib
    shares = [
        share
        for pod in workers
        if pod.node is not None
        and (node := nodes.get(pod.node)) is not None
        and (share := worker_share_mib(node, pod.gpus)) is not None
    ]
    return min(shares) if shares else None
