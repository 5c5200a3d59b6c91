"""The allocation policies: `fair` (`decision.allocator.PriorityFairShare`), `goodput` (Pollux) and
`quality` (SLAQ), chosen by name (`policy_named`), with the models they run on (throughput, loss
curves) and what the trainers reported (`history`). Pure: no Kubernetes I/O.

Invariants every policy keeps (`allocator.Policy`):
- priority first: a higher level is served (up to what its objective wants, within max) before a
  lower one sees a GPU; a job whose min does not fit gets 0 (oldest first within a level);
- every granted count is 0 or within [min, max], and fits whole on eligible nodes (`Packing`);
- running workers keep their nodes, except that goodput moves a job onto one node when that pays
  (`GoodputPolicy._consolidate`); goodput's growth prefers GPUs no running worker holds.
The objective policies get each job's measurements, the nodes' physical GPUs and the pass's clock
at construction, so the operator builds one per pass (a frozen dataclass; cheap).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..decision.allocator import Policy, PriorityFairShare
from ..decision.model import JobKey
from .goodput import GoodputPolicy
from .job_metrics import DEFAULT_RESCALE_PAUSE_S, JobMetrics, default_metrics
from .packing import NodeDevices, SlicedPacking
from .quality import QualityPolicy

POLICIES = ("fair", "goodput", "quality")  # what `ebbflow-operator --policy` and the simulator choose

__all__ = [
    "DEFAULT_RESCALE_PAUSE_S",
    "POLICIES",
    "GoodputPolicy",
    "JobMetrics",
    "NodeDevices",
    "QualityPolicy",
    "SlicedPacking",
    "default_metrics",
    "policy_named",
]


def policy_named(
    name: str, metrics: Mapping[JobKey, JobMetrics], devices: Mapping[str, NodeDevices], now: float
) -> Policy:
    """The policy one pass allocates with (`fair` ignores the metrics)."""
    if name == "fair":
        return PriorityFairShare()
    if name == "goodput":
        return GoodputPolicy(metrics=metrics, devices=devices, now=now)
    if name == "quality":
        return QualityPolicy(metrics=metrics, devices=devices, now=now)
    raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(POLICIES)}")
