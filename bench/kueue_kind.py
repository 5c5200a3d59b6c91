"""What Kueue's accounting costs real trainers, on the kind cluster (hack/kind, Kueue installed beside
the chart, `operator.kueue=true`): the same two jobs with Kueue (labeled with a LocalQueue on a
ClusterQueue of 12 GPUs, the cluster's) and without it (unlabeled), alternating, in one run.

Job A: the digits example, up to three whole-node workers (4 GPUs each: every GPU of the cluster),
checkpoint and journal on a shared volume. Job B: priority 100, one worker of 2 GPUs. Timed from the
workers' journals (host clock, the same as the nodes'):

1. A submitted -> A's first step;
2. B submitted -> B's first step (with Kueue: one of A's workers leaves gracefully to make room, A's
   slice's count is lowered, B's slice created and admitted; without: Ebbflow's allocator takes one
   of A's workers by priority);
3. B submitted -> A training again on two workers, from memory either way.

    .venv/bin/python -m ebbflow_devtools.kind   # the e2e cluster, once
    .venv/bin/python bench/kueue_kind.py [--repeats 3] [--output bench/results/kueue-kind.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from ebbflow_devtools.kind import E2E_NAMESPACE, Kind, KindError, kueue_ready, poll
from ebbflow_devtools.kind_jobs import (
    digits_job,
    make_shared_dir,
    on_shared_volume,
    read_journal,
    shared_claim,
)
from ebbflow_devtools.kueue import cluster_queue, local_queue, resource_flavor
from ebbflow_devtools.waiting import NotYet

CLUSTER_GPUS = 12
QUEUE, CLUSTER_QUEUE, FLAVOR = "bench", "bench-gpus", "bench-default"
CLAIM = "bench-kueue"
TIMEOUT_S = 420  # for each wait: pods starting on a loaded machine take a minute at most


def _queue_objects() -> list[dict[str, Any]]:
    return [
        resource_flavor(FLAVOR),
        cluster_queue(CLUSTER_QUEUE, CLUSTER_GPUS, E2E_NAMESPACE, flavor=FLAVOR),
        local_queue(E2E_NAMESPACE, QUEUE, CLUSTER_QUEUE),
    ]


def _apply(kind: Kind, manifests: list[dict[str, Any]]) -> None:
    def applied() -> bool | NotYet:
        try:
            kind.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        except KindError as error:
            return NotYet(str(error))
        return True

    poll(applied, 120, "applied")


def _first_step_after(directory: Path, after: float, world: int | None = None) -> float | NotYet:
    """When the first step after `after` was trained (in a world of `world`, if given)."""
    size = None
    for event in read_journal(directory):
        if event["event"] == "generation" and event["time"] >= after:
            size = event["world"]
        if event["event"] == "step" and event["time"] >= after and (world is None or size == world):
            return float(event["time"])
    return NotYet(f"no step after {after} in {directory}")


def _empty_namespace(kind: Kind) -> None:
    kind.kubectl("-n", E2E_NAMESPACE, "delete", "elastictrainingjobs", "--all", "--wait=true", timeout=300)
    kind.kubectl(
        "-n", E2E_NAMESPACE, "delete", "pods", "--all", "--grace-period=1", "--wait=true", timeout=300
    )


def one_run(kind: Kind, shared: Path, queued: bool, index: int) -> dict[str, float]:
    mode = "kueue" if queued else "plain"
    queue = QUEUE if queued else None
    a_dir = make_shared_dir(shared, f"{CLAIM}-a-{mode}-{index}")
    b_dir = make_shared_dir(shared, f"{CLAIM}-b-{mode}-{index}")
    a = digits_job("bench-a", 1, 3, 100_000, 0.03, gpus=4, virtual_nodes=12, queue=queue)
    b = digits_job("bench-b", 1, 1, 100_000, 0.03, gpus=2, priority=100, queue=queue)
    submitted = time.time()
    _apply(kind, [on_shared_volume(a, CLAIM, a_dir.name, 50)])
    a_first = poll(lambda: _first_step_after(a_dir, submitted), TIMEOUT_S, "A's first step")
    poll(lambda: _first_step_after(a_dir, submitted, world=3), TIMEOUT_S, "A training on three")
    preempting = time.time()
    _apply(kind, [on_shared_volume(b, CLAIM, b_dir.name, 50)])
    b_first = poll(lambda: _first_step_after(b_dir, preempting), TIMEOUT_S, "B's first step")
    a_again = poll(lambda: _first_step_after(a_dir, preempting, world=2), TIMEOUT_S, "A training on two")
    _empty_namespace(kind)
    return {
        "submitted_to_first_step_s": a_first - submitted,
        "preemptor_submitted_to_its_first_step_s": b_first - preempting,
        "preemptor_submitted_to_preempted_training_again_s": a_again - preempting,
    }


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for measure in runs["kueue"][0]:
        medians = {mode: statistics.median(r[measure] for r in rows) for mode, rows in runs.items()}
        ranges = {
            mode: [round(min(r[measure] for r in rows), 2), round(max(r[measure] for r in rows), 2)]
            for mode, rows in runs.items()
        }
        result[measure] = {
            "median": {mode: round(m, 2) for mode, m in medians.items()},
            "range": ranges,
            "kueue_over_plain": round(medians["kueue"] / medians["plain"], 2),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("bench/results/kueue-kind.json"))
    args = parser.parse_args()
    kind = Kind()
    _empty_namespace(kind)
    kueue_ready(kind)
    _apply(kind, _queue_objects())
    runs: dict[str, list[dict[str, float]]] = {"kueue": [], "plain": []}
    try:
        with shared_claim(kind, CLAIM, ()) as shared:
            for index in range(args.repeats):
                for queued in (True, False):
                    row = one_run(kind, shared, queued, index)
                    runs["kueue" if queued else "plain"].append(row)
                    print(
                        "kueue" if queued else "plain", {k: round(v, 2) for k, v in row.items()}, flush=True
                    )
    finally:
        for kind_of, name, scope in (
            ("localqueue", QUEUE, ("-n", E2E_NAMESPACE)),
            ("clusterqueue", CLUSTER_QUEUE, ()),
            ("resourceflavor", FLAVOR, ()),
        ):
            kind.kubectl("delete", *scope, kind_of, name, "--ignore-not-found", "--wait=true", timeout=180)
    result = {"runs": runs, "summary": summary(runs)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
