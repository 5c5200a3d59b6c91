"""Exit codes of many short launcher lifecycles: every normal or SIGTERM ending must exit 0.

Guards against the abort at exit (issue "the launcher sometimes aborts after a successful run"):
torch's rendezvous keep-alive thread, left running at interpreter exit, could be torn down inside a
store call and abort the launcher with 134 (SIGABRT, "terminate called without an active
exception") about once in 32 runs after training had finished.

Each lifecycle is a real job on this machine (the trainer tier's harness: launchers, elastic agents,
gloo workers training the digits example), ended one of four ways, cycled with world sizes 1-3:

- ``normal``: train ``--steps`` steps to the end; every launcher must exit 0.
- ``sigterm-one`` / ``sigterm-all``: once it trains, SIGTERM one node (a pod deletion) or
  all of them; the terminated ones must exit 0 and the others carry on to the end and exit 0.
- ``sigkill-one`` (world >= 2): kill one node's whole process tree; the survivors re-form and must
  exit 0. The killed launcher's -9 is recorded as "killed", not as a failure.

One rendezvous process serves every lifecycle (each has its own rendezvous id and directory), and
``--parallel`` lifecycles run at a time. A node is signalled as soon as it has completed a step; the
table counts how many signals landed mid-run and in a world of the full size (on a loaded machine a
node may train alone at first, or end before it is seen training: it then counts as a normal ending).
Any unexpected exit code keeps that lifecycle's directory under /tmp/exit_stress_failures/ and
prints the tail of each launcher's log ("terminate called" lines counted). Launchers run directly
under Popen, so an abort reads -6 here (134 in a shell).

    .venv/bin/python bench/exit_stress.py            # 200 lifecycles, 3 at a time, all scenarios
    .venv/bin/python bench/exit_stress.py --lifecycles 20 --scenarios normal --keep-alive-interval 0.005

``--keep-alive-interval`` is passed to the launchers (a tiny value widens the race window), with
``--keep-alive-max-attempt`` scaled so that a node is still declared dead after 3 s.
``--trainer-path DIR[:DIR]`` is prepended to the launchers' PYTHONPATH so that another copy of
``ebbflow_trainer`` runs (PYTHONPATH wins over the editable install; the copy imported is checked
and reported). A pre-fix copy, with the ``ebbflow_api`` it was written against, without touching
the working tree:

    mkdir -p /tmp/before && git archive e4620b7 trainer-image api | tar -x -C /tmp/before
    .venv/bin/python bench/exit_stress.py --trainer-path /tmp/before/trainer-image:/tmp/before/api

Prints a table and writes JSON to ``bench/results/exit_stress.json`` (``--output``); exits 1 unless
every launcher exited as expected.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ebbflow_devtools.testing.trainer_cluster import Job, Node, running_job
from ebbflow_devtools.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]


FAILURES = Path("/tmp/exit_stress_failures")
# How long any launcher may take to end once its ending is set in motion (normal runs last ~10 s).
PATIENCE = 180.0
# The code each role must exit with; anything else is kept and reported.
EXPECTED = {"normal": 0, "sigtermed": 0, "survived-sigterm": 0, "survived-sigkill": 0, "killed": -9}
# The lifecycles' jobs still running, for an interrupted run to shut them down.
LIVE: dict[int, Job] = {}
# The dead-node deadline (interval x attempts) stays the trainer's default whatever the interval.
HEARTBEAT_DEADLINE = 3.0


@dataclass(frozen=True)
class Scenario:
    name: str  # normal, sigterm-one, sigterm-all, sigkill-one
    world: int

    @property
    def ending(self) -> str:
        return self.name.split("-")[0]

    @property
    def label(self) -> str:
        return f"{self.name}-w{self.world}"


SCENARIOS = (
    *(Scenario("normal", world) for world in (1, 2, 3)),
    *(Scenario("sigterm-one", world) for world in (1, 2, 3)),
    *(Scenario("sigterm-all", world) for world in (2, 3)),
    *(Scenario("sigkill-one", world) for world in (2, 3)),
)


@dataclass
class Settings:
    steps: int
    signal_steps: int
    vnode_seconds: float
    keep_alive_interval: float | None
    trainer_path: str | None
    store_port: int
    work: Path
    failures: Path

    def launcher_args(self, scenario: Scenario) -> list[str]:
        args = ["--simulated-vnode-seconds", str(self.vnode_seconds)]
        # The harness waits 3 s for late joiners; every re-forming world (after a SIGTERM or SIGKILL)
        # would pay it. The trainer's default (1 s) still lets all nodes form the first world together.
        args += ["--last-call-timeout", "0.2" if scenario.world == 1 else "1"]
        if self.keep_alive_interval is not None:
            attempts = max(3, round(HEARTBEAT_DEADLINE / self.keep_alive_interval))
            args += ["--keep-alive-interval", str(self.keep_alive_interval)]
            args += ["--keep-alive-max-attempt", str(attempts)]
        return args

    def environment(self, job: Job) -> dict[str, str]:
        tmp = job.root / "tmp"  # torchelastic's log dirs and forkserver sockets go with the lifecycle
        tmp.mkdir(exist_ok=True)
        return job.environment(TMPDIR=str(tmp), **_pythonpath(self.trainer_path))


@dataclass
class Outcome:
    index: int
    scenario: Scenario
    codes: dict[str, list[int]] = field(default_factory=dict)
    signals: int = 0  # SIGTERMs / SIGKILLs sent
    signals_mid_run: int = 0  # of those, how many found the node still training
    signals_in_full_world: int = 0  # how many found the node training in a world of the full size
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    kept: str | None = None

    def unexpected(self) -> list[str]:
        found = [
            f"{role} exited {code}"
            for role, codes in self.codes.items()
            for code in codes
            if code != EXPECTED[role]
        ]
        return found + self.errors


def _pythonpath(trainer_path: str | None) -> dict[str, str]:
    if trainer_path is None:
        return {}
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": trainer_path + (os.pathsep + rest if rest else "")}


def trainer_identity(trainer_path: str | None) -> dict[str, Any]:
    """Which ``ebbflow_trainer`` and ``ebbflow_api`` the launchers import; whether it has the exit fix."""
    probe = (
        "import json, ebbflow_api, ebbflow_trainer, ebbflow_trainer.launch.rendezvous as r\n"
        "fixed = hasattr(r.GenerationRendezvousHandler, 'stop_heartbeats')\n"
        "print(json.dumps({'file': ebbflow_trainer.__file__, 'api_file': ebbflow_api.__file__,"
        " 'has_stop_heartbeats': fixed}))"
    )
    env = {**os.environ, **_pythonpath(trainer_path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    identity: dict[str, Any] = json.loads(out.stdout)
    if trainer_path is not None:
        wanted = [str(Path(part).resolve()) for part in trainer_path.split(os.pathsep)]
        for key in ("file", "api_file"):
            if not any(identity[key].startswith(part + os.sep) for part in wanted):
                raise SystemExit(f"--trainer-path {trainer_path} is not what is imported: {identity[key]}")
    return identity


def _signal_when_training(
    nodes: list[Node], send: Callable[[Node], None], world: int, outcome: Outcome
) -> list[Node]:
    """Send to each node as soon as it has completed a step; one that has already ended is skipped."""
    sent: list[Node] = []

    def handled() -> bool:
        for node in nodes:
            if node in sent or node.process.poll() is not None or (last := node.last_step()) is None:
                continue
            sent.append(node)
            outcome.signals_in_full_world += last["world"] == world
            send(node)
        return all(node in sent or node.process.poll() is not None for node in nodes)

    wait_for(handled, PATIENCE, f"{len(nodes)} node(s) to train or end")
    outcome.signals = len(sent)
    return sent


def _end_normally(job: Job, nodes: list[Node], index: int, outcome: Outcome) -> None:
    outcome.codes["normal"] = job.wait_all(nodes, PATIENCE)


def _end_by_sigterm(job: Job, nodes: list[Node], index: int, outcome: Outcome) -> None:
    everyone = outcome.scenario.name == "sigterm-all"
    planned = list(nodes) if everyone else [nodes[index // len(SCENARIOS) % len(nodes)]]
    leavers = _signal_when_training(planned, Node.terminate, len(nodes), outcome)
    outcome.codes["sigtermed"] = job.wait_all(leavers, PATIENCE)
    outcome.signals_mid_run = sum(1 for node in leavers if node.events("left"))
    others = [node for node in nodes if node not in leavers]
    outcome.codes["survived-sigterm" if leavers else "normal"] = job.wait_all(others, PATIENCE)


def _end_by_sigkill(job: Job, nodes: list[Node], index: int, outcome: Outcome) -> None:
    planned = [nodes[index // len(SCENARIOS) % len(nodes)]]
    killed = _signal_when_training(planned, Node.kill_tree, len(nodes), outcome)
    outcome.codes["killed"] = [node.process.wait() for node in killed]
    outcome.signals_mid_run = sum(1 for node in killed if not node.events("done"))
    others = [node for node in nodes if node not in killed]
    outcome.codes["survived-sigkill" if killed else "normal"] = job.wait_all(others, PATIENCE)


ENDINGS: dict[str, Callable[[Job, list[Node], int, Outcome], None]] = {
    "normal": _end_normally,
    "sigterm": _end_by_sigterm,
    "sigkill": _end_by_sigkill,
}


def run_lifecycle(index: int, scenario: Scenario, settings: Settings) -> Outcome:
    """Start ``scenario.world`` launchers on a fresh rendezvous id, end them, return their codes."""
    outcome = Outcome(index, scenario)
    root = settings.work / f"lc{index:04d}-{scenario.label}"
    root.mkdir()
    steps = settings.steps if scenario.ending == "normal" else settings.signal_steps
    job = Job(root=root, min_replicas=1, max_replicas=scenario.world, steps=steps)
    job.extra_args = settings.launcher_args(scenario)
    job.port = settings.store_port  # the shared rendezvous process; Job.shutdown leaves it alone
    start = time.monotonic()
    LIVE[id(job)] = job
    try:
        nodes = [job.start_node(env=settings.environment(job)) for _ in range(scenario.world)]
        ENDINGS[scenario.ending](job, nodes, index, outcome)
    except (AssertionError, TimeoutError) as error:
        outcome.errors.append(f"{type(error).__name__}: {str(error).splitlines()[0]}")
        exited = [f"{node.name}: {node.process.poll()}" for node in job.nodes]
        outcome.errors.append("exit codes then (None: still running): " + ", ".join(exited))
    finally:
        outcome.seconds = time.monotonic() - start
        job.shutdown()
        LIVE.pop(id(job), None)
    if outcome.unexpected():
        outcome.kept = str(settings.failures / root.name)
        shutil.copytree(root, outcome.kept, ignore=shutil.ignore_patterns("*.sock", "listener-*"))
    shutil.rmtree(root, ignore_errors=True)
    return outcome


def launcher_log_tails(kept: str, lines: int = 25) -> str:
    """The end of every launcher log of a kept lifecycle, and any "terminate called" line in it."""
    parts = []
    for log in sorted(Path(kept).glob("node*.log")):
        text = log.read_text(errors="replace").splitlines()
        aborts = [line for line in text if "terminate called" in line]
        parts.append(f"--- {log} ({len(aborts)} 'terminate called' lines)")
        parts.extend(text[-lines:])
    return "\n".join(parts)


def summarize(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Per (scenario, world size): lifecycles, codes counted per role, signals that landed mid-run."""
    rows: dict[Scenario, dict[str, Any]] = {}
    for outcome in sorted(outcomes, key=lambda o: SCENARIOS.index(o.scenario)):
        scenario = outcome.scenario
        row = rows.setdefault(
            scenario,
            {
                "scenario": scenario.name,
                "world": scenario.world,
                "ending": scenario.ending,
                "lifecycles": 0,
                "codes": {},
                "signals": 0,
                "signals_mid_run": 0,
                "signals_in_full_world": 0,
                "errors": 0,
                "seconds_mean": 0.0,
            },
        )
        row["lifecycles"] += 1
        row["signals"] += outcome.signals
        row["signals_mid_run"] += outcome.signals_mid_run
        row["signals_in_full_world"] += outcome.signals_in_full_world
        row["errors"] += len(outcome.errors)
        row["seconds_mean"] += (outcome.seconds - row["seconds_mean"]) / row["lifecycles"]
        for role, codes in outcome.codes.items():
            counter = Counter({int(k): v for k, v in row["codes"].get(role, {}).items()}) + Counter(codes)
            row["codes"][role] = {str(code): count for code, count in sorted(counter.items())}
    return list(rows.values())


def totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Exit codes counted per role over every scenario."""
    counted: dict[str, Counter[int]] = {role: Counter() for role in EXPECTED}
    for row in rows:
        for role, codes in row["codes"].items():
            counted[role].update({int(code): count for code, count in codes.items()})
    return {role: {str(c): n for c, n in sorted(counter.items())} for role, counter in counted.items()}


def print_table(rows: list[dict[str, Any]]) -> None:
    roles = list(EXPECTED)
    print(
        "| scenario | world | ending | lifecycles | "
        + " | ".join(roles)
        + " | signals: mid-run, in full world / sent | errors | mean s |"
    )
    print("|---" * (len(roles) + 7) + "|")
    for row in rows:
        cells = [
            ", ".join(f"{c}: {n}" for c, n in row["codes"].get(role, {}).items()) or "-" for role in roles
        ]
        sent = f"{row['signals_mid_run']}, {row['signals_in_full_world']} / {row['signals']}"
        signals = sent if row["signals"] else "-"
        head = f"| {row['scenario']} | {row['world']} | {row['ending']} | {row['lifecycles']} | "
        print(head + " | ".join(cells) + f" | {signals} | {row['errors']} | {row['seconds_mean']:.1f} |")


def _progress(done: int, total: int, outcome: Outcome, elapsed: float) -> None:
    codes = " ".join(f"{role}={codes}" for role, codes in outcome.codes.items() if codes)
    flag = "  UNEXPECTED: " + "; ".join(outcome.unexpected()) if outcome.unexpected() else ""
    line = f"[{done:4d}/{total}] {elapsed:7.1f} s  #{outcome.index:04d} {outcome.scenario.label:16s} "
    print(line + f"{codes} ({outcome.seconds:.1f} s){flag}", flush=True)
    if outcome.kept:
        print(f"  kept {outcome.kept}\n{launcher_log_tails(outcome.kept)}", flush=True)


def run_all(args: argparse.Namespace, work: Path) -> tuple[list[Outcome], float]:
    """Every lifecycle, ``args.parallel`` at a time, against one shared rendezvous process."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    outcomes: list[Outcome] = []
    start = time.monotonic()
    (work / "store").mkdir()
    with running_job(work / "store") as store:
        settings = Settings(
            steps=args.steps,
            signal_steps=args.signal_steps,
            vnode_seconds=args.simulated_vnode_seconds,
            keep_alive_interval=args.keep_alive_interval,
            trainer_path=args.trainer_path,
            store_port=store.port,
            work=work,
            failures=FAILURES / stamp,
        )
        chosen = [s for s in SCENARIOS if not args.scenarios or {s.name, s.label} & set(args.scenarios)]
        plan = [(index, chosen[index % len(chosen)]) for index in range(args.lifecycles)]
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            futures = [pool.submit(run_lifecycle, index, scenario, settings) for index, scenario in plan]
            try:
                for future in as_completed(futures):
                    outcomes.append(future.result())
                    _progress(len(outcomes), len(plan), outcomes[-1], time.monotonic() - start)
                    assert store.rdzv is not None and store.rdzv.poll() is None, "the rendezvous process died"
            except BaseException:  # Ctrl-C or SIGTERM: start no more lifecycles, end the running ones
                pool.shutdown(wait=False, cancel_futures=True)
                for job in list(LIVE.values()):
                    job.shutdown()
                raise
    return outcomes, time.monotonic() - start


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lifecycles", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=3, help="lifecycles at a time")
    parser.add_argument("--steps", type=int, default=8, help="steps of a normal ending")
    parser.add_argument("--signal-steps", type=int, default=24, help="steps of a SIGTERM/SIGKILL ending")
    parser.add_argument("--simulated-vnode-seconds", type=float, default=0.02)
    parser.add_argument(
        "--keep-alive-interval",
        type=float,
        help="passed to the launchers (default: the trainer's); the dead-node deadline stays "
        f"{HEARTBEAT_DEADLINE:g} s (--keep-alive-max-attempt scaled)",
    )
    parser.add_argument(
        "--trainer-path",
        help="prepended to the launchers' PYTHONPATH: DIR[:DIR...] holding another ebbflow_trainer "
        "(and the ebbflow_api it was written against, if the checkout's differs)",
    )
    parser.add_argument(
        "--scenarios",
        type=lambda text: text.split(","),
        default=[],
        help="only these, by name or label (e.g. normal or sigkill-one-w3; comma-separated; default all)",
    )
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "exit_stress.json")
    return parser


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    args = _parser().parse_args()
    signal.signal(signal.SIGTERM, _interrupted)  # so that every running job is shut down
    identity = trainer_identity(args.trainer_path)
    print(f"launchers import {identity['file']} and {identity['api_file']}", flush=True)
    print(f"GenerationRendezvousHandler.stop_heartbeats: {identity['has_stop_heartbeats']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="exit-stress-") as work:
        outcomes, total = run_all(args, Path(work))
    rows = summarize(outcomes)
    unexpected = [
        {"lifecycle": o.index, "scenario": o.scenario.label, "unexpected": o.unexpected(), "kept": o.kept}
        for o in sorted(outcomes, key=lambda o: o.index)
        if o.unexpected()
    ]
    ok = not unexpected
    by_role = totals(rows)
    launchers = sum(n for codes in by_role.values() for n in codes.values())
    aborts = sum(codes.get("-6", 0) for codes in by_role.values())
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "lifecycles": len(outcomes),
        "parallel": args.parallel,
        "steps": args.steps,
        "signal_steps": args.signal_steps,
        "simulated_vnode_seconds": args.simulated_vnode_seconds,
        "keep_alive_interval": args.keep_alive_interval,
        "trainer": identity,
        "total_s": round(total, 1),
        "scenarios": rows,
        "codes_by_role": by_role,
        "launchers": launchers,
        "sigabrt": aborts,
        "unexpected": unexpected,
        "every_normal_or_sigterm_ending_exited_0": ok,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print_table(rows)
    print(f"codes by role: {by_role}")
    print(f"{launchers} launchers; SIGABRT (-6 from Popen, 134 in a shell): {aborts}")
    print(f"{len(outcomes)} lifecycles in {total:.0f} s ({total / 60:.1f} min); JSON: {args.output}")
    for entry in unexpected:
        print(f"unexpected: lifecycle {entry['lifecycle']} ({entry['scenario']}): {entry['unexpected']}")
        print(f"  kept {entry['kept']}")
    print(f"every normal or SIGTERM ending exited 0: {'yes' if ok else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
