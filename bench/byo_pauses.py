"""Pause and steps lost around a join, a SIGTERM and a SIGKILL for each way into the trainer, measured in
the same run: the `TrainingSpec` path (examples/digits/train.py), a torchrun script unmodified under
`ebbflow-train torchrun` (examples/digits/torchrun_ddp.py), the same script with the opt-ins
(`--elastic`), and the same script under stock torchrun (c10d rendezvous hosted by its first agent).

Each run: two nodes train (three for a leave or a crash), then the event; the pause is the gap
between the last step of the old world and the first step of the new one, the steps lost are the
old world's newest step less the step the new world resumed from, both from rank 0's step records.
The torchrun script checkpoints every CHECKPOINT_EVERY steps; the events come at a step between two
checkpoints (their place measured and printed), so "since its checkpoint" shows as a number.

    .venv/bin/python bench/byo_pauses.py [--scenarios join,sigterm,sigkill] [--ways spec,torchrun,...]

Prints one JSON line per measurement, then a table of pauses with each way's ratio to the
`TrainingSpec` path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_cluster import REPO, Job, Node, running_job
from ebbflow_devtools.waiting import wait_for

SCRIPT = str(REPO / "examples" / "digits" / "torchrun_ddp.py")
GLOBAL_BATCH, CHECKPOINT_EVERY = 384, 50
SAMPLE_SECONDS = 0.0003  # device time per sample: ~0.06 s a step at world size 2
# The event comes this many steps after a checkpoint of the torchrun script (half an interval).
PLACE = CHECKPOINT_EVERY // 2
PATIENCE_S = 150.0  # how long to wait for the new world before reporting "never"
WAYS = ("spec", "torchrun", "opt-ins", "stock")
SCENARIOS = ("join", "sigterm", "sigkill")


@dataclass
class Step:
    time: float
    step: int
    world: int


@dataclass
class Measurement:
    way: str
    scenario: str
    pause_s: float  # inf: no step of the new world within PATIENCE_S
    steps_lost: int | None
    event_step: int


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _read_steps(paths: list[Path]) -> list[Step]:
    found = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.startswith("{") else {}
                if record.get("event") == "step" and record.get("rank", 0) == 0:
                    found.append(Step(record["time"], record["step"], record["world"]))
    return sorted(found, key=lambda s: s.time)


def _around(steps: list[Step], changed_at: float, old: int, new: int) -> tuple[float, int] | None:
    """Pause and steps lost, once a step of the `new` world follows the event."""
    first_new = next((s for s in steps if s.time > changed_at and s.world == new), None)
    if first_new is None:
        return None
    last_old = max((s for s in steps if s.world == old and s.time < first_new.time), key=lambda s: s.time)
    return first_new.time - last_old.time, last_old.step - (first_new.step - 1)


class Run:
    """One way's nodes; `steps()` reads rank 0's step records, wherever they are written."""

    def __init__(self, way: str, job: Job, root: Path):
        self.way, self.job, self.root = way, job, root
        self.nodes: list[Node] = []
        self.stock_port = 0

    def script_args(self) -> list[str]:
        args = ["--checkpoint-dir", str(self.root / "checkpoints"), "--steps", "100000"]
        args += ["--global-batch", str(GLOBAL_BATCH), "--checkpoint-every", str(CHECKPOINT_EVERY)]
        args += [
            "--simulated-sample-seconds",
            str(SAMPLE_SECONDS),
            "--events",
            str(self.root / "events.jsonl"),
        ]
        return args + (["--elastic"] if self.way == "opt-ins" else [])

    def start(self) -> Node:
        if self.way == "spec":
            node = self.job.start_node()
        elif self.way == "stock":
            node = self._start_stock()
        else:
            node = self.job.start_torchrun_node(*self.script_args())
        self.nodes.append(node)
        return node

    def _start_stock(self) -> Node:
        index = len(self.nodes)
        log = open(self.root / f"stock{index}.log", "wb")  # noqa: SIM115 - closed with the process
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:3", "--nproc-per-node", "1"]
        if not self.stock_port:
            self.stock_port = free_port()
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.stock_port}"]
        command += ["--rdzv-id", "bench", "--max-restarts", "100", SCRIPT, *self.script_args()]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        node = Node(
            f"stock{index}", process, self.root, self.root / "events.jsonl", self.root / f"stock{index}.log"
        )
        self.job.nodes.append(node)  # the job's shutdown kills what is left of it
        if index == 0:  # the first agent hosts the store; the others dial it
            wait_for(lambda: _listening(self.stock_port), 120, "the first stock agent's store")
        return node

    def steps(self) -> list[Step]:
        if self.way == "spec":
            return _read_steps([node.journal for node in self.nodes])
        return _read_steps([self.root / "events.jsonl"])


def _measure(way: str, scenario: str, root: Path) -> Measurement:
    settings: dict[str, Any] = {"min_replicas": 1, "max_replicas": 3, "steps": 100000}
    if way == "spec":
        # The script's device time: SAMPLE_SECONDS for each of a virtual node's samples.
        settings["extra_args"] = ["--simulated-vnode-seconds", str(SAMPLE_SECONDS * GLOBAL_BATCH / 12)]
        settings.update(virtual_nodes=12, global_batch_size=GLOBAL_BATCH)
    else:
        settings.update(virtual_nodes=12, global_batch_size=GLOBAL_BATCH, script=SCRIPT)
    with running_job(root, **settings) as job:
        run = Run(way, job, root)
        before = 2 if scenario == "join" else 3
        for _ in range(before):
            run.start()
        after = 3 if scenario == "join" else 2
        _trains_at(run, before)
        event_step = _wait_for_place(run)
        changed_at = time.time()
        _apply(scenario, run)
        try:
            pause, lost = wait_for(
                lambda: _around(run.steps(), changed_at, before, after), PATIENCE_S, f"a world of {after}"
            )
        except TimeoutError:
            return Measurement(way, scenario, math.inf, None, event_step)
        return Measurement(way, scenario, pause, lost, event_step)


def _trains_at(run: Run, world: int) -> None:
    wait_for(lambda: sum(s.world == world for s in run.steps()) >= 20, 300, f"{run.way} training at {world}")


def _wait_for_place(run: Run) -> int:
    """The newest step once it lies PLACE steps past a checkpoint of the torchrun script."""

    def placed() -> int | None:
        steps = run.steps()
        newest = steps[-1].step if steps else 0
        return newest if newest % CHECKPOINT_EVERY == PLACE else None

    return int(wait_for(placed, 300, f"step {PLACE} past a checkpoint", interval=0.005))


def _apply(scenario: str, run: Run) -> None:
    events: dict[str, Callable[[], object]] = {
        "join": run.start,
        "sigterm": lambda: run.nodes[-1].process.send_signal(signal.SIGTERM),
        "sigkill": lambda: run.nodes[-1].kill_tree(),  # never the first node: stock's store is there
    }
    events[scenario]()


def _table(results: list[Measurement]) -> str:
    lines = ["| way | " + " | ".join(f"{s}: pause, lost" for s in SCENARIOS) + " |"]
    lines.append("|---|" + "---|" * len(SCENARIOS))
    spec = {m.scenario: m.pause_s for m in results if m.way == "spec"}
    for way in WAYS:
        cells = []
        for scenario in SCENARIOS:
            found = [m for m in results if m.way == way and m.scenario == scenario]
            if not found:
                cells.append("-")
                continue
            m = found[0]
            if math.isinf(m.pause_s):
                cells.append(f"none within {PATIENCE_S:.0f} s")
                continue
            ratio = f" ({m.pause_s / spec[scenario]:.1f}x)" if spec.get(scenario) and way != "spec" else ""
            cells.append(f"{m.pause_s:.1f} s{ratio}, {m.steps_lost}")
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--ways", default=",".join(WAYS))
    args = parser.parse_args()
    results = []
    for scenario in args.scenarios.split(","):
        for way in args.ways.split(","):
            with tempfile.TemporaryDirectory(prefix=f"bench-{way}-{scenario}-") as root:
                measured = _measure(way, scenario, Path(root))
            results.append(measured)
            shown = {**vars(measured), "pause_s": None if math.isinf(measured.pause_s) else measured.pause_s}
            print(json.dumps(shown), flush=True)
    print(_table(results))


if __name__ == "__main__":
    main()
