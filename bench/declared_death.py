"""A node its peers cannot see die: the operator's declaration against the heartbeat budget.

Three nodes of an unmodified torchrun script whose ranks never call a collective after they meet
(tests/trainer/quiet_script.py), so nothing but the rendezvous can tell the survivors; once the
three train, one node's processes are frozen (SIGSTOP: its liveness port still accepts, its
heartbeats stop, as a hung or partitioned machine's). Then either nobody says anything (the
survivors' rendezvous drops it when its heartbeats expire, the trainer's production budget of 10 s)
or, at once, the job's rendezvous pod is told through its declarations endpoint with the job's
token, as the operator does when it sees the pod fail or its node go. Measured: seconds from the
freeze to the survivors' world of two (its start event seen; polled every 50 ms).

    .venv/bin/python bench/declared_death.py [--repeats 5]

Prints one JSON line per repetition, then each way's median and range and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ebbflow_api.contract import ENV_POD_NAME
from ebbflow_devtools.testing.trainer_cluster import running_job
from ebbflow_devtools.waiting import NotYet, wait_for

QUIET_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "trainer" / "quiet_script.py"
WORLD_DEADLINE_S = 120
POLL_S = 0.05


def _worlds(events: Path) -> list[int]:
    return [json.loads(line)["world"] for line in events.read_text().splitlines()] if events.exists() else []


def _await_world(events: Path, size: int, after: int) -> int:
    """Once a world started after the first `after` has `size` members; how many worlds started."""

    def formed() -> int | NotYet:
        worlds = _worlds(events)
        return len(worlds) if len(worlds) > after and worlds[-1] == size else NotYet(f"worlds: {worlds}")

    return wait_for(formed, WORLD_DEADLINE_S, f"a world of {size}", interval=POLL_S)


def one_run(root: Path, declared: bool) -> float:
    """Seconds from the freeze to the world of two."""
    events = root / "events.jsonl"
    settings = {"min_replicas": 1, "max_replicas": 3, "script": str(QUIET_SCRIPT), "rendezvous_token": "t"}
    with running_job(root, **settings) as job:
        args = ("--events", str(events), "--seconds", "900")
        nodes = [
            job.start_torchrun_node(*args, env=job.environment(**{ENV_POD_NAME: f"pod-{i}"}))
            for i in range(3)
        ]
        started = _await_world(events, 3, 0)
        frozen_at = time.monotonic()
        nodes[2].freeze()
        if declared:
            status, answer = job.declare_gone({"pod-2": "its node is gone"})
            assert (status, answer) == (200, {"pod-2": "removed"}), (status, answer)
        _await_world(events, 2, started)
        return time.monotonic() - frozen_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {"heartbeats": [], "declared": []}
    with tempfile.TemporaryDirectory(prefix="declared-death-") as scratch:
        for repetition in range(args.repeats):
            for way in seconds:
                root = Path(scratch) / f"{way}-{repetition}"
                root.mkdir()
                took = one_run(root, declared=way == "declared")
                seconds[way].append(took)
                print(
                    json.dumps({"way": way, "repetition": repetition, "seconds": round(took, 2)}), flush=True
                )
    medians = {way: statistics.median(values) for way, values in seconds.items()}
    summary = {
        way: {"median": round(medians[way], 2), "min": round(min(v), 2), "max": round(max(v), 2)}
        for way, v in seconds.items()
    }
    summary["heartbeats_over_declared"] = round(medians["heartbeats"] / medians["declared"], 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
