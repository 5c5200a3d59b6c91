"""Runs the fake GPU device plugin's Go tests (hack/fake-gpu-plugin) as part of the unit tier.

They cover its NVIDIA-shaped config, device IDs, Allocate, node labels, and a real gRPC
round trip with a fake kubelet over unix sockets. Go's build cache (its own, OWN_CACHE) makes
re-runs take seconds.
Without a Go toolchain the test skips on a developer machine, but fails under CI=true. The plugin's
go.mod pins the Kubernetes graph's version of every module they share (checked here without Go), so
that its image build reuses the packages the tools' build compiled (hack/fake-gpu-plugin/build-image.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "hack" / "fake-gpu-plugin"
KUBE_GRAPH = REPO / "hack" / "tools" / "kubernetes"
FALLBACK_GO = Path("/usr/local/go/bin/go")
# A cold build compiles client-go and gRPC: 230 s in CI (its e2e preparation removes Go's caches
# after the unit tier), over 300 s on a fresh machine beside the image builds. Warm runs take seconds.
TIMEOUT_S = 600
OWN_CACHE = (
    Path(os.environ.get("EBBFLOW_CACHE", Path.home() / ".cache" / "ebbflow")) / "fake-gpu-plugin" / "go-test"
)


def _go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    return str(FALLBACK_GO) if FALLBACK_GO.exists() else None


@pytest.mark.timeout(TIMEOUT_S + 60)  # the tier's 300 s hang guard is shorter than a cold build
def test_fake_gpu_plugin_go_tests_pass() -> None:
    go = _go()
    if go is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no Go toolchain: the fake GPU plugin's tests cannot run in CI")
        pytest.skip("no Go toolchain on this machine")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}
    # Caches of its own, which CI's e2e preparation keeps when it removes Go's (`go clean -cache
    # -modcache`, for disk): a few hundred MB that save a cold build on the next run.
    env |= {"GOCACHE": str(OWN_CACHE / "build"), "GOMODCACHE": str(OWN_CACHE / "mod")}
    result = subprocess.run(
        [go, "test", "-count=1", "./..."],
        cwd=PLUGIN,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"go test ./... failed in {PLUGIN}:\n{result.stdout}\n{result.stderr}"


def required_versions(go_mod: Path) -> dict[str, str]:
    """Module path -> version of every `require` in a go.mod (one-line and block forms)."""
    versions: dict[str, str] = {}
    in_block = False
    for raw in go_mod.read_text().splitlines():
        line = raw.split("//")[0].strip()
        if line == "require (":
            in_block = True
        elif in_block and line == ")":
            in_block = False
        elif in_block and line:
            module, version = line.split()[:2]
            versions[module] = version
        elif line.startswith("require ") and not line.endswith("("):
            module, version = line.split()[1:3]
            versions[module] = version
    return versions


def test_the_plugin_pins_the_kubernetes_graphs_versions_of_every_shared_module() -> None:
    plugin, graph = required_versions(PLUGIN / "go.mod"), required_versions(KUBE_GRAPH / "go.mod")
    assert "k8s.io/client-go" in plugin and "k8s.io/client-go" in graph
    differing = {m: (v, graph[m]) for m, v in plugin.items() if m in graph and graph[m] != v}
    assert not differing, (
        f"hack/fake-gpu-plugin/go.mod pins other versions than hack/tools/kubernetes/go.mod: {differing} "
        "(plugin, graph); `go get` the graph's versions in hack/fake-gpu-plugin, then `go mod tidy`"
    )
