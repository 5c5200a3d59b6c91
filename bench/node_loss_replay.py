"""Replays the operator benchmark's node deletions through the pure pass (`decide`), without any API:
per deletion, which jobs lost workers, which other jobs the allocation changed, and how many passes
it took until a pass had nothing to write. Explains the deletions of `operator_bench.py` that take a
second pass: fair share moving a worker to a job the loss put two below another's share.

    .venv/bin/python bench/node_loss_replay.py [--jobs 100] [--nodes 500] [--deletions 20]
                                               [--layout random|packed] [--seed 0]

The state is the benchmark's steady phase: JOBS jobs (min 2, max 24, 1 GPU per worker) on NODES
nodes of 4 GPUs, every GPU held. `random` places the workers on shuffled GPU slots (a scheduler
spreading them), `packed` node by node (a job's workers together). Plans are applied to the replayed
world as the API server and a scheduler would: deleted pods go at once, new workers run on a random
free GPU (the world's own random generator, seeded). Writes bench/results/node_loss_replay.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebbflow_devtools.builders import NOW, JobBuilder, make_job, make_node, make_rendezvous, make_worker
from ebbflow_operator.decision.allocator import PriorityFairShare
from ebbflow_operator.decision.decide import OperatorConfig, decide
from ebbflow_operator.decision.model import Job, Node, Pod
from ebbflow_operator.decision.plan import Plan

from bench.decide_scale import GPUS_PER_NODE, MAX, MIN, children

REPO = Path(__file__).resolve().parents[1]


PASSES_BEFORE_GIVING_UP = 10


@dataclass
class World:
    """Nodes, each job's workers (index -> node) and statuses, changed only by applying plans."""

    nodes: list[Node]
    workers: dict[str, dict[int, str]]
    statuses: dict[str, dict[str, Any]]
    rng: random.Random
    next_index: dict[str, int] = field(default_factory=dict)

    def objects(self) -> tuple[list[Pod], list[Job]]:
        jobs = [
            make_job(JobBuilder(name).replicas(MIN, MAX), age=3600 - i, status=self.statuses[name])
            for i, name in enumerate(self.workers)
        ]
        pods = [
            pod
            for job in jobs
            for pod in (
                *(make_worker(job, index, node) for index, node in self.workers[job.name].items()),
                make_rendezvous(job, self.nodes[0].name),
            )
        ]
        return pods, jobs

    def free(self) -> dict[str, int]:
        free = {node.name: node.gpus for node in self.nodes}
        for placed in self.workers.values():
            for node in placed.values():
                if node in free:
                    free[node] -= 1
        return free

    def apply(self, plans: tuple[Plan, ...]) -> set[str]:
        """Deletions first (they free GPUs), then creations on random free GPUs; the jobs written."""
        for plan in plans:
            self.statuses[plan.job.name] = plan.status
            for deletion in plan.delete:
                self.workers[plan.job.name].pop(int(deletion.name.rsplit("-", 1)[1]), None)
        free = self.free()
        for plan in plans:
            for _ in plan.create_workers:
                node = self.rng.choice(sorted(name for name, gpus in free.items() if gpus > 0))
                free[node] -= 1
                index = self.next_index.get(plan.job.name, MAX)
                self.workers[plan.job.name][index] = node
                self.next_index[plan.job.name] = index + 1
        return {plan.job.name for plan in plans if plan.has_work}

    def settle(self) -> tuple[int, set[str]]:
        """Passes until one writes nothing, and every job written on the way."""
        written: set[str] = set()
        for passes in range(PASSES_BEFORE_GIVING_UP):
            pods, jobs = self.objects()
            services, policies = children(jobs)
            result = decide(
                self.nodes, pods, jobs, services, policies, NOW, OperatorConfig(), PriorityFairShare()
            )
            touched = self.apply(result.plans)
            if not touched:
                return passes, written
            written |= touched
        raise RuntimeError(f"no pass without writes after {PASSES_BEFORE_GIVING_UP}")


def converged(jobs: int, nodes: int, layout: str, rng: random.Random) -> World:
    """Every GPU held, each job's fair share of them, in the given layout, its status settled."""
    node_list = [make_node(f"gpu-{n}", GPUS_PER_NODE) for n in range(nodes)]
    slots = [node.name for node in node_list for _ in range(GPUS_PER_NODE)]
    if layout == "random":
        rng.shuffle(slots)
    total = len(slots)
    workers: dict[str, dict[int, str]] = {}
    for i in range(jobs):
        share = min(MAX, total // jobs + (1 if i < total % jobs else 0))
        workers[f"job-{i}"] = {w: slots.pop(0) for w in range(share)}
    world = World(node_list, workers, {name: {} for name in workers}, rng)
    world.settle()
    return world


def replay(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    world = converged(args.jobs, args.nodes, args.layout, rng)
    deletions = []
    for number in range(1, args.deletions + 1):
        gone = world.nodes.pop(rng.randrange(len(world.nodes))).name
        lost = {
            name: sum(1 for node in placed.values() if node == gone)
            for name, placed in world.workers.items()
            if gone in placed.values()
        }
        passes, written = world.settle()
        others = sorted(written - set(lost))
        deletions.append({"node": gone, "lost": lost, "others_changed": others, "passes": passes})
        print(f"deletion {number:2}: lost {lost}; others changed {len(others)}; passes {passes}", flush=True)
    return {
        "jobs": args.jobs,
        "nodes": args.nodes,
        "layout": args.layout,
        "seed": args.seed,
        "deletions": deletions,
        "deletions_with_other_jobs_changed": sum(1 for d in deletions if d["others_changed"]),
        "other_jobs_changed_mean": statistics.mean(len(d["others_changed"]) for d in deletions),
        "passes_per_deletion": {n: sum(1 for d in deletions if d["passes"] == n) for n in (1, 2, 3)},
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--deletions", type=int, default=20)
    parser.add_argument("--layout", choices=("random", "packed"), default="random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "node_loss_replay.json")
    args = parser.parse_args()
    results = replay(args)
    summary = {k: v for k, v in results.items() if k != "deletions"}
    print(json.dumps(summary, indent=2))
    args.output.parent.mkdir(exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
