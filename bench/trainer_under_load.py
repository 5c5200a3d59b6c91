"""False re-formations under load: a three-node Ebbflow job trains beside a CPU stress for minutes.

Three nodes (nnodes 2:3, gloo on CPU, ~40 ms steps, the trainer's production heartbeat budget) form
a world of three; then `--stress` busy processes raise the load average to about that many on this
machine's cores, and once its one-minute figure reaches `--load` the job trains on for `--minutes`.
Nobody joins or leaves meanwhile, so every re-formation from the stress's start is a false one.
Each comes with its cause from the launchers' journals (`world` events: who joined, who left and
on what evidence, or "no membership change").

    .venv/bin/python bench/trainer_under_load.py [--minutes 10] [--stress 24] [--load 20]

Prints one JSON line: the load average sampled every 5 s once at `--load` (min, median, max), the
minutes at that load and of stress in all, the steps trained under stress and their rate beside
the rate before it, every re-formation with its cause, and the count of false ones (the goal: 0).
A member dropped because its heartbeats stopped under load shows as a membership change ("left: no
departure recorded"), and is as false as a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ebbflow_devtools.testing.trainer_cluster import Job, Node, running_job
from ebbflow_devtools.waiting import wait_for

STEP_SECONDS = 0.04
LOAD_SAMPLE_SECONDS = 5.0
# Training before the stress starts, for the rate to compare with.
CALM_SECONDS = 30.0


def _steps_between(node: Node, start: float, end: float) -> int:
    return sum(1 for s in node.events("step") if start <= s["time"] < end)


def _reformations(nodes: list[Node], start: float, end: float) -> list[dict[str, Any]]:
    """Every world formed in [start, end) with each node's account of why, by generation."""
    by_generation: dict[int, list[dict[str, Any]]] = {}
    for node in nodes:
        for change in node.events("world"):
            if start <= change["time"] < end:
                by_generation.setdefault(change["generation"], []).append(change)
    return [
        {
            "generation": generation,
            "joined": sorted({n for c in changes for n in c["joined"]}),
            "left": {n: why for c in changes for n, why in c["left"].items()},
            "membership_changed": any(c["membership_changed"] for c in changes),
        }
        for generation, changes in sorted(by_generation.items())
    ]


def busy_processes(processes: int) -> list[subprocess.Popen[bytes]]:
    """``processes`` Python loops that never sleep: a CPU stress (kill them when done)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]


def _run(job: Job, minutes: float, stress: int, load: float) -> dict[str, Any]:
    nodes = [job.start_node() for _ in range(3)]
    wait_for(lambda: all((n.last_step() or {}).get("world") == 3 for n in nodes), 300, "a world of 3")
    calm_start = time.time()
    time.sleep(CALM_SECONDS)  # the rate without stress: the window is a duration, not a condition
    stress_start = time.time()
    busy = busy_processes(stress)
    loads: list[float] = []
    try:
        wait_for(lambda: os.getloadavg()[0] >= load, 600, f"a load average of {load}")
        at_load = time.time()
        deadline = time.monotonic() + minutes * 60
        while time.monotonic() < deadline:
            time.sleep(LOAD_SAMPLE_SECONDS)
            loads.append(os.getloadavg()[0])
            if any(n.process.poll() is not None for n in nodes):
                break  # a launcher exited: the journals say why
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    stress_end = time.time()
    reformations = _reformations(nodes, stress_start, stress_end)
    calm = _steps_between(nodes[0], calm_start, stress_start)
    stressed = _steps_between(nodes[0], stress_start, stress_end)
    return {
        "minutes_at_load": round((stress_end - at_load) / 60, 2),
        "minutes_of_stress": round((stress_end - stress_start) / 60, 2),
        "stress_processes": stress,
        "cores": os.cpu_count(),
        "load_average": {
            "min": round(min(loads), 1),
            "median": round(statistics.median(loads), 1),
            "max": round(max(loads), 1),
        },
        "launchers_exited": [n.name for n in nodes if n.process.poll() is not None],
        "steps_per_s_calm": round(calm / (stress_start - calm_start), 2),
        "steps_under_stress": stressed,
        "steps_per_s_under_stress": round(stressed / (stress_end - stress_start), 2),
        "reformations": reformations,
        # Nobody joined or left on purpose: each of them is false, whatever the journals blame.
        "false_reformations": len(reformations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--stress", type=int, default=24, help="busy processes beside the job")
    parser.add_argument("--load", type=float, default=20.0, help="the load average the clock starts at")
    args = parser.parse_args()
    # Production defaults (the test harness lengthens the last call for busy CI machines).
    extra = ["--simulated-vnode-seconds", str(STEP_SECONDS / 2), "--last-call-timeout", "1"]
    with tempfile.TemporaryDirectory(prefix="bench-load-") as scratch:
        root = Path(scratch)
        with running_job(root, min_replicas=2, max_replicas=3, steps=10**7, extra_args=extra) as job:
            print(json.dumps(_run(job, args.minutes, args.stress, args.load)), flush=True)


if __name__ == "__main__":
    main()
