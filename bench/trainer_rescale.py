"""Rescale pause of the Ebbflow trainer against stock torchrun, TorchFT and DLRover, in the same run.

Scenario (every side): three nodes, nnodes 2:3, c10d rendezvous, gloo on CPU, ~40 ms per step;
once all three train, one node's whole process tree is killed (SIGKILL, as a pod deletion past its
grace period), or its main process gets SIGTERM; or two train and a third joins. The pause is the
gap between the last step completed before the change and the first step completed after it, seen by
a survivor.

Stock torchrun hosts the c10d store in the first agent, so the baseline never kills that node.
TorchFT's and DLRover's sides (`bench/rescale_peers.py`, after `make bench-peers`) run as their
docs run them, said there.

    .venv/bin/python bench/trainer_rescale.py [--scenario sigkill|sigterm] [--repeats 5]
        [--systems ebbflow torchrun torchft dlrover]
    .venv/bin/python bench/trainer_rescale.py --scenario join --systems ebbflow torchft
    .venv/bin/python bench/trainer_rescale.py --systems ebbflow ebbflow-sharded

``ebbflow-sharded`` is the same job trained sharded (``sharding="fsdp"``, fast mode, buddy copies
every step): its pauses against the replicated job's, in the same run.

A join: two nodes train, a third starts; the pause counts from its launcher's first join attempt
(its imports done), as a pod the operator started ahead of need. Prints one JSON line per
measurement, then each system's median and range and the ratio of each peer's median to Ebbflow's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_cluster import SHARDED_DIGITS, Job, Node, running_job
from ebbflow_devtools.waiting import wait_for
from rescale_peers import (
    PATIENCE,
    STEP_SECONDS,
    last_world,
    listening,
    measure_dlrover,
    measure_torchft,
    pause,
    stock_script,
    trained_after,
)

# Where the logs of a run whose survivors never trained again are kept.
RESULTS = Path(__file__).resolve().parent / "results"


def measure_ebbflow(scenario: str, root: Path) -> float:
    return _measure_ebbflow_job(scenario, root, {})


def measure_ebbflow_sharded(scenario: str, root: Path) -> float:
    """The same job trained sharded (FSDP2, fast mode, buddy copies every step)."""
    return _measure_ebbflow_job(scenario, root, {"script": SHARDED_DIGITS, "mode": "fast"})


def _measure_ebbflow_job(scenario: str, root: Path, settings: dict[str, str]) -> float:
    # Production defaults (the test harness lengthens the last call for busy CI machines).
    args = ["--simulated-vnode-seconds", str(STEP_SECONDS / 2), "--last-call-timeout", "1"]
    with running_job(root, min_replicas=2, max_replicas=3, steps=100000, extra_args=args, **settings) as job:
        if scenario == "join":
            return _ebbflow_join(job)
        nodes = [job.start_node() for _ in range(3)]
        wait_for(lambda: all((n.last_step() or {}).get("world") == 3 for n in nodes), 300, "world of 3")
        victim = next(n for n in nodes if (n.last_step() or {}).get("rank") == 1)
        survivor = next(n for n in nodes if n is not victim)
        changed_at = time.time()
        victim.kill_tree() if scenario == "sigkill" else victim.terminate()
        wait_for(lambda: trained_after(survivor.journal, 2, changed_at), 300, "a step at world size 2")
        return pause(survivor.journal, changed_at)


def _ebbflow_join(job: Job) -> float:
    """Two nodes train; a third starts. The survivors' pause from the moment the newcomer's launcher
    asks to join (its imports done: the operator starts pods ahead of need on a real cluster)."""
    nodes = [job.start_node() for _ in range(2)]
    wait_for(lambda: all((n.last_step() or {}).get("world") == 2 for n in nodes), 300, "world of 2")
    newcomer = job.start_node()
    wait_for(
        lambda: "attempts to join" in newcomer.log.read_text(errors="replace"), 300, "the newcomer ready"
    )
    asked_at = time.time()
    wait_for(lambda: trained_after(nodes[0].journal, 3, asked_at), 300, "a step at world size 3")
    return pause(nodes[0].journal, asked_at)


def measure_torchrun(scenario: str, root: Path) -> float:
    script = root / "baseline.py"
    script.write_text(stock_script())
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes: list[Node] = []

    def start_agent() -> Node:
        index = len(nodes)
        journal = root / f"baseline{index}.jsonl"
        log = open(root / f"baseline{index}.log", "wb")  # noqa: SIM115 - closed with the process
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "1"]
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench"]
        command += ["--max-restarts", "100", str(script), str(journal)]
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        nodes.append(Node(f"baseline{index}", process, root, journal, root / f"baseline{index}.log"))
        if index == 0:  # the first agent hosts the store; the others dial it
            wait_for(lambda: listening(port), 120, "the first agent's store")
        return nodes[-1]

    try:
        for _ in range(3):
            start_agent()
        wait_for(lambda: all(last_world(n.journal) == 3 for n in nodes), 300, "stock world of 3")
        survivor = nodes[1]  # nodes[0] hosts the store
        changed_at = time.time()
        if scenario == "sigkill":
            nodes[2].kill_tree()
        else:
            nodes[2].process.send_signal(signal.SIGTERM)
        try:
            wait_for(
                lambda: trained_after(survivor.journal, 2, changed_at),
                PATIENCE,
                "stock torchrun to train again at world size 2",
            )
        except TimeoutError:
            return math.inf  # never resumed within the patience: report that, not a number
        return pause(survivor.journal, changed_at)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill_tree()


def _figures(pauses: list[float]) -> dict[str, float | None]:
    """Median and range of one system's pauses (None where it never trained again)."""
    ordered = sorted(pauses)
    shown = [None if math.isinf(p) else round(p, 2) for p in ordered]
    return {"median_s": shown[len(ordered) // 2], "min_s": shown[0], "max_s": shown[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=("sigkill", "sigterm", "join"), default="sigkill")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=("ebbflow", "ebbflow-sharded", "torchrun", "torchft", "dlrover"),
        default=["ebbflow", "torchrun"],
    )
    args = parser.parse_args()
    if args.scenario == "join" and "torchrun" in args.systems:
        parser.error(
            "--scenario join leaves stock torchrun out: its agent logs no join attempt to time the "
            "pause from; run it with --systems ebbflow torchft"
        )
    measures: dict[str, Callable[[str, Path], float]] = {
        "ebbflow": measure_ebbflow,
        "ebbflow-sharded": measure_ebbflow_sharded,
        "torchrun": measure_torchrun,
        "torchft": measure_torchft,
        "dlrover": measure_dlrover,
    }
    results: dict[str, list[float]] = {name: [] for name in args.systems}
    for repeat in range(args.repeats):
        for name in args.systems:
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as root:
                pause = measures[name](args.scenario, Path(root))
                if math.isinf(pause):
                    kept = RESULTS / f"rescale-{args.scenario}-{name}-{repeat}"
                    shutil.copytree(root, kept, dirs_exist_ok=True)
                    print(f"{name} never trained again; its logs: {kept}", file=sys.stderr)
            results[name].append(pause)
            shown = None if math.isinf(pause) else pause
            print(json.dumps({"system": name, "scenario": args.scenario, "repeat": repeat, "pause_s": shown}))
    summary: dict[str, object] = {"scenario": args.scenario, "repeats": args.repeats}
    summary.update({name: _figures(pauses) for name, pauses in results.items()})
    ebbflow = sorted(results.get("ebbflow", []))
    for peer in ("ebbflow-sharded", "torchrun", "torchft", "dlrover"):
        if ebbflow and peer in results:
            theirs = sorted(results[peer])
            ratio = theirs[len(theirs) // 2] / ebbflow[len(ebbflow) // 2]
            summary[f"{peer}_over_ebbflow_median"] = "inf" if math.isinf(ratio) else round(ratio, 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
