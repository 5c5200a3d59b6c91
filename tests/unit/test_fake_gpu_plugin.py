"""Runs the fake GPU device plugin's Go tests (hack/fake-gpu-plugin) as part of the unit tier.

They cover its NVIDIA-shaped config, device IDs, Allocate, node labels, and a real gRPC
round trip with a fake kubelet over unix sockets. Go's build cache (its own, OWN_CACHE) makes
re-runs take seconds.
Without a Go toolchain the test skips on a developer machine, but fails under CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "hack" / "fake-gpu-plugin"
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
