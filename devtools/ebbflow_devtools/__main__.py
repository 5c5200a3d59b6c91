"""`ebbflow-cluster up|down|status`: the local control plane with fake GPU nodes, for people.

`up` starts a supervisor process in the background that owns the control plane (so the cluster
outlives the command), waits until the nodes are Ready, and prints how to use it. `down` stops the
supervisor, which stops every component; nothing is left running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ebbflow_devtools.controlplane import REPO_ROOT, ControlPlaneError, start_control_plane

DEFAULT_WORKDIR = REPO_ROOT / ".cluster"
READY_FILE = "ready"
PID_FILE = "supervisor.pid"
# What `up` leaves in the workdir besides logs; removed before a new cluster starts.
STATE = ("etcd", "pki", "kubeconfig", "tokens.csv", READY_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ebbflow-cluster", description=__doc__)
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="state folder (default: .cluster)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="start the control plane and fake GPU nodes in the background")
    up_parser.add_argument("--nodes", type=int, default=4, help="on-demand GPU nodes (default 4)")
    up_parser.add_argument("--spot-nodes", type=int, default=2, help="spot GPU nodes (default 2)")
    up_parser.add_argument("--gpus", type=int, default=2, help="physical GPUs per node (default 2)")
    up_parser.add_argument(
        "--replicas", type=int, default=2, help="time-slicing replicas per GPU (default 2)"
    )
    up_parser.add_argument("--foreground", action="store_true", help="run in this process until Ctrl-C")
    commands.add_parser("down", help="stop the cluster and every process it started")
    commands.add_parser("status", help="say whether the cluster runs")
    args = parser.parse_args(argv)
    workdir: Path = args.workdir.resolve()
    if args.command == "up":
        if args.foreground:
            return serve(workdir, args.nodes, args.spot_nodes, args.gpus, args.replicas)
        return up(workdir, sys.argv[1:] if argv is None else argv)
    if args.command == "down":
        return down(workdir)
    pid = _supervisor_pid(workdir)
    print(f"running (pid {pid}), kubeconfig {workdir / 'kubeconfig'}" if pid else "not running")
    return 0 if pid else 1


def up(workdir: Path, argv: list[str], timeout: float = 120.0) -> int:
    if _supervisor_pid(workdir):
        print(f"already running; export KUBECONFIG={workdir / 'kubeconfig'}")
        return 0
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "supervisor.log"
    with log_path.open("wb") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "ebbflow_devtools", *argv, "--foreground"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    try:
        while not (workdir / READY_FILE).exists():
            if supervisor.poll() is not None or time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.2)
    except BaseException as error:  # also Ctrl-C: a cluster nobody waited for must not stay behind
        supervisor.terminate()
        supervisor.wait(30)
        if not isinstance(error, TimeoutError):
            raise
        print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
        print(f"cluster did not start; full log in {log_path}", file=sys.stderr)
        return 1
    kubeconfig = workdir / "kubeconfig"
    print(f"Local control plane with fake GPU nodes is up (supervisor pid {supervisor.pid}).")
    print(f"  export KUBECONFIG={kubeconfig}")
    print(f"  kubectl --kubeconfig {kubeconfig} get nodes")
    print("  make cluster-down   # stops everything")
    return 0


def down(workdir: Path, timeout: float = 30.0) -> int:
    pid = _supervisor_pid(workdir)
    if pid is None:
        print("not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    print("stopped")
    return 0


def serve(workdir: Path, nodes: int, spot_nodes: int, gpus: int, replicas: int) -> int:
    """Runs the cluster in this process until SIGTERM or SIGINT; the children die with it."""
    from kubernetes import client, config

    from ebbflow_devtools.gpunodes import GpuNodeTemplate, create_gpu_nodes

    workdir.mkdir(parents=True, exist_ok=True)
    for name in STATE:
        path = workdir / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    started = time.monotonic()
    (workdir / PID_FILE).write_text(str(os.getpid()))  # first, so `down` finds a cluster still starting
    try:
        plane = start_control_plane(workdir=workdir)
    except ControlPlaneError as error:
        (workdir / PID_FILE).unlink(missing_ok=True)
        print(error, file=sys.stderr)
        return 1
    try:
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(plane.kubeconfig)))
        on_demand = GpuNodeTemplate(gpus=gpus, time_slicing_replicas=replicas)
        spot = GpuNodeTemplate(gpus=gpus, time_slicing_replicas=replicas, spot=True)
        create_gpu_nodes(core, nodes, on_demand, prefix="gpu-node")
        create_gpu_nodes(core, spot_nodes, spot, prefix="spot-node")
        print(f"ready in {time.monotonic() - started:.1f}s: {plane.server}", flush=True)
        (workdir / READY_FILE).write_text(plane.server)
        while not stop.wait(1.0):
            plane.check_alive()
    finally:
        plane.stop()
        for name in (READY_FILE, PID_FILE):
            (workdir / name).unlink(missing_ok=True)
    return 0


def _supervisor_pid(workdir: Path) -> int | None:
    try:
        pid = int((workdir / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers signal 0; treat it as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
