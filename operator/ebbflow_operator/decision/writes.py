"""The API writes that carry out a job's plan: typed, complete (the bodies are built by `manifests`
inside the pure pass), in the order they must happen. The reconciler only executes them.

Order (`planner.writes_of`): the status first (it records what the deletions mean, so a crash after
it leaves extra pods, never a miscounted preemption), then deletions, the NetworkPolicy (so the
rendezvous store never listens unprotected), the Kueue Workload write, the rendezvous pod, the
Service, the new workers, and the workers' annotations. Events are recorded after the writes,
whatever became of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .model import Json


class ChildKind(StrEnum):
    """What a job owns and the operator creates."""

    POD = "Pod"
    SERVICE = "Service"
    NETWORK_POLICY = "NetworkPolicy"
    WORKLOAD = "Workload"  # a Kueue Workload slice (kueue.py)


@dataclass(frozen=True)
class PatchStatus:
    """A JSON merge patch of the job's status subresource."""

    patch: Json


@dataclass(frozen=True)
class DeletePod:
    """Delete the pod if it is still the one with `uid` (a replacement under its name is left alone)."""

    name: str
    uid: str
    grace_seconds: int


@dataclass(frozen=True)
class CreateChild:
    """Create a child of the job (AlreadyExists is success: a pass may run twice)."""

    kind: ChildKind
    body: Json


@dataclass(frozen=True)
class AnnotatePod:
    """Merge `annotations` into the pod if it is still the one with `uid`."""

    name: str
    uid: str
    annotations: Json


@dataclass(frozen=True)
class PatchWorkload:
    """A JSON patch of a Kueue Workload (its status subresource when `status`); the patch starts by
    testing the uid and resourceVersion the pass saw, so it applies to that version only."""

    name: str
    patch: tuple[Json, ...]
    status: bool = False


Write = PatchStatus | DeletePod | CreateChild | AnnotatePod | PatchWorkload
