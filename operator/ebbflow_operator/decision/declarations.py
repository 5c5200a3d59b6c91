"""Which of a job's workers the operator declares gone to the job's rendezvous, and where: pure.

The operator sees a worker's end within a watch event; its peers may see nothing of it (a vanished
host answers no probe) and would wait out its heartbeats. So each pass names the workers that run
nowhere any more, with the evidence, for the rendezvous pod's declarations endpoint (the trainer's
``ebbflow_trainer.launch.declarations``), which removes their nodes from the rendezvous at once.

Invariants: a worker still able to leave gracefully (asked to, its node still there) is never
declared: its own leave hands its state over at a step boundary. Declared: a worker whose node is
gone, one that ended (failed, or preempted by a signal), and a recorded worker whose pod is gone.
No declaration without a running rendezvous pod that has an address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ebbflow_api import contract

from . import manifests
from .model import Job, Node, Pod
from .plan import Workers, children
from .writes import DeclareGone


def declaration(
    job: Job, pods: Sequence[Pod], workers: Sequence[Pod], seen: Workers, nodes: Mapping[str, Node]
) -> DeclareGone | None:
    """The pass's declaration for `job` (None when nothing is to be declared or nobody can hear it).
    `workers` are the job's worker pods, `seen` what `planner.classify` made of them."""
    gone = gone_workers(workers, seen, nodes)
    rendezvous = [
        p
        for p in children(job, pods, contract.ROLE_RENDEZVOUS)
        if p.phase == "Running" and p.ip and not p.deleting
    ]
    if not gone or not rendezvous:
        return None
    return DeclareGone(f"{rendezvous[0].ip}:{manifests.declarations_port(job)}", gone)


def gone_workers(
    workers: Sequence[Pod], seen: Workers, nodes: Mapping[str, Node]
) -> tuple[tuple[str, str], ...]:
    """The workers that run nowhere any more, each with the evidence, sorted by name."""
    present = {pod.name: pod for pod in workers}
    evidence: dict[str, str] = {}
    for name, why in seen.lost.items():
        if name not in present:
            evidence[name] = f"its pod is gone ({why})"
    for pod in workers:
        if pod.node is not None and pod.node not in nodes:
            evidence[pod.name] = f"its node {pod.node} is gone"
        elif pod.phase == "Failed":
            evidence[pod.name] = f"its pod failed ({pod.disruption or f'exit code {pod.exit_code}'})"
    return tuple(sorted(evidence.items()))
