"""Sizes: no function in the Python distributions or the benchmarks over 80 lines, no module of a
distribution over 600 lines, no module docstring there over 15 lines, no sys.path edits in bench/ or e2e/.

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


DISTRIBUTIONS = ("api", "operator", "trainer-image", "sim", "devtools")
MODULE_LIMIT = 600
DOCSTRING_LIMIT = 15


def _modules() -> list[Path]:
    return [
        p for folder in DISTRIBUTIONS for p in sorted((ROOT / folder).rglob("*.py")) if ".egg" not in str(p)
    ]


def test_no_module_is_longer_than_the_limit() -> None:
    too_long = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LIMIT
    ]
    assert not too_long, f"split these by role (limit {MODULE_LIMIT} lines): {too_long}"


def test_module_docstrings_state_role_and_invariants_briefly() -> None:
    """Histories and measurements belong in docs/ and bench/README.md, linked in one line."""
    long_docs = []
    for path in _modules():
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if (lines := len(docstring.strip("\n").splitlines())) > DOCSTRING_LIMIT:
            long_docs.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not long_docs, f"module docstrings over {DOCSTRING_LIMIT} lines: {long_docs}"


@pytest.mark.parametrize("folder", ["bench", "e2e"])
def test_no_sys_path_edits(folder: str) -> None:
    """Test support is a package (ebbflow_devtools): nothing reaches into tests/ by path."""
    edits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "sys.path." in line
    ]
    assert edits == []
