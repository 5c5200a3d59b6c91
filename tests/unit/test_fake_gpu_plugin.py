"""Runs the fake GPU device plugin's Go tests (hack/fake-gpu-plugin) as part of the unit tier.

They cover its NVIDIA-shaped config, device IDs, Allocate, node labels, and a real gRPC
round trip with a fake kubelet over unix sockets. Go's build cache makes re-runs take seconds.
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
TIMEOUT_S = 600  # a cold build compiles client-go; warm runs take seconds


def _go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    return str(FALLBACK_GO) if FALLBACK_GO.exists() else None


def test_fake_gpu_plugin_go_tests_pass() -> None:
    go = _go()
    if go is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no Go toolchain: the fake GPU plugin's tests cannot run in CI")
        pytest.skip("no Go toolchain on this machine")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}
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
