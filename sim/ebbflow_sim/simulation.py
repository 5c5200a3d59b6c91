"""The discrete-event loop: jobs arrive, train, finish; spot nodes vanish and come back; policies decide.

Events: arrivals, completions (from each running job's rate), node preemptions and additions, a loss
snapshot at the cutoff, and allocation passes (after any event that changes demand or capacity,
coalesced over `debounce_s`, and at least every `tick_s`). A pass calls the policy's `decide()`,
places the counts (`Placer`), applies the batches and charges: a resize or a move `rescale_pause_s`
(a move no worker survives: a restart); a restart of a job that ran before `restart_s`; a
change of batch nothing; a preemption rolls rigid jobs back to their checkpoint and pauses elastic
ones once (or stops them below min: survivors hand over, none rolls back unless `preemption_notice`
let the dying workers hand over). A first start costs nothing: a lone job finishes at work / goodput.

Invariants: time only moves forward; allocated GPUs never exceed a node's advertised GPUs; the
result depends only on the jobs, the config and the seed.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ebbflow_operator.decision.model import JobKey
from ebbflow_operator.policies import NodeDevices
from ebbflow_operator.policies.throughput import Placement, compute_speeds

from .allocation import (
    ELASTIC,
    POLICIES,
    Placer,
    demand,
    elastic_policy,
    key_of,
    pinned_growth,
    rigid_allocate,
)
from .cluster import ClusterConfig, initial_nodes, lifetime_s, node_type, replacement
from .job_state import JobState
from .trace import SimJob

NODE_DOWN, NODE_UP, ARRIVAL, SNAPSHOT, PASS = range(5)
MAX_SIM_S = 365 * 86400.0  # give up on jobs still unfinished after a simulated year
# A running job's finish time, once worked out, only drifts by rounding as its progress accumulates
# event by event (about 1e-5 s over a simulated year); far below this slack.
FINISH_SLACK_S = 1.0


@dataclass(frozen=True)
class SimConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    seed: int = 0
    rescale_pause_s: float = 5.0
    restart_s: float = 60.0
    checkpoint_s: float = 1800.0
    # Preemptions give notice (an eviction's grace, a cloud's spot notice): an elastic job that loses
    # every worker hands a checkpoint over on SIGTERM, as the trainer does, instead of rolling back.
    preemption_notice: bool = False
    tick_s: float = 60.0
    debounce_s: float = 0.0
    loss_cutoff_s: float | None = None  # default: the last arrival


@dataclass
class Result:
    """One policy's run: per-job completion times and the cluster's accounting."""

    policy: str
    jct_s: list[float]
    makespan_s: float
    busy_gpu_s: float
    capacity_gpu_s: float
    preemptions: int
    rescales: int
    loss_at_cutoff: list[float]
    unfinished: int
    utilization: list[tuple[float, float]]  # (time, busy/capacity) after each change

    def summary(self) -> dict[str, float | int | str]:
        jct = sorted(self.jct_s)
        p99 = jct[max(0, math.ceil(0.99 * len(jct)) - 1)] if jct else 0.0
        return {
            "policy": self.policy,
            "jobs": len(jct) + self.unfinished,
            "unfinished": self.unfinished,
            "avg_jct_s": round(sum(jct) / len(jct), 3) if jct else 0.0,
            "p99_jct_s": round(p99, 3),
            "makespan_s": round(self.makespan_s, 3),
            "gpu_utilization": round(self.busy_gpu_s / self.capacity_gpu_s, 4)
            if self.capacity_gpu_s
            else 0.0,
            "preemptions": self.preemptions,
            "rescales": self.rescales,
            "mean_normalized_loss_at_end": round(sum(self.loss_at_cutoff) / len(self.loss_at_cutoff), 4)
            if self.loss_at_cutoff
            else 0.0,
        }


class Simulation:
    """One policy over one trace and cluster; `run()` once."""

    def __init__(self, jobs: Sequence[SimJob], policy: str, config: SimConfig) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.policy = policy
        self.config = config
        self.devices = config.cluster.devices()
        # The rigid baselines run each job at its requested size; the elastic policies within [min, max].
        self.states = {j.name: JobState(j if policy in ELASTIC else j.rigid()) for j in jobs}
        self.arrived: dict[str, JobState] = {}  # arrived and unfinished, in arrival order
        # The jobs with workers, the workers each one's rate was last worked out for and, per node,
        # the jobs rated on it: kept by `_changed`, which runs after every change of anyone's
        # workers and looks only at the jobs `_set_workers` marked `touched` since it last ran.
        self.running: dict[str, JobState] = {}
        self.rated: dict[str, list[str]] = {}
        self.on_node: dict[str, set[str]] = {}
        self.touched: set[str] = set()
        self.rebatched: set[str] = set()  # running jobs whose batch changed since they were rated
        # When each running job would finish, as worked out when it was last rated: a heap of
        # (finish time, arrival order, version, job); an entry whose version is not the job's is stale.
        self.finishing: list[tuple[float, int, int, str]] = []
        self.finish_version: dict[str, int] = {}
        self.versions = 0
        self.order: dict[str, int] = {}  # arrival order
        self.nodes: dict[str, bool] = {}  # live node -> spot
        self.used: dict[str, int] = {}
        self.now = 0.0
        self.events: list[tuple[float, int, int, str]] = []
        self.serial = 0
        self.pending_pass: float | None = None
        self.passes = 0  # allocation passes run (what a simulation's time mostly goes to)
        self.busy = 0
        self.busy_gpu_s = 0.0
        self.capacity_gpu_s = 0.0
        self.preemptions = 0
        self.loss_at_cutoff: list[float] = []
        self.utilization: list[tuple[float, float]] = []

    # --- events ----------------------------------------------------------------------------------

    def _push(self, time_s: float, kind: int, name: str) -> None:
        self.serial += 1
        heapq.heappush(self.events, (time_s, kind, self.serial, name))

    def preempt_at(self, time_s: float, node: str) -> None:
        """Schedules a preemption of `node` (for tests and scripted scenarios; call before `run`)."""
        self._push(time_s, NODE_DOWN, node)

    def _request_pass(self, at: float) -> None:
        if self.pending_pass is None or at < self.pending_pass:
            self.pending_pass = at
            self._push(at, PASS, "")

    def _add_node(self, name: str, spot: bool) -> None:
        self.nodes[name] = spot
        self.used[name] = 0
        life = lifetime_s(self.config.cluster, self.config.seed, name) if spot else None
        if life is not None:
            self._push(self.now + life, NODE_DOWN, name)

    def _start(self) -> None:
        for name, spot in initial_nodes(self.config.cluster).items():
            self._add_node(name, spot)
        for state in self.states.values():
            self._push(state.job.arrival_s, ARRIVAL, state.job.name)
        last = max((s.job.arrival_s for s in self.states.values()), default=0.0)
        cutoff = self.config.loss_cutoff_s
        self._push(last if cutoff is None else cutoff, SNAPSHOT, "")
        self._account()

    def run(self) -> Result:
        """Runs the simulation to its end with the cyclic garbage collector off (restored after).
        The simulation makes no reference cycles (a unit test checks each policy), so reference
        counting frees all it drops, and the collector's full passes over its large long-lived heap
        (the trace, the caches of fitted models) were a quarter of a native run's time."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> Result:
        self._start()
        unfinished = len(self.states)
        while unfinished and self.now < MAX_SIM_S:
            done_at, done = self._next_completion()
            if done is not None and (not self.events or done_at <= self.events[0][0]):
                self._advance(done_at)
                self._complete(done)
                unfinished -= 1
                continue
            if not self.events:
                break
            time_s, kind, _, name = heapq.heappop(self.events)
            self._advance(time_s)
            self._handle(kind, name)
        return self._result()

    def _handle(self, kind: int, name: str) -> None:
        if kind == NODE_DOWN:
            self._preempt(name)
        elif kind == NODE_UP:
            self._add_node(name, True)
            self._changed()
            self._request_pass(self.now + self.config.debounce_s)
        elif kind == ARRIVAL:
            self.arrived[name] = self.states[name]
            self.order[name] = len(self.order)
            self._request_pass(self.now + self.config.debounce_s)
        elif kind == SNAPSHOT:
            self._sync_running()
            self.loss_at_cutoff = [
                s.normalised_loss() for s in self.states.values() if s.job.arrival_s <= self.now
            ]
        elif kind == PASS and self.pending_pass == self.now:
            self.pending_pass = None
            self._pass()
            if self.arrived:
                self._request_pass(self.now + self.config.tick_s)

    def _next_completion(self) -> tuple[float, str | None]:
        """The running job that finishes first (the first to arrive on ties). Its finish time is worked
        out afresh only for the jobs whose stored one is within FINISH_SLACK_S of the earliest, not
        for every running job at every event."""
        heap = self.finishing
        candidates: list[tuple[float, int, int, str]] = []
        while heap:
            at, _, version, name = heap[0]
            if self.finish_version.get(name) != version:
                heapq.heappop(heap)
                continue
            if candidates and at > candidates[0][0] + FINISH_SLACK_S:
                break
            candidates.append(heapq.heappop(heap))
        for entry in candidates:
            heapq.heappush(heap, entry)
        best, first = math.inf, None
        for _, _, _, name in sorted(candidates, key=lambda entry: entry[1]):
            at = self.arrived[name].finish_time()
            if at < best:
                best, first = at, name
        return best, first

    def _advance(self, to: float) -> None:
        """Moves the clock to `to` and integrates the utilisation. The jobs catch up lazily
        (`_sync`): nothing about them changes between events but their progress."""
        if to <= self.now:
            return
        dt = to - self.now
        self.busy_gpu_s += self.busy * dt
        self.capacity_gpu_s += len(self.nodes) * self.devices.physical * dt
        self.now = to

    def _sync(self, state: JobState) -> None:
        """Brings the job's progress up to now: before its rate, pause, workers or progress change,
        and before its progress is read."""
        state.advance(self.now, self.config.checkpoint_s)

    def _sync_running(self) -> None:
        for state in self.running.values():
            self._sync(state)

    def _complete(self, name: str) -> None:
        state = self.arrived.pop(name)
        self._sync(state)
        state.progress = state.job.work_samples
        state.report_loss()
        state.finished_s = self.now
        self._set_workers(state, [])
        self._changed()
        self._request_pass(self.now + self.config.debounce_s)

    # --- preemptions -----------------------------------------------------------------------------

    def _preempt(self, node: str) -> None:
        if node not in self.nodes:
            return
        del self.nodes[node]
        del self.used[node]
        self._push(self.now + self.config.cluster.replace_delay_s, NODE_UP, replacement(node))
        for state in self.arrived.values():
            if node in state.workers:
                state.preemptions += 1
                self.preemptions += 1
                self._lose(state, [w for w in state.workers if w != node])
        self._changed()
        self._request_pass(self.now + self.config.debounce_s)

    def _lose(self, state: JobState, survivors: list[str]) -> None:
        self._sync(state)
        if self.policy in ELASTIC and len(survivors) >= state.job.min_workers:
            self._set_workers(state, survivors)
            state.paused_until = self.now + self.config.rescale_pause_s
            state.rescales += 1
            return
        if self.policy in ELASTIC and (survivors or self.config.preemption_notice):
            state.hand_over()
        else:
            state.roll_back()
        self._set_workers(state, [])

    # --- allocation ------------------------------------------------------------------------------

    def _pass(self) -> None:
        self.passes += 1
        states = list(self.arrived.values())
        if not states:
            return
        self._sync_running()  # the steps and losses the policies read
        grown = self._noise_grown()
        eligible = frozenset(self.nodes)
        demands = [demand(s, eligible) for s in states]
        free = {n: self.devices.replicas for n in self.nodes}
        # Only the elastic policies place a job's minimum on-demand; the rigid baselines' scheduler
        # knows no minimum, so their placement ignores which nodes are spot.
        elastic = self.policy in ELASTIC
        # What the operator knows of the GPU types: the speeds it learns from the jobs' measurements.
        speeds = compute_speeds(tuple(s.shapes.values()) for s in states) if elastic else {}
        devices = {n: self._devices(n, spot and elastic, speeds) for n, spot in self.nodes.items()}
        batches: dict[JobKey, int] = {}
        moves: dict[JobKey, tuple[str, ...]] = {}
        growth: dict[JobKey, tuple[str, ...]] = {}
        if self.policy in ELASTIC:
            pause = self.config.rescale_pause_s
            policy = elastic_policy(self.policy, states, devices, self.now, pause, speeds)
            decision = policy.decide(demands, free)
            counts, batches, moves = decision.counts, decision.global_batch, decision.moves
            growth = pinned_growth(decision, demands, free)
        else:
            counts = rigid_allocate(self.policy, states, demands, free)
        placed = Placer(free, devices).apply(demands, counts, moves, growth)
        changed = bool(grown)
        for state in states:
            changed |= self._move(state, placed[key_of(state)])
            changed |= self._rebatch(state, batches.get(key_of(state)))
        if changed:
            self._changed()

    def _noise_grown(self) -> set[str]:
        """The running jobs whose noise scale grows with their progress take its value at their last
        loss report; those whose value moved are rated again (as rebatched), so their goodput follows it."""
        grown = {
            name
            for name, state in self.running.items()
            if state.job.max_batch and state.job.noise_growth and state.take_noise_scale()
        }
        self.rebatched |= grown
        return grown

    def _rebatch(self, state: JobState, batch: int | None) -> bool:
        """Applies the batch the policy chose for a running job. Free: the trainers switch together
        at a step boundary without re-forming (the choice travels in the step's collective), so it
        costs at most the step in flight, which the simulator does not charge."""
        if batch is None or batch == state.batch or not state.workers:
            return False
        state.batch = batch
        self.rebatched.add(state.job.name)
        return True

    def _devices(self, node: str, spot: bool, speeds: dict[str, float]) -> NodeDevices:
        name = node_type(self.config.cluster, node).name
        return self.config.cluster.devices(spot, name, speeds.get(name, 1.0))

    def _move(self, state: JobState, nodes: list[str]) -> bool:
        """Applies a job's new nodes; charges a start, a rescale, a hand-over or a move. The operator
        moves a job by deleting the workers that leave before the new ones run: the workers that
        stay re-form, and the newcomers join that round (one rescale); when none stays, the job
        hands over and restarts on the new nodes."""
        if sorted(nodes) == sorted(state.workers):
            return False
        self._sync(state)
        stay = Counter(state.workers) & Counter(nodes)
        moved = stay.total() < min(len(state.workers), len(nodes))
        if not state.workers:
            restarted = state.started_s is not None
            state.paused_until = self.now + (self.config.restart_s if restarted else 0.0)
            if not restarted:
                state.started_s = self.now
                state.report_loss()
        elif not nodes:
            state.hand_over()
        elif moved and not stay:
            state.hand_over()
            state.paused_until = self.now + self.config.restart_s
        else:
            state.paused_until = self.now + self.config.rescale_pause_s
            state.rescales += 1
        self._set_workers(state, nodes)
        return True

    def _set_workers(self, state: JobState, nodes: list[str]) -> None:
        """Every change of a job's workers goes through here, so that `_changed` finds it."""
        self._sync(state)
        state.set_workers(nodes)
        self.touched.add(state.job.name)

    def _changed(self) -> None:
        """Brings node usage, the running jobs' rates and the utilisation up to date after a change.

        `rated` holds the workers each running job was last rated on, which are the ones `used`
        counts: only the touched jobs whose workers differ from them (or that stopped) move the
        usage, and a job's rate depends only on its workers and their nodes' usage, so only those
        jobs, the ones rated on a node whose usage moved and the rebatched ones are rated again
        (re-rating another would repeat its rate and its last report). With thousands of jobs
        running, a change touches a few, and finding them costs what they are, not the cluster."""
        used, rated, on_node = self.used, self.rated, self.on_node
        moved: set[str] = set()
        changed = [
            state
            for state in map(self.states.__getitem__, self.touched)
            if state.workers != rated.get(state.job.name, [])
        ]
        self.touched.clear()
        for state in changed:
            name, gpus = state.job.name, state.job.gpus_per_worker
            for node in rated.pop(name, ()):
                on_node[node].discard(name)
                if node in used:  # not a node that has just gone
                    used[node] -= gpus
                    moved.add(node)
            for node in state.workers:
                used[node] += gpus
                moved.add(node)
            if not state.workers:
                state.rate = 0.0
                del self.running[name]
                self.finish_version.pop(name, None)
        again = {s.job.name for s in changed if s.workers} | (self.rebatched & self.running.keys())
        for node in moved:
            again |= on_node.get(node, set())
        for name in again:
            state = self.running[name] = self.arrived[name]
            self._sync(state)  # at its old rate up to now
            self._rate(state)
            rated[name] = list(state.workers)
            for node in rated[name]:
                on_node.setdefault(node, set()).add(name)
            self._expect(state)
        self.rebatched.clear()
        self._account()

    def _expect(self, state: JobState) -> None:
        """Files when `state` would finish at its new rate (or pause, or progress)."""
        self.versions += 1
        name = state.job.name
        self.finish_version[name] = self.versions
        at = state.finish_time()
        if at < math.inf:
            heapq.heappush(self.finishing, (at, self.order[name], self.versions, name))

    def _rate(self, state: JobState) -> None:
        distinct = set(state.workers)
        share = max(max(1.0, self.used[n] / self.devices.physical) for n in distinct)
        types = {node_type(self.config.cluster, n) for n in distinct}
        # Synchronous training runs at the pace of its slowest GPU type.
        placement = Placement(len(state.workers), len(distinct), share, min(t.speed for t in types))
        model = state.job.model(state.noise_step)
        state.rate = model.goodput(placement, state.batch)
        step_s = model.step_s(placement, state.batch)
        state.measure(placement, step_s, types.pop().name if len(types) == 1 else "")

    def _account(self) -> None:
        physical = self.devices.physical
        self.busy = sum(min(used, physical) for used in self.used.values())
        capacity = len(self.nodes) * physical
        self.utilization.append((self.now, self.busy / capacity if capacity else 0.0))

    def _result(self) -> Result:
        done = [s for s in self.states.values() if s.finished_s is not None]
        first = min((s.job.arrival_s for s in self.states.values()), default=0.0)
        return Result(
            policy=self.policy,
            jct_s=[s.finished_s - s.job.arrival_s for s in done if s.finished_s is not None],
            makespan_s=max((s.finished_s or 0.0 for s in done), default=first) - first,
            busy_gpu_s=self.busy_gpu_s,
            capacity_gpu_s=self.capacity_gpu_s,
            preemptions=self.preemptions,
            rescales=sum(s.rescales for s in self.states.values()),
            loss_at_cutoff=self.loss_at_cutoff,
            unfinished=len(self.states) - len(done),
            utilization=self.utilization,
        )


def simulate(jobs: Sequence[SimJob], policy: str, config: SimConfig) -> Result:
    return Simulation(jobs, policy, config).run()


def unschedulable(jobs: Sequence[SimJob], cluster: ClusterConfig, policy: str) -> list[SimJob]:
    """Jobs that could never start on this cluster (static needs max, the rest min, GPUs on the
    on-demand-plus-spot nodes); the CLI refuses them rather than waiting forever."""
    total = cluster.nodes * cluster.gpus_per_node * cluster.replicas
    per_node = cluster.gpus_per_node * cluster.replicas
    out = []
    for job in jobs:
        workers = job.rigid().max_workers if policy == "static" else job.min_workers
        if workers * job.gpus_per_worker > total or job.gpus_per_worker > per_node:
            out.append(job)
    return out
