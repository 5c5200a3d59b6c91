"""The integration tier may skip on a developer machine without tools, but never under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_integration_tier(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EBBFLOW_TOOLS_BIN": str(tmp_path / "no-tools")}
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/integration/test_control_plane.py::test_drain_cordons_and_evicts",
    ]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(("ci", "returncode", "summary"), [(True, 1, "1 error"), (False, 0, "1 skipped")])
def test_missing_tools_fail_in_ci_and_skip_elsewhere(
    tmp_path: Path, ci: bool, returncode: int, summary: str
) -> None:
    result = run_integration_tier(tmp_path, ci)
    assert result.returncode == returncode, result.stdout
    assert summary in result.stdout
    assert "run `make tools`" in result.stdout
