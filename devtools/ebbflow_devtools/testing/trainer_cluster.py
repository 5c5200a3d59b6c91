"""A job on one machine: a rendezvous process and worker "pods" (launcher + its worker), all real processes.

Pod deletion is modelled faithfully: SIGTERM goes to the launcher only (a container's PID 1), SIGKILL
goes to the launcher and every descendant (the elastic agent starts workers in their own sessions,
so killing the launcher's process group alone would leave the worker running).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from ebbflow_api import contract
from ebbflow_trainer.launch import durable
from ebbflow_trainer.launch.world_switch import ENTERS_IN_PLACE_LOG

from ebbflow_devtools.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
DIGITS = str(REPO / "examples" / "digits" / "train.py")
# The digits example, held while a file exists (`held_digits.py` beside this module): the same bits.
HELD_DIGITS = str(Path(__file__).resolve().parent / "held_digits.py")
# The held digits trained sharded (sharding="fsdp"): start_held works with either.
SHARDED_DIGITS = str(Path(__file__).resolve().parent / "sharded_digits.py")
SHARDED_DIGITS_PER_STEP = f"{SHARDED_DIGITS}:build_per_step"
HELD_SCRIPTS = (HELD_DIGITS, SHARDED_DIGITS, SHARDED_DIGITS_PER_STEP)
# How long start_held holds training at most (its wait for the newcomers to be admitted).
HOLD_LIMIT_SECONDS = 240
# A held script's collective timeout: a worker that read its samples before the hold began waits in
# the step's all-reduce for its held peer as long as the hold lasts, which must not break the world.
HELD_COLLECTIVE_TIMEOUT = ["--collective-timeout", str(2 * HOLD_LIMIT_SECONDS)]
# The launcher command the zygote (`zygote.py` beside this module) forks instead of executing.
EBBFLOW_TRAIN = (sys.executable, "-m", "ebbflow_trainer")
# What torch elastic's agent logs when it stops its workers, here to admit a waiting node, and what
# ours logs when its running workers admit it in place instead.
AGENT_ADMITS = ("via signal SIGTERM", ENTERS_IN_PLACE_LOG)
# The GPU tier's tests carry `@pytest.mark.gpu` and this: they skip on a machine without CUDA.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def admissions(log: str) -> int:
    """How often a launcher's agent admitted a waiting node (stopped its workers, or switched them)."""
    return sum(log.count(line) for line in AGENT_ADMITS)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


@dataclass
class Node:
    name: str
    process: Process
    state_dir: Path
    journal: Path
    log: Path

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        records = [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]
        return [r for r in records if kind is None or r["event"] == kind]

    def last_step(self) -> dict[str, Any] | None:
        steps = self.events("step")
        return steps[-1] if steps else None

    def kill_tree(self) -> None:
        """What a pod deletion past its grace period does: SIGKILL to every process of the pod."""
        tree = [self.process.pid, *descendants(self.process.pid)]
        for pid in tree:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        for pid in tree[1:]:
            wait_for(functools.partial(_is_gone, pid), 30, f"pid {pid} to die")

    def freeze(self) -> None:
        """What a node that stops answering looks like (a hung machine, a partition): every process of
        the pod stopped (SIGSTOP). Its sockets stay open, so its liveness port still accepts."""
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def pause_launcher(self) -> None:
        """A launcher slow to notice anything (a loaded node): the launcher alone stopped (SIGSTOP),
        its workers training on; its liveness port still accepts."""
        self.process.send_signal(signal.SIGSTOP)

    def resume_launcher(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        """What a pod deletion does first: SIGTERM to the container's main process."""
        self.process.send_signal(signal.SIGTERM)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _is_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


class ZygoteProcess:
    """A process the zygote forked (`zygote.py` beside this module), with the part of
    `subprocess.Popen`'s interface the tier uses. Its exit status comes from the zygote, which reaps it."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            code = self._zygote.wait_exit(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            self.returncode = code
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# A trainer process of a test: forked by the zygote, or started as a new process.
Process = subprocess.Popen[bytes] | ZygoteProcess


def record_reply(reply: dict[str, int], forked: list[int], exits: dict[int, int]) -> None:
    """Note one line of the zygote's: a child forked (its pid, in order) or a child's exit status.
    A new child may get the pid of one that exited long before (pids wrap at 32768): the older exit
    is forgotten when the pid is handed out again, never reported for the new process. The zygote
    writes a child's pid before it can reap it, so its exit always comes after."""
    if "pid" in reply:
        exits.pop(reply["pid"], None)
        forked.append(reply["pid"])
    else:
        exits[reply["exited"]] = reply["code"]


class Zygote:
    """This test process's warm parent for `python -m ebbflow_trainer` (started on first use, gone
    with this process): `start` forks one and returns it."""

    _instance: Zygote | None = None

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "ebbflow_devtools.testing.zygote"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._requests, self._replies = self._process.stdin, self._process.stdout
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        ready = json.loads(self._replies.readline() or b"{}")
        assert "ready" in ready, "the zygote did not start (its imports failed?)"
        threading.Thread(target=self._read, name="zygote-replies", daemon=True).start()

    @classmethod
    def shared(cls) -> Zygote:
        if cls._instance is None or cls._instance._process.poll() is not None:
            cls._instance = cls()
        return cls._instance

    def _read(self) -> None:
        for line in self._replies:
            with self._changed:
                record_reply(json.loads(line), self._pids, self._exits)
                self._changed.notify_all()

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> ZygoteProcess:
        with self._lock:
            request = {"argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
            self._requests.write((json.dumps(request) + "\n").encode())
            self._requests.flush()
            with self._changed:
                assert self._changed.wait_for(lambda: self._pids, 60), "the zygote did not fork"
                return ZygoteProcess(self, self._pids.pop(0))

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)


@dataclass
class Job:
    root: Path
    virtual_nodes: int = 4
    global_batch_size: int = 32
    min_replicas: int = 1
    max_replicas: int = 4
    steps: int = 200
    mode: str = "deterministic"
    batching: str = "static"
    extra_args: list[str] = field(default_factory=list)
    script: str = DIGITS
    # The command before `run`: `ebbflow-train` (forked by the zygote) by default; a test may name
    # another (run as a new process) to look inside.
    launcher: tuple[str, ...] = EBBFLOW_TRAIN
    env: dict[str, str] = field(default_factory=dict)  # every node's environment beyond the job's
    nodes: list[Node] = field(default_factory=list)
    rdzv: Process | None = None
    port: int = 0
    # The job's rendezvous token: when set, the rendezvous process serves the operator's declarations
    # of deaths on `declarations_port` (see `declare_gone`).
    rendezvous_token: str = ""
    declarations_port: int = 0

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def hold_file(self) -> Path:
        return self.root / "hold"

    def start_rendezvous(self, port: int = 0) -> None:
        """Start the store process (``port`` 0: a free port) and wait until it serves."""
        port_file = self.root / "rdzv.port"
        port_file.unlink(missing_ok=True)
        arguments = ["rendezvous", "--host", "127.0.0.1"]
        arguments += [contract.RENDEZVOUS_PORT_FLAG, str(port), "--port-file", str(port_file)]
        env = dict(os.environ)
        if self.rendezvous_token:
            env |= {
                contract.ENV_RDZV_TOKEN: self.rendezvous_token,
                contract.ENV_DECLARATIONS_PORT: "0",
                contract.ENV_RDZV_ID: self.environment()[contract.ENV_RDZV_ID],
                contract.ENV_MIN_REPLICAS: str(self.min_replicas),
                contract.ENV_MAX_REPLICAS: str(self.max_replicas),
            }
        self.rdzv = Zygote.shared().start(arguments, env, self.root / "rdzv.log")

        def serving() -> str:
            assert self.rdzv is not None and self.rdzv.poll() is None, f"rendezvous exited:\n{self.logs()}"
            return port_file.read_text() if port_file.exists() else ""

        self.port = int(wait_for(serving, 120, "the rendezvous store"))
        if self.rendezvous_token:
            self.declarations_port = int(wait_for(self._declarations_port, 30, "the declarations endpoint"))

    def _declarations_port(self) -> str:
        found = re.search(r"declarations on port (\d+)", (self.root / "rdzv.log").read_text())
        return found[1] if found else ""

    def declare_gone(self, pods: dict[str, str], token: str | None = None) -> tuple[int, dict[str, Any]]:
        """POST a declaration of dead pods (pod -> evidence) as the operator does, with the job's token
        unless `token` is given; the HTTP status and the answer."""
        body = json.dumps({"pods": pods}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.declarations_port}{contract.DECLARATIONS_PATH}",
            data=body,
            headers={"Authorization": f"Bearer {self.rendezvous_token if token is None else token}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def kill_rendezvous(self) -> None:
        """What losing the rendezvous pod's node does to the store: its process dies (SIGKILL) and
        everything it held is gone."""
        assert self.rdzv is not None
        self.rdzv.kill()
        self.rdzv.wait(timeout=30)

    def restart_rendezvous(self) -> None:
        """What the operator's replacement pod behind the same Service gives: a new, empty store at
        the same address."""
        assert self.rdzv is not None and self.rdzv.poll() is not None, "kill the store first"
        self.start_rendezvous(port=self.port)

    def environment(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                contract.ENV_RDZV_ENDPOINT: f"127.0.0.1:{self.port}",
                contract.ENV_RDZV_ID: f"test-{self.root.name}",
                contract.ENV_MIN_REPLICAS: str(self.min_replicas),
                contract.ENV_MAX_REPLICAS: str(self.max_replicas),
                contract.ENV_VIRTUAL_NODES: str(self.virtual_nodes),
                contract.ENV_GLOBAL_BATCH_SIZE: str(self.global_batch_size),
                contract.ENV_BATCHING: self.batching,
                contract.ENV_CHECKPOINT_PATH: str(self.checkpoint_dir),
                contract.ENV_METRICS_PORT: "0",
                contract.ENV_LEAVE_GRACE_SECONDS: "30",
                "OMP_NUM_THREADS": "1",
                # Read by HELD_DIGITS only (start_held): training waits while this file exists.
                "DIGITS_HOLD": str(self.hold_file),
            }
        )
        env.update(self.env)
        env.update(overrides)
        return env

    def start_node(self, *args: str, env: dict[str, str] | None = None) -> Node:
        """A node training the job's TrainingSpec script (`ebbflow-train run`)."""
        state_dir, journal = self._node_dirs()
        command = [*self.launcher, "run", self.script, "--steps", str(self.steps)]
        command += ["--mode", self.mode, "--state-dir", str(state_dir), "--journal", str(journal)]
        # A longer last call than the default lets all nodes of a busy machine form the first world together.
        command += ["--last-call-timeout", "3"]
        command += HELD_COLLECTIVE_TIMEOUT if self.script in HELD_SCRIPTS else []
        command += [*self.extra_args, *args]  # after the defaults above: the last of a flag wins
        return self._start(command, state_dir, journal, env)

    def start_torchrun_node(self, *script_args: str, env: dict[str, str] | None = None) -> Node:
        """A node running the job's script as torchrun would (`ebbflow-train torchrun`); the node's
        journal is the script's to write, if it does (``{journal}`` in ``script_args`` names it)."""
        state_dir, journal = self._node_dirs()
        command = [*self.launcher, "torchrun", "--state-dir", str(state_dir), "--last-call-timeout", "3"]
        command += [*self.extra_args, self.script]
        command += [arg.replace("{journal}", str(journal)) for arg in script_args]
        return self._start(command, state_dir, journal, env)

    def _node_dirs(self) -> tuple[Path, Path]:
        state_dir = self.root / f"node{len(self.nodes)}"
        state_dir.mkdir(parents=True)
        return state_dir, state_dir / "journal.jsonl"

    def _start(self, command: list[str], state_dir: Path, journal: Path, env: dict[str, str] | None) -> Node:
        name = state_dir.name
        log_path = self.root / f"{name}.log"
        process: Process
        if self.launcher == EBBFLOW_TRAIN:
            log_path.write_bytes(b"")
            arguments = command[len(EBBFLOW_TRAIN) :]
            process = Zygote.shared().start(arguments, env or self.environment(), log_path)
        else:
            log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
            process = subprocess.Popen(
                command,
                env=env or self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node = Node(name, process, state_dir, journal, log_path)
        self.nodes.append(node)
        return node

    def start_held(self, count: int, running: tuple[Node, ...] = ()) -> list[Node]:
        """``count`` new nodes that join the ``running`` ones in one world before training goes on,
        however long their launchers take to start on a busy machine.

        Training is held (``HELD_DIGITS``, reading a sample waits) while they start, and released once
        every node trains in one world of them all, or once the agents of a smaller world asked their
        workers to stop at the next step boundary to admit the rest: within the leave grace (30 s)
        after which they would kill them. Without the hold, a short job could end first. A worker
        may wait out the hold inside a step's all-reduce: held scripts' nodes get a collective timeout
        longer than the hold (``HELD_COLLECTIVE_TIMEOUT``), so the hold never breaks a world."""
        assert self.script in HELD_SCRIPTS, f"start_held needs running_job(script=one of {HELD_SCRIPTS})"
        hold = self.hold_file
        hold.touch()
        stops_before = {n.name: admissions(n.log.read_text(errors="replace")) for n in running}
        new = [self.start_node() for _ in range(count)]
        everyone = [*running, *new]

        def stops(node: Node) -> int:
            return admissions(node.log.read_text(errors="replace")) - stops_before.get(node.name, 0)

        def admitted() -> bool:
            if all(any(g["world"] == len(everyone) for g in n.events("generation")) for n in everyone):
                return True
            in_a_world = [n for n in everyone if n.events("generation")]
            return bool(in_a_world) and all(stops(n) > 0 for n in in_a_world)

        try:
            waited_for = f"{len(everyone)} nodes in one world, or their agents admitting the rest"
            wait_for(admitted, HOLD_LIMIT_SECONDS, waited_for)
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.diagnose()}") from None
        finally:
            hold.unlink()
        return new

    def wait_all(self, nodes: list[Node], timeout: float) -> list[int]:
        """Exit codes of ``nodes``, all within one deadline."""
        deadline = time.monotonic() + timeout
        codes = []
        for node in nodes:
            try:
                codes.append(node.process.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{node.name} still running; log:\n{self.diagnose()}") from None
        return codes

    def wait_for_world(self, node: Node, size: int, min_step: int, timeout: float = 300) -> dict[str, Any]:
        """`node`'s latest step record once it trains in a world of `size` at `min_step` or later; on
        timeout, the error carries the job's diagnosis."""

        def reached() -> dict[str, Any] | None:
            last = node.last_step()
            return last if last and last["world"] == size and last["step"] >= min_step else None

        try:
            return wait_for(reached, timeout, f"{node.name} to train at world size {size}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.diagnose()}") from None

    def final_checkpoint(self) -> dict[str, Any]:
        """The job's newest durable checkpoint, whole (joined from its pieces when sharded)."""
        found = durable.newest_whole(self.checkpoint_dir)
        assert found is not None, f"no loadable checkpoint in {self.checkpoint_dir}"
        return found

    def world_sizes_by_step(self) -> dict[int, int]:
        """The world size each completed step was trained with (from every node's journal)."""
        sizes: dict[int, int] = {}
        for node in self.nodes:
            for record in node.events("step"):
                sizes[record["step"]] = record["world"]
        return sizes

    def dump_stacks(self) -> None:
        """Make every launcher and worker print its threads' stacks into its log (faulthandler, SIGUSR1)."""
        for node in self.nodes:
            for pid in [node.process.pid, *descendants(node.process.pid)]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)

    def diagnose(self) -> str:
        """Logs with every live process's stacks, for a scenario that did not finish in time."""
        self.dump_stacks()
        live = [n for n in self.nodes if n.process.poll() is None]
        with suppress(TimeoutError):
            wait_for(
                lambda: all("most recent call first" in n.log.read_text(errors="replace") for n in live),
                10,
                "every live process's stacks in its log",
            )
        return self.logs(tail=12000)

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def shutdown(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.kill_tree()
            else:
                for pid in descendants(node.process.pid):
                    os.kill(pid, signal.SIGKILL)
        if self.rdzv is not None and self.rdzv.poll() is None:
            self.rdzv.kill()
            self.rdzv.wait(timeout=30)


@contextmanager
def running_job(root: Path, **settings: Any) -> Iterator[Job]:
    job = Job(root=root, **settings)
    job.start_rendezvous()
    try:
        yield job
    finally:
        job.shutdown()


def parameters_of(saved: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in saved["model"].items() if tensor.is_floating_point()}


def assert_bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    pa, pb = parameters_of(a), parameters_of(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        same_bits = torch.equal(pa[name].view(torch.int32), pb[name].view(torch.int32))
        assert same_bits, f"{name} differs: max |diff| {(pa[name] - pb[name]).abs().max().item()}"


def train_on_one_gpu(
    root: Path, pods: int, mode: str = "deterministic", backend: str = "gloo", steps: int = 50
) -> dict[str, Any]:
    """The final checkpoint of ``pods`` single-process pods sharing the one GPU (each trains on cuda:0).

    gloo lets several ranks share a GPU (it reduces on the CPU); nccl needs a GPU per rank, so with
    nccl only one pod fits.
    """
    root.mkdir(parents=True, exist_ok=True)
    args = ["--backend", backend, "--mode", mode]
    with running_job(root, min_replicas=pods, max_replicas=pods, steps=steps, extra_args=args) as job:
        nodes = [job.start_node() for _ in range(pods)]
        assert job.wait_all(nodes, 240) == [0] * pods, job.logs()
        return job.final_checkpoint()
