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

``--stress 24 --load 20``: the same beside 24 busy processes, measured once the load average is 20;
each side's stalls before the disruption (gaps of 1 s or more between steps of one world size:
re-formations nobody's arrival or departure caused) are counted beside its pauses.
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
    Pause,
    last_world,
    listening,
    measure_dlrover,
    measure_torchft,
    never,
    pause,
    stock_script,
    trained_after,
)
from trainer_under_load import busy_processes

# Where the logs of a run whose survivors never trained again are kept.
RESULTS = Path(__file__).resolve().parent / "results"


def measure_ebbflow(scenario: str, root: Path) -> Pause:
    return _measure_ebbflow_job(scenario, root, {})


def measure_ebbflow_sharded(scenario: str, root: Path) -> Pause:
    """The same job trained sharded (FSDP2, fast mode, buddy copies every step)."""
    return _measure_ebbflow_job(scenario, root, {"script": SHARDED_DIGITS, "mode": "fast"})


def _measure_ebbflow_job(scenario: str, root: Path, settings: dict[str, str]) -> Pause:
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


def _ebbflow_join(job: Job) -> Pause:
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


def measure_torchrun(scenario: str, root: Path) -> Pause:
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
            return never(survivor.journal, changed_at)
        return pause(survivor.journal, changed_at)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill_tree()


def _measure_all(
    scenario: str, repeats: int, systems: list[tuple[str, Callable[[str, Path], Pause]]]
) -> dict[str, list[Pause]]:
    """Each system's pauses, the systems taking turns in each repetition; one JSON line for each."""
    results: dict[str, list[Pause]] = {name: [] for name, _ in systems}
    for repeat in range(repeats):
        for name, measure in systems:
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as root:
                measured = measure(scenario, Path(root))
                if math.isinf(measured.seconds):
                    kept = RESULTS / f"rescale-{scenario}-{name}-{repeat}"
                    shutil.copytree(root, kept, dirs_exist_ok=True)
                    print(f"{name} never trained again; its logs: {kept}", file=sys.stderr)
            results[name].append(measured)
            line = {"system": name, "scenario": scenario, "repeat": repeat}
            line |= {"pause_s": None if math.isinf(measured.seconds) else measured.seconds}
            line |= {"stalls": measured.stalls, "load_average": round(os.getloadavg()[0], 1)}
            print(json.dumps(line), flush=True)
    return results


def _figures(measured: list[Pause]) -> dict[str, float | int | None]:
    """Median and range of one system's pauses (None where it never trained again), and its stalls."""
    ordered = sorted(m.seconds for m in measured)
    shown = [None if math.isinf(p) else round(p, 2) for p in ordered]
    stalls = sum(m.stalls for m in measured)
    return {"median_s": shown[len(ordered) // 2], "min_s": shown[0], "max_s": shown[-1], "stalls": stalls}


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
    parser.add_argument(
        "--stress", type=int, default=0, help="busy processes beside every run (e.g. 24 on 2 cores)"
    )
    parser.add_argument(
        "--load", type=float, default=20.0, help="with --stress: the load average first reached"
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
    busy = busy_processes(args.stress)
    try:
        if args.stress:
            wait_for(lambda: os.getloadavg()[0] >= args.load, 600, f"a load average of {args.load}")
        results = _measure_all(args.scenario, args.repeats, [(name, measures[name]) for name in args.systems])
    finally:
        for process in busy:
            process.kill()
    summary: dict[str, object] = {"scenario": args.scenario, "repeats": args.repeats, "stress": args.stress}
    summary.update({name: _figures(pauses) for name, pauses in results.items()})
    ebbflow = sorted(m.seconds for m in results.get("ebbflow", []))
    for peer in ("ebbflow-sharded", "torchrun", "torchft", "dlrover"):
        if ebbflow and peer in results:
            theirs = sorted(m.seconds for m in results[peer])
            ratio = theirs[len(theirs) // 2] / ebbflow[len(ebbflow) // 2]
            summary[f"{peer}_over_ebbflow_median"] = "inf" if math.isinf(ratio) else round(ratio, 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
