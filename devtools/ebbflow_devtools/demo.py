"""The main job, `make demo`: a real model trains on the kind cluster built on this machine while a
node is taken away and later comes back, and the demo prints the job's life as it happens.

1. Set up (cached after the first run): the kind cluster, the images, the fake GPU device plugin,
   the operator installed by `helm install` from charts/ebbflow, running in the cluster.
2. Submit examples/jobs/digits.yaml (3 workers of a whole 4-GPU node each; device time simulated
   per virtual node so that a CPU step lasts as long as a small GPU step).
3. Once it trains on 3 workers, take a node away as a spot preemption does (its pods are evicted
   with their grace period, then the Node goes); after it trained on 2 workers for a while, bring
   the node back (its kubelet registers again, the device plugin advertises its GPUs).
4. Print a progress line, every size change, and at the end a summary: the worlds the trainers
   formed (size, steps lost, pause), the total time and the final held-out accuracy.

The decisions (when to disturb, what to print) are pure, in `demo_plan`; this module does the I/O.
"""

from __future__ import annotations

import argparse
import ast
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from ebbflow_operator.decision.manifests import rendezvous_name

from ebbflow_devtools import demo_plan, trainer_logs
from ebbflow_devtools.demo_plan import Action, Plan, Snapshot, Stage
from ebbflow_devtools.kind import (
    DEMO_NAMESPACE,
    KUBECONFIG,
    PROMETHEUS_NAMESPACE,
    RELEASE_NAMESPACE,
    TOOLS,
    Kind,
    KindError,
    set_up,
)

NAMESPACE = DEMO_NAMESPACE
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "jobs" / "digits.yaml"
POLL_S = 1.0


@dataclass
class Report:
    """Where the demo writes: progress on one rewritten line on a terminal, events on their own."""

    out: TextIO = sys.stdout
    last_line_at: float = 0.0
    events: list[str] = field(default_factory=list)

    def event(self, text: str) -> None:
        self.events.append(text)
        self._clear()
        print(text, file=self.out, flush=True)

    def progress(self, line: str) -> None:
        if self.out.isatty():
            print(f"\r\033[K{line}", end="", file=self.out, flush=True)
        elif time.monotonic() - self.last_line_at >= 10:
            print(line, file=self.out, flush=True)
            self.last_line_at = time.monotonic()

    def _clear(self) -> None:
        if self.out.isatty():
            print("\r\033[K", end="", file=self.out, flush=True)


def target_accuracy() -> float:
    """TARGET_ACCURACY of examples/digits/train.py, read from its source (importing the script would
    load torch, which the operator's package never does)."""
    tree = ast.parse((EXAMPLES / "digits" / "train.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "TARGET_ACCURACY"
        ]:
            return float(ast.literal_eval(node.value))
    raise LookupError("examples/digits/train.py defines no TARGET_ACCURACY")


def job_manifest(steps: int, vnode_seconds: float) -> dict[str, Any]:
    """examples/jobs/digits.yaml with the demo's length and simulated device time."""
    job: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = [c for c in container["command"]]
    command[command.index("--steps") + 1] = str(steps)
    container["command"] = [*command, "--simulated-vnode-seconds", str(vnode_seconds)]
    job["metadata"]["namespace"] = NAMESPACE
    return job


@dataclass
class Demo:
    """Submits the job, watches it, and runs the plan's actions in the background."""

    kind: Kind
    report: Report
    steps: int
    job: dict[str, Any]
    history: list[Snapshot] = field(default_factory=list)
    taken: str = ""
    started: float = 0.0
    busy: threading.Thread | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    def submit(self) -> None:
        # A job of an earlier run goes first, with its pods (the namespace stays: the chart put the
        # trainers' ServiceAccount there).
        self.kind.kubectl(
            "-n", NAMESPACE, "delete", "elastictrainingjob", self.name, "--ignore-not-found", timeout=300
        )
        self.kind.kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--wait=true", timeout=300)
        self.kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(self.job))
        self.started = time.monotonic()
        self.report.event(f"submitted {self.name} ({self.steps} steps, 1-3 workers) to namespace {NAMESPACE}")

    def observe(self) -> Snapshot:
        job = self.kind.json("-n", NAMESPACE, "get", "elastictrainingjob", self.name)
        return Snapshot.of(job, time.monotonic() - self.started)

    def watch(self, timeout: float) -> Snapshot:
        """Poll until the job finishes, running the plan's actions; the last snapshot."""
        plan = Plan(steps=self.steps, full=int(self.job["spec"]["replicas"]["max"]))
        stage = Stage.FILLING
        now = since = self.observe()
        while not now.finished and now.at < timeout:
            time.sleep(POLL_S)
            now = self.observe()
            self._note_changes(now)
            next_stage, action = plan.next(stage, now, since)
            if next_stage is not stage:
                stage, since = next_stage, now
            if action is not Action.NONE:
                self._start(action, now)
            self.report.progress(demo_plan.progress_line(now, self.steps, plan.full))
        if self.busy is not None:
            self.busy.join()
        return now

    def _note_changes(self, now: Snapshot) -> None:
        previous = self.history[-1] if self.history else None
        self.history.append(now)
        if previous is None or (now.desired, now.phase) != (previous.desired, previous.phase):
            self.report.event(f"[{now.at:5.0f} s] job {now.phase}: {now.desired} worker(s), step {now.step}")

    def _start(self, action: Action, now: Snapshot) -> None:
        if action is Action.TAKE_NODE_AWAY:
            rendezvous = self.kind.json("-n", NAMESPACE, "get", "pod", rendezvous_name(self.name))
            self.taken = demo_plan.node_to_take(now.worker_nodes, rendezvous["spec"].get("nodeName", ""))
            work: Callable[[], None] = lambda: self.kind.take_node_away(self.taken)  # noqa: E731
        else:
            work = lambda: self.kind.bring_node_back(self.taken)  # noqa: E731
        self.report.event(f"[{now.at:5.0f} s] {action}: {self.taken} (at step {now.step})")
        self.busy = threading.Thread(target=self._run, args=(action, work), daemon=True)
        self.busy.start()

    def _run(self, action: Action, work: Callable[[], None]) -> None:
        try:
            work()
        except (KindError, TimeoutError) as error:
            self.failures.append(f"{action}: {error}")
            self.report.event(f"could not {action}: {error}")
            return
        self.report.event(f"[{time.monotonic() - self.started:5.0f} s] done: {action} ({self.taken})")

    def worlds(self) -> list[trainer_logs.World]:
        pods = self.kind.json("-n", NAMESPACE, "get", "pods", "-l", f"ebbflow.dev/job-name={self.name}")
        logs = []
        for pod in pods["items"]:
            try:
                logs.append(self.kind.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"]))
            except KindError:
                continue  # a pod without a log yet
        return trainer_logs.worlds(logs)


# Where to watch the job's metrics while it trains (and after): the cluster's Prometheus, which
# scrapes the operator and the trainers as the chart's monitors would.
METRICS_HINT = (
    "metrics: Prometheus scrapes the operator and the trainers; in another terminal:",
    "  KUBECONFIG={kubeconfig} {tools}/kubectl -n {namespace} port-forward svc/prometheus 9090"
    "  # then http://localhost:9090, e.g. ebbflow_trainer_samples_per_second",
)
_HINT_VALUES = {"kubeconfig": KUBECONFIG, "tools": TOOLS, "namespace": PROMETHEUS_NAMESPACE}


def summary(demo: Demo, last: Snapshot, total_s: float) -> list[str]:
    """The closing lines: outcome, the worlds as the trainers saw them, the final accuracy."""
    lines = [f"{demo.name}: {last.phase} after {last.at:.0f} s (demo {total_s:.0f} s in all)"]
    lines.append("worlds the trainers formed (rank 0's account; a pod on the lost node took its log along):")
    for world in demo.worlds():
        pause = f", first step {world.pause_seconds:.2f} s after the last one" if world.pause_seconds else ""
        lines.append(
            f"  generation {world.generation}: {world.size} worker(s) from step {world.step}"
            f" ({world.source}), {world.steps_lost} step(s) lost{pause}"
        )
    lines.append(f"preemptions recorded by the operator: {last.preemptions}")
    accuracy = "n/a" if last.accuracy is None else f"{last.accuracy:.3f}"
    lines.append(f"held-out accuracy: {accuracy} (target {target_accuracy()})")
    return lines


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    parser.add_argument(
        "--vnode-seconds", type=float, default=0.03, help="simulated device time per virtual node (0.03 s)"
    )
    parser.add_argument("--timeout", type=float, default=1200, help="give up after this many seconds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    report, begun, kind = Report(), time.monotonic(), Kind()
    report.event(
        "setting up: kind cluster, images, fake GPU device plugin, operator by helm (cached after once)"
    )
    set_up(kind, say=report.event)
    report.event(
        f"ready in {time.monotonic() - begun:.0f} s; the operator runs in namespace {RELEASE_NAMESPACE}"
    )
    for line in METRICS_HINT:
        report.event(line.format(**_HINT_VALUES))
    demo = Demo(kind, report, args.steps, job_manifest(args.steps, args.vnode_seconds))
    demo.submit()
    last = demo.watch(args.timeout)
    report.event("")
    for line in summary(demo, last, time.monotonic() - begun):
        report.event(line)
    report.event(f"the cluster stays up: export KUBECONFIG={KUBECONFIG}; make kind-down removes it")
    report.event(METRICS_HINT[1].format(**_HINT_VALUES))
    ok = last.phase == "Succeeded" and not demo.failures and (last.accuracy or 0) >= target_accuracy()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
