"""What the simulator asks of a policy, built the way the operator's `decide` builds it, and the baselines.

Elastic policies (`fair`, `goodput`, `quality`) are the operator's own classes: each pass gets one
`Demand` per arrived, unfinished job (its bounds, priority, arrival as `created`, the nodes its
running workers sit on as `current_nodes`) and every live node's advertised GPUs as free (every
running worker is movable, as `decide` counts it), then `decide()`. `decide._demand` itself takes
Kubernetes objects (a Job and its Pods), so the same fields are filled here from the trace.

Rigid baselines keep a running job's size and nodes until it ends or loses a node:
- `static`: a gang; a waiting job starts only when all its max workers fit;
- `restart`: Kubeflow-style; a waiting job starts with as many workers as fit (>= min, <= max)
  and keeps that size.
Both serve waiting jobs by priority then arrival, skipping (backfilling past) those that do not fit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ebbflow_operator import policies
from ebbflow_operator.decision.allocator import (
    Allocation,
    Demand,
    Packing,
    Policy,
    first_acceptable,
    growth_in_room,
)
from ebbflow_operator.decision.model import JobKey
from ebbflow_operator.policies import JobMetrics, NodeDevices, SlicedPacking, policy_named

from .job_state import JobState

NAMESPACE = "sim"
ELASTIC = policies.POLICIES  # the operator's; the simulator adds the rigid baselines
RIGID = ("static", "restart")
POLICIES = (*RIGID, *ELASTIC)


def key_of(state: JobState) -> JobKey:
    return (NAMESPACE, state.job.name)


def demand(state: JobState, eligible: frozenset[str]) -> Demand:
    job = state.job
    return Demand(
        key=key_of(state),
        min=job.min_workers,
        max=job.max_workers,
        gpus_per_worker=job.gpus_per_worker,
        eligible=eligible,
        priority=job.priority,
        created=job.arrival_s,
        current_nodes=state.current_nodes,
    )


def metrics(state: JobState, rescale_pause_s: float, speeds: Mapping[str, float]) -> JobMetrics:
    """What the trainers of this job have reported so far (see `JobState.measure`, `report_loss`),
    each measurement carrying its GPU type's learned speed, as `History.metrics` gives the policies.
    A job that allows batch adaptation (which needs AdaScale, whose trainers estimate the gradient
    noise) reports its true noise scale; the others none."""
    adaptive = state.job.max_batch > 0
    return JobMetrics(
        global_batch=state.job.global_batch,
        virtual_nodes=state.job.virtual_nodes,
        measurements=state.reported(speeds),
        noise_scale=state.noise_scale if adaptive else None,
        rescale_pause_s=rescale_pause_s,
        rescales=state.rescales,
        losses=tuple(state.losses),
        step=state.steps,
        max_batch=state.job.max_batch if adaptive else None,
    )


def elastic_policy(
    name: str,
    states: Sequence[JobState],
    devices: Mapping[str, NodeDevices],
    now: float,
    rescale_pause_s: float,
    speeds: Mapping[str, float],
) -> Policy:
    info = {} if name == "fair" else {key_of(s): metrics(s, rescale_pause_s, speeds) for s in states}
    return policy_named(name, info, devices, now)


def rigid_allocate(
    name: str, states: Sequence[JobState], demands: Sequence[Demand], free: Mapping[str, int]
) -> dict[JobKey, int]:
    """`static` or `restart`: running jobs keep their workers; waiting ones start if they fit."""
    packing = Packing(free)
    running = [(s, d) for s, d in zip(states, demands, strict=True) if s.workers]
    waiting = [(s, d) for s, d in zip(states, demands, strict=True) if not s.workers]
    for _, d in running:
        packing.place_up_to(d, len(d.current_nodes))
    waiting.sort(key=lambda sd: (-sd[1].priority, sd[1].created, sd[1].key))
    for _, d in waiting:
        need = d.max if name == "static" else d.min
        gang = Demand(d.key, need, d.max, d.gpus_per_worker, d.eligible, d.priority, d.created)
        if not packing.place_min(gang):
            continue
        while name == "restart" and packing.count(d.key) < d.max and packing.place(gang):
            pass
    return {d.key: packing.count(d.key) for d in demands}


def pinned_growth(
    decision: Allocation, demands: Sequence[Demand], free: Mapping[str, int]
) -> dict[JobKey, tuple[str, ...]]:
    """The growths the operator pins where the policy placed them (`allocator.growth_in_room`): those
    that fit in the GPUs no running worker holds (`free` counts the running workers' as free)."""
    room = dict(free)
    for d in demands:
        for node in d.current_nodes:
            if node in room:
                room[node] -= d.gpus_per_worker
    return growth_in_room(decision, demands, room)


class Placer(SlicedPacking):
    """The placement the engine applies, as the operator and the kube-scheduler carry a pass out: the
    policy's counts; running workers kept where they are (every job's kept workers are placed before
    anyone grows) unless the policy moves them (pinned to the nodes it chose, before anyone grows);
    new workers on the nodes the policy placed them on where it says (`Allocation.growth`: the
    operator pins them), else where the scheduler puts the operator's unpinned pods (`schedule`). A
    job whose growth does not reach its min here gets 0 (its pods would stay Pending)."""

    def apply(
        self,
        demands: Sequence[Demand],
        counts: Mapping[JobKey, int],
        moves: Mapping[JobKey, Sequence[str]] | None = None,
        growth: Mapping[JobKey, Sequence[str]] | None = None,
    ) -> dict[JobKey, list[str]]:
        moves, growth = moves or {}, growth or {}
        ordered = sorted(demands, key=lambda d: (-d.priority, d.created, d.key))
        for d in ordered:
            moved = moves.get(d.key, ())
            if moved:  # the workers on the target node stay; the others go there after everyone's
                self._sticky[d.key] = [n for n in d.current_nodes if n == moved[0]]
            self.place_up_to(d, min(counts.get(d.key, 0), len(d.current_nodes)) - len(moved))
        for d in ordered:  # moves before growth: the policy found their room after everyone grew
            if d.key in moves:
                self._sticky[d.key] = list(moves[d.key])
            self.place_up_to(d, len(moves.get(d.key, ())))
        for d in ordered:
            new = counts.get(d.key, 0) - self.count(d.key)
            pinned = growth.get(d.key, ())
            if pinned and len(pinned) == new:
                self._sticky[d.key] = list(pinned)
                self.place_up_to(d, new)
            else:
                self.schedule(d, new)
            if 0 < self.count(d.key) < d.min:
                self.withdraw(d)
        return {d.key: self.nodes_of(d.key) for d in demands}

    def schedule(self, demand: Demand, workers: int) -> None:
        """Places up to `workers` new workers one at a time as the default kube-scheduler scores
        the operator's new pods, which name no node: its default topology spread (the job's
        Service selects them) puts each on a fitting node holding the fewest of the job's pods,
        then least allocated (fewest GPUs in use, the nodes being alike), then by name."""
        need = demand.gpus_per_worker
        placed = self._placed.setdefault(demand.key, [])
        for _ in range(workers):
            node = self._spread_node(demand, Counter(placed)) if need > 0 else ""
            if node is None:
                return
            if node:
                self._placed_on(demand, node)
                self._take(node, need)
            placed.append(node)

    def _spread_node(self, demand: Demand, mine: Counter[str]) -> str | None:
        """The node `schedule` puts the job's next worker on (None when none fits)."""
        need = demand.gpus_per_worker
        best: tuple[int, int, str] | None = None
        for (free, *_), names in self._index.groups():
            if free < need or (best is not None and -free > best[1]):
                continue
            name = first_acceptable(names, demand.eligible, mine.keys())
            if name is not None and (best is None or (0, -free, name) < best):
                best = (0, -free, name)
        if best is not None:
            return best[2]
        own = [
            (count, -self.free[node], node)
            for node, count in mine.items()
            if node in demand.eligible and self.free.get(node, 0) >= need
        ]
        return min(own)[2] if own else None
