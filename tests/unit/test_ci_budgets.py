"""CI's time budget (.ci/budgets) is what README states, names steps that CI really times, and is
printed beside each step's time with the steps over budget marked (hack/ci-report.sh)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _budgets() -> dict[str, tuple[int, int]]:
    rows = {}
    for line in (REPO / ".ci" / "budgets").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            step, warm, cold = line.split("\t")
            rows[step] = (int(warm), int(cold))
    return rows


def _readme_budgets() -> dict[str, tuple[int, int]]:
    section = (REPO / "README.md").read_text().split("### CI's time budget", 1)[1]
    rows = {}
    for match in re.finditer(r"^\| `([^`]+)` \| ([\d,]+) \| ([\d,]+) \|", section, re.MULTILINE):
        rows[match[1]] = (int(match[2].replace(",", "")), int(match[3].replace(",", "")))
    return rows


def test_readme_states_the_budgets_ci_prints() -> None:
    assert _readme_budgets() == _budgets()


def test_every_budgeted_step_is_timed_by_ci() -> None:
    scripts = "".join(
        (REPO / path).read_text() for path in (".ci/run", "hack/ci-test.sh", "hack/ci-report.sh")
    )
    for step in _budgets():
        assert f"{step}: " in scripts or f'timed "{step}"' in scripts, f"no CI step writes {step!r}"


def test_the_whole_run_stays_far_from_ci_limit() -> None:
    budgets = _budgets()
    warm, cold = budgets.pop("whole CI run")
    assert warm <= 35 * 60 and cold <= 50 * 60
    assert all(step_warm <= warm and step_cold <= cold for step_warm, step_cold in budgets.values())


@pytest.mark.parametrize(("machine", "column"), [("warm", 0), ("cold", 1)])
def test_the_report_marks_a_step_over_its_budget(tmp_path: Path, machine: str, column: int) -> None:
    budgets = _budgets()
    install = budgets["make install (venv, Python deps)"][column]
    e2e = budgets["e2e tier"][column]
    timings = tmp_path / "timings"
    timings.write_text(
        f"make install (venv, Python deps): {install} s\n  e2e preparation, kind node image: 30 s\n"
        f"e2e tier: {e2e + 1} s\n"
    )
    report = subprocess.run(
        ["bash", str(REPO / "hack" / "ci-report.sh"), str(timings), machine],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert report[0].startswith(f"--- steps on this machine ({machine} machine")
    assert report[1].endswith(f"of {install:5d} s")
    assert report[2] == "  e2e preparation, kind node image: 30 s"
    assert report[3].endswith(f"of {e2e:5d} s  OVER")
