"""No function in the Python distributions or the benchmarks is longer than 80 lines.

A longer function is a design smell here: it should be split into named steps (see the planner).
Counted from the `def` line to the function's last line, decorators and docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("api", "operator", "trainer-image", "sim", "devtools", "bench")
LIMIT = 80


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (
            f"{path.relative_to(ROOT)}:{node.lineno} {node.name}",
            (node.end_lineno or node.lineno) - node.lineno + 1,
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


@pytest.mark.parametrize("folder", CHECKED)
def test_no_function_is_longer_than_the_limit(folder: str) -> None:
    sources = sorted((ROOT / folder).rglob("*.py"))
    assert sources, f"no Python files under {folder}/"
    too_long = [
        f"{where} ({lines} lines)" for path in sources for where, lines in _functions(path) if lines > LIMIT
    ]
    assert not too_long, f"split these into named steps (limit {LIMIT} lines): {too_long}"
