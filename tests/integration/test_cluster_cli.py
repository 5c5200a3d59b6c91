"""`ebbflow-cluster up/down` (what `make cluster-up/down` run): nodes listed by kubectl, nothing left behind.

It runs beside the session's control plane, which also shows that two clusters can run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ebbflow_devtools.controlplane import DEFAULT_TOOLS_BIN, ControlPlane


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def cluster(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ebbflow_devtools", "--workdir", str(workdir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def test_cluster_up_lists_gpu_nodes_and_down_leaves_nothing(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    workdir = tmp_path / "cluster"
    try:
        started = cluster(
            workdir, "up", "--nodes", "2", "--spot-nodes", "1", "--gpus", "2", "--replicas", "4"
        )
        assert started.returncode == 0, started.stderr
        assert f"export KUBECONFIG={workdir / 'kubeconfig'}" in started.stdout
        listed = subprocess.run(
            [
                str(DEFAULT_TOOLS_BIN / "kubectl"),
                "--kubeconfig",
                str(workdir / "kubeconfig"),
                "get",
                "nodes",
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        nodes = {n["metadata"]["name"]: n for n in json.loads(listed.stdout)["items"]}
        assert sorted(nodes) == ["gpu-node-0", "gpu-node-1", "spot-node-0"]
        assert {n["status"]["capacity"]["nvidia.com/gpu"] for n in nodes.values()} == {"8"}
        assert nodes["spot-node-0"]["metadata"]["labels"]["karpenter.sh/capacity-type"] == "spot"
        assert processes_mentioning(str(workdir)), "the cluster's processes should be running"
        assert cluster(workdir, "up").stdout.startswith("already running")
        assert control_plane.server not in (workdir / "kubeconfig").read_text(), "two clusters, two ports"
    finally:
        stopped = cluster(workdir, "down")
    assert stopped.returncode == 0, stopped.stderr
    assert processes_mentioning(str(workdir)) == []
    assert cluster(workdir, "status").returncode == 1
