"""hack/kind/bin/docker (the shim kind finds first on PATH) execs the real docker, even when another
checkout's copy of the shim is on PATH too (the two used to exec each other forever)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SHIM = Path(__file__).resolve().parents[2] / "hack" / "kind" / "bin" / "docker"


@pytest.mark.parametrize(
    "copies", [pytest.param(1, id="one-shim"), pytest.param(2, id="two-checkouts-shims")]
)
def test_the_shim_runs_the_real_docker(tmp_path: Path, copies: int) -> None:
    shims = []
    for i in range(copies):
        folder = tmp_path / f"checkout-{i}"
        folder.mkdir()
        shutil.copy2(SHIM, folder / "docker")
        shims.append(str(folder))
    real = tmp_path / "real"
    real.mkdir()
    (real / "docker").write_text('#!/bin/sh\necho "real docker: $*"\n')
    (real / "docker").chmod(0o755)
    path = ":".join([*shims, str(real), "/usr/bin", "/bin"])
    result = subprocess.run(
        ["bash", f"{shims[0]}/docker", "version"],
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "real docker: version\n"
