"""Pause of the Ebbflow trainer when its rendezvous store is lost and a new, empty one comes up at the
same address (what a replaced rendezvous pod behind the same Service gives).

Scenario: two nodes (min 2, max 2), gloo on CPU, ~40 ms per step, production rendezvous timeouts
(last call 1 s). Once both train, the store process is killed (SIGKILL); the workers train on without
it; ``--down`` seconds later a new store process is started on the same port. The launchers notice it,
stop their workers at a step boundary, re-form on the new store and resume from memory.

Figures per repetition (wall clock, from the journals of the two nodes):

- ``pause_s``: from the store's death to the first step completed in the new world, minus the down
  time imposed (kill to restart command): the delay the re-form adds, new store process start included;
- ``from_store_up_s``: from the new store serving (its port file written) to that first step;
- ``training_gap_s``: the gap between rank 0's last step before the re-form and its first after (its
  journal's ``resumed`` record): how long training stood still (it trained on while the store was down);
- ``steps_without_store``: steps completed between the kill and the restart command.

    .venv/bin/python bench/store_loss.py [--repeats 5] [--down 5]

Prints one JSON line per repetition and a summary (median, min, max) and writes them to
``bench/results/store_loss.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ebbflow_devtools.testing.trainer_cluster import Job, Node, running_job
from ebbflow_devtools.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]


RESULTS = REPO / "bench" / "results" / "store_loss.json"
STEP_SECONDS = 0.04
FIGURES = ("pause_s", "from_store_up_s", "training_gap_s", "steps_without_store")


def _steps(node: Node) -> list[dict[str, Any]]:
    return node.events("step")


def _first_step_after(nodes: list[Node], generation: int) -> dict[str, Any] | None:
    later = [r for n in nodes for r in _steps(n) if r["generation"] > generation]
    return min(later, key=lambda r: r["time"]) if later else None


def _resumed(nodes: list[Node], generation: int) -> dict[str, Any] | None:
    """Rank 0's ``resumed`` record of ``generation``: the gap between its last step before the re-form
    and its first after (the trainer's ``ebbflow_trainer_rescale_pause_seconds``)."""
    for node in nodes:
        ranks = {r["rank"] for r in node.events("generation") if r["generation"] == generation}
        if ranks == {0}:
            return next((r for r in node.events("resumed") if r["generation"] == generation), None)
    return None


def _down(job: Job, nodes: list[Node], seconds: float) -> None:
    """The store stays away ``seconds``; every launcher must still be running."""
    until = time.monotonic() + seconds

    def over() -> bool:
        for node in nodes:
            assert node.process.poll() is None, f"{node.name} exited without its store:\n{job.logs()}"
        return time.monotonic() >= until

    wait_for(over, seconds + 10, f"{seconds} s without the store")


def measure(root: Path, down: float) -> dict[str, float]:
    # Production defaults for the rendezvous (the test harness lengthens the last call for busy CI).
    args = ["--simulated-vnode-seconds", str(STEP_SECONDS / 2), "--last-call-timeout", "1"]
    with running_job(root, min_replicas=2, max_replicas=2, steps=100000, extra_args=args) as job:
        nodes = [job.start_node() for _ in range(2)]
        wait_for(lambda: all(len(_steps(n)) >= 20 for n in nodes), 300, "both nodes training")
        generation = max(r["generation"] for n in nodes for r in _steps(n))
        killed_at = time.time()
        job.kill_rendezvous()
        _down(job, nodes, down)
        restart_at = time.time()
        job.restart_rendezvous()
        serving_at = (root / "rdzv.port").stat().st_mtime
        first = wait_for(lambda: _first_step_after(nodes, generation), 300, "a step in a new world")
        resumed = wait_for(lambda: _resumed(nodes, first["generation"]), 60, "rank 0's resumed event")
        without = [r for r in _steps(nodes[0]) if killed_at <= r["time"] < restart_at]
        return {
            # From the kill, less the down time imposed (kill to restart command).
            "pause_s": (first["time"] - killed_at) - (restart_at - killed_at),
            "from_store_up_s": first["time"] - serving_at,
            "training_gap_s": resumed["pause_seconds"],
            "steps_without_store": float(len(without)),
        }


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        figure: {
            "median": statistics.median(r[figure] for r in runs),
            "min": min(r[figure] for r in runs),
            "max": max(r[figure] for r in runs),
        }
        for figure in FIGURES
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--down", type=float, default=5.0, help="seconds without a store")
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-store-loss-") as root:
            run = measure(Path(root), args.down)
        runs.append(run)
        print(json.dumps({"repeat": repeat, **{k: round(v, 3) for k, v in run.items()}}), flush=True)
    summary = _summary(runs)
    print(json.dumps({"down_s": args.down, "repeats": args.repeats, **summary}))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"down_s": args.down, "runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
