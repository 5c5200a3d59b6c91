"""The writes that carry out a job's plan: typed, complete (the bodies are built by `manifests`
inside the pure pass), in the order they must happen. The reconciler only executes them.

Order (`planner.writes_of`): the status first (it records what the deletions mean, so a crash after
it leaves extra pods, never a miscounted preemption), then deletions, the NetworkPolicy (so the
rendezvous store never listens unprotected), the Kueue Workload write, the Secret with the
rendezvous token, the rendezvous pod, the Service, the new workers, the workers' annotations, and
last the declaration of dead workers to the job's rendezvous pod (the one write not to the API
server: a rendezvous pod that does not answer holds up none of the others). Events are recorded
after the writes, whatever became of them.
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
    SECRET = "Secret"  # the rendezvous token's (the reconciler signs the token in)


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


@dataclass(frozen=True)
class DeclareGone:
    """Tell the job's rendezvous pod (its declarations endpoint at `address`, ip:port) that these
    workers are gone (pod name -> evidence); the reconciler adds the job's token."""

    address: str
    pods: tuple[tuple[str, str], ...]


Write = PatchStatus | DeletePod | CreateChild | AnnotatePod | PatchWorkload | DeclareGone
