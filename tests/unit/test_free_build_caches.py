"""hack/free-build-caches.sh: removes only the project's build-only caches, only while the disk is
short, says what it removed, and fails with what to do when that is not enough."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "free-build-caches.sh"
CACHES = ("wheelhouse", "go/build", "go/mod")


def _run(cache: Path, needed_mb: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(needed_mb), "the test"],
        env={"PATH": "/usr/bin:/bin", "EBBFLOW_CACHE": str(cache), "HOME": str(cache)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    for name in CACHES:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        (folder / "blob").write_bytes(b"x" * 1024)
    module = tmp_path / "go" / "mod" / "example.com@v1"
    module.mkdir()
    (module / "go.mod").write_text("module example.com\n")
    for item in (module / "go.mod", module):
        item.chmod(0o555)  # Go's module cache is read-only
    return tmp_path


def test_with_room_enough_nothing_is_removed(cache: Path) -> None:
    result = _run(cache, 1)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert all((cache / name / "blob").exists() for name in CACHES)


def test_short_of_disk_every_build_cache_goes_and_the_error_says_what_to_do(cache: Path) -> None:
    result = _run(cache, 10**12)
    assert result.returncode == 1
    removed = result.stdout.splitlines()
    assert [line.split("removed ")[1].split(" (")[0] for line in removed] == [str(cache / n) for n in CACHES]
    assert all(line.startswith("made room for the test: removed") for line in removed)
    assert not any((cache / name).exists() for name in CACHES)
    assert "not enough disk for the test" in result.stderr and "go clean -cache -modcache" in result.stderr
