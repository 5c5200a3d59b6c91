"""The peers' sides of `bench/trainer_rescale.py` and what every side measures with: three nodes,
40 ms steps of one all-reduce of 1,000 floats on gloo, a disruption, a survivor's longest gap
between completed steps around it.

- TorchFT (PyPI `torchft` 0.2.0): each node a replica group of one process (rank 0 of 1) with its
  own store, and a Lighthouse forming a quorum of groups every step (`--min_replicas 2`, quorum tick
  and join timeout as its README runs it: `--quorum_tick_ms 100 --join_timeout_ms 10000`, heartbeat
  timeout its default 5 s; the manager's and gloo's timeouts 5 s as in its train_ddp.py). A group
  whose collective failed does not commit the step; the next quorum leaves a dead group out once its
  heartbeats stop. A newcomer joins the next quorum and takes the state from a healthy group over
  HTTP. There is no graceful leave: SIGTERM ends the process like a crash.
- DLRover (PyPI `dlrover` 0.6.1): its job master on the local platform (`--node_num 3`) and one
  `dlrover-run --nnodes 2:3` elastic agent per node running the stock script, restarts unbounded,
  its rendezvous's last call 1 s instead of 60 (`--rdzv-conf lastcall_timeout=1`), otherwise its
  defaults (network check off: it would run a check job before each rendezvous).

Neither is a project dependency: `make bench-peers` installs them into `.tools/bench-peers`, which
only these processes put on their path (the venv's torch serves them).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from ebbflow_devtools.ports import free_port
from ebbflow_devtools.testing.trainer_cluster import Node, descendants
from ebbflow_devtools.waiting import wait_for

STEP_SECONDS = 0.04
# How long a side's survivors may take to train again before the pause counts as "never".
PATIENCE = 150.0
REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".tools" / "bench-peers"
# What TorchFT's `torchft_lighthouse` command runs (from a file: it parses the process's own argv).
LIGHTHOUSE_MAIN = "import sys; from torchft._torchft import lighthouse_main; sys.exit(lighthouse_main())"
LIGHTHOUSE_FLAGS = ("--min_replicas", "2", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000")

# DLRover's documented rendezvous knob (`--rdzv-conf join_timeout=600,lastcall_timeout=60,...`): its
# master waits `lastcall_timeout` seconds for more nodes before completing a round below the
# maximum; 1 s, as Ebbflow's last call (60 s by default: a lost node's round waits it out).
DLROVER_RDZV_CONF = "lastcall_timeout=1"

# A minimal torchrun training script: one all-reduce per step, a journal line per completed step.
_STOCK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    journal = open(sys.argv[1], "a", buffering=1)
    step = 0
    while step < 100000:
        time.sleep(STEP_SECONDS)
        tensor = torch.ones(1000)
        dist.all_reduce(tensor)
        step += 1
        journal.write(json.dumps({"event": "step", "step": step, "world": dist.get_world_size(),
                                  "rank": dist.get_rank(), "time": time.time()}) + "\\n")
    """
)

# One TorchFT replica group: the same step through its fault-tolerant DDP, journaled once the
# manager commits it; "ready" once its imports are done (the moment a join is timed from).
_REPLICA_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta
    import torch
    torch.set_num_threads(1)
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    journal = open(sys.argv[1], "a", buffering=1)
    def record(event, **fields):
        journal.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\\n")
    record("ready")
    # The replica group's own store, which torchrun would host for a group of several processes.
    store = torch.distributed.TCPStore(
        "127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True, wait_for_workers=False
    )
    model = torch.nn.Linear(1000, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}
    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=2,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=os.environ["REPLICA_ID"],
        timeout=timedelta(seconds=5),
        rank=0,
        world_size=1,
    )
    ddp = DistributedDataParallel(manager, model)
    while manager.current_step() < 100000:
        time.sleep(STEP_SECONDS)
        manager.start_quorum()
        optimizer.zero_grad()
        ddp(torch.ones(1, 1000)).sum().backward()
        if manager.should_commit():
            optimizer.step()
            record("step", step=manager.current_step(), world=manager.num_participants(), rank=0)
    """
)


def stock_script() -> str:
    return _STOCK_SCRIPT.replace("STEP_SECONDS", str(STEP_SECONDS))


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _steps(journal: Path) -> list[dict[str, float]]:
    if not journal.exists():
        return []
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == "step"]


class Pause(NamedTuple):
    """One disruption seen by a survivor: the longest gap between its steps around the change (inf:
    it never trained again within the patience), and its stalls before it: gaps of ``STALL_S`` or
    more between steps of one world size, where nobody joined or left (a false re-formation)."""

    seconds: float
    stalls: int


STALL_S = 1.0


def pause(survivor_journal: Path, changed_at: float) -> Pause:
    steps = _steps(survivor_journal)
    window = [t for t in sorted(r["time"] for r in steps) if t >= changed_at - 1.0]
    return Pause(max(later - earlier for earlier, later in pairwise(window)), _stalls(steps, changed_at))


def never(survivor_journal: Path, changed_at: float) -> Pause:
    """The survivor did not train again within the patience: reported as such, not as a number."""
    return Pause(math.inf, _stalls(_steps(survivor_journal), changed_at))


def _stalls(steps: list[dict[str, float]], before: float) -> int:
    ordered = sorted((r for r in steps if r["time"] < before - 1.0), key=lambda r: r["time"])
    return sum(
        1
        for earlier, later in pairwise(ordered)
        if later["world"] == earlier["world"] and later["time"] - earlier["time"] >= STALL_S
    )


def trained_after(journal: Path, world: int, moment: float) -> bool:
    return any(r["world"] == world and r["time"] > moment for r in _steps(journal))


def last_world(journal: Path) -> float:
    steps = _steps(journal)
    return steps[-1]["world"] if steps else 0


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as output:
        return subprocess.Popen(
            command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )


@contextmanager
def _peer_processes(package: str) -> Iterator[tuple[dict[str, str], list[subprocess.Popen[bytes]]]]:
    """The environment a peer's processes run in, and a list of them, every one killed on exit."""
    if not (PEERS / package).is_dir():
        raise SystemExit(f"{package} is not installed in {PEERS}: run `make bench-peers` first")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PEERS)}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield env, processes
    finally:
        for process in processes:
            for pid in [process.pid, *descendants(process.pid)]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()


def _disrupt(scenario: str, nodes: list[Node], victim: Node, survivor: Node) -> Pause:
    """Once all three train, SIGKILL the victim's process tree or SIGTERM its main process; the
    survivor's pause."""
    wait_for(lambda: all(last_world(n.journal) == 3 for n in nodes), 300, "a world of 3")
    changed_at = time.time()
    victim.kill_tree() if scenario == "sigkill" else victim.process.terminate()
    try:
        wait_for(lambda: trained_after(survivor.journal, 2, changed_at), PATIENCE, "a step at world size 2")
    except TimeoutError:
        return never(survivor.journal, changed_at)
    return pause(survivor.journal, changed_at)


def measure_torchft(scenario: str, root: Path) -> Pause:
    """One disruption's pause seen by a survivor; a join is timed from the newcomer's imports done."""
    with _peer_processes("torchft") as (env, processes):
        port = free_port()
        env["TORCHFT_LIGHTHOUSE"] = f"http://127.0.0.1:{port}"
        (root / "lighthouse.py").write_text(LIGHTHOUSE_MAIN)
        lighthouse = [
            sys.executable,
            str(root / "lighthouse.py"),
            "--bind",
            f"127.0.0.1:{port}",
            *LIGHTHOUSE_FLAGS,
        ]
        processes.append(_spawn(lighthouse, root / "lighthouse.log", env))
        script = root / "replica.py"
        script.write_text(_REPLICA_SCRIPT.replace("STEP_SECONDS", str(STEP_SECONDS)))
        nodes: list[Node] = []

        def start_node() -> Node:
            name = f"torchft{len(nodes)}"
            journal, log = root / f"{name}.jsonl", root / f"{name}.log"
            store = {"REPLICA_ID": name, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            process = _spawn([sys.executable, str(script), str(journal)], log, {**env, **store})
            processes.append(process)
            nodes.append(Node(name, process, root, journal, log))
            return nodes[-1]

        if scenario != "join":
            return _disrupt(scenario, [start_node() for _ in range(3)], nodes[2], nodes[0])
        first = start_node()
        start_node()
        wait_for(lambda: all(last_world(n.journal) == 2 for n in nodes), 300, "a world of 2")
        newcomer = start_node()
        wait_for(lambda: newcomer.events("ready"), 300, "the newcomer's imports done")
        ready_at = float(newcomer.events("ready")[0]["time"])
        try:
            wait_for(lambda: trained_after(first.journal, 3, ready_at), PATIENCE, "a step at world size 3")
        except TimeoutError:
            return never(first.journal, ready_at)
        return pause(first.journal, ready_at)


def measure_dlrover(scenario: str, root: Path) -> Pause:
    """One disruption's pause seen by a survivor (a join is not timed: the agent logs no moment its
    imports are done, as stock torchrun's does not)."""
    if scenario == "join":
        raise SystemExit("DLRover's join is not timed: run --scenario join with --systems ebbflow torchft")
    with _peer_processes("dlrover") as (env, processes):
        port = free_port()
        master = [sys.executable, "-u", "-m", "dlrover.python.master.main", "--port", str(port)]
        master += ["--node_num", "3", "--job_name", "bench", "--platform", "local"]
        processes.append(_spawn(master, root / "master.log", env))
        wait_for(lambda: listening(port), 120, "DLRover's master")
        script = root / "stock.py"
        script.write_text(stock_script())
        nodes: list[Node] = []
        for index in range(3):
            name = f"dlrover{index}"
            journal, log = root / f"{name}.jsonl", root / f"{name}.log"
            agent_env = {**env, "DLROVER_MASTER_ADDR": f"127.0.0.1:{port}", "ELASTIC_JOB_NAME": "bench"}
            agent_env |= {
                "NODE_ID": str(index),
                "NODE_RANK": str(index),
                "NODE_NUM": "3",
                "NODE_TYPE": "worker",
            }
            command = [
                sys.executable,
                "-m",
                "dlrover.trainer.torch.main",
                "--nnodes",
                "2:3",
                "--nproc_per_node",
                "1",
            ]
            command += ["--max_restarts", "100", "--rdzv_conf", DLROVER_RDZV_CONF, str(script), str(journal)]
            process = _spawn(command, log, agent_env)
            processes.append(process)
            nodes.append(Node(name, process, root, journal, log))
        return _disrupt(scenario, nodes, nodes[2], nodes[0])
