"""Import layers: every module imports only what DEVELOPERS.md's layer table allows its folder (so the
operator's decision core and policies stay pure, nothing runs back up a layer, and no shipped
package imports the simulator or the dev tools); importing the API, the operator or the trainer's
CLI loads nothing heavy; and no package has an import cycle.

Runtime checks import in a fresh interpreter each (`sys.executable -c`), so modules that this test
process (or an earlier test) already imported cannot hide a heavy import. Static checks read the
source with `ast`, so they also see imports that only run inside functions.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {
    "ebbflow_api": REPO / "api" / "ebbflow_api",
    "ebbflow_operator": REPO / "operator" / "ebbflow_operator",
    "ebbflow_trainer": REPO / "trainer-image" / "ebbflow_trainer",
    "ebbflow_sim": REPO / "sim" / "ebbflow_sim",
    "ebbflow_devtools": REPO / "devtools" / "ebbflow_devtools",
}


def modules_of(package: str) -> dict[str, Path]:
    """Every module of `package` (subpackages included) by dotted name; a package by its own name."""
    root = PACKAGE_DIRS[package]
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


# --- runtime: what importing loads ---------------------------------------------------------------

PROBE = """
import importlib, json, sys
forbidden = sys.argv[2].split(",")
def loaded():
    return {m for m in sys.modules for f in forbidden if m == f or m.startswith(f + ".")}
blamed = {}
for name in sys.argv[1].split(","):
    before = loaded()
    importlib.import_module(name)
    new = sorted(loaded() - before)
    if new:
        blamed[name] = new[:5]
print(json.dumps(blamed))
"""


def newly_loaded(modules: Iterable[str], forbidden: Iterable[str]) -> dict[str, list[str]]:
    """In a fresh interpreter, import `modules` in order; which of them loaded which forbidden module."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(modules), ",".join(forbidden)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    blamed: dict[str, list[str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return blamed


API_MODULES = sorted(modules_of("ebbflow_api"))
OPERATOR_MODULES = sorted(modules_of("ebbflow_operator"))


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        pytest.param(["ebbflow_api"], ["torch", "kopf", "kubernetes"], id="api-package"),
        pytest.param(
            ["ebbflow_api.contract"], ["torch", "kopf", "kubernetes", "pydantic"], id="api-contract"
        ),
        pytest.param(["ebbflow_api.models"], ["torch", "kopf", "kubernetes"], id="api-models"),
        pytest.param(["ebbflow_api.crd"], ["torch", "kopf", "kubernetes"], id="api-crd"),
        pytest.param(["ebbflow_devtools.builders"], ["torch", "kopf", "kubernetes"], id="devtools-builders"),
        pytest.param(
            API_MODULES, ["torch", "kopf", "kubernetes", "ebbflow_operator", "ebbflow_trainer"], id="api-all"
        ),
        pytest.param(["ebbflow_operator"], ["torch", "ebbflow_trainer"], id="operator-package"),
        pytest.param(
            OPERATOR_MODULES,
            ["torch", "ebbflow_trainer", "ebbflow_sim", "ebbflow_devtools", "cryptography"],
            id="operator-all",
        ),
        pytest.param(
            ["ebbflow_trainer.config"], ["ebbflow_operator", "kopf", "kubernetes"], id="trainer-config"
        ),
        pytest.param(
            ["ebbflow_trainer.__main__"], ["ebbflow_operator", "kopf", "kubernetes"], id="trainer-main"
        ),
        # The package docstring promises a light import: the CLI parses its arguments before torch.
        pytest.param(
            ["ebbflow_trainer", "ebbflow_trainer.config", "ebbflow_trainer.__main__"],
            ["torch"],
            id="trainer-cli-no-torch",
        ),
    ],
)
def test_importing_loads_nothing_forbidden(modules: list[str], forbidden: list[str]) -> None:
    assert newly_loaded(modules, forbidden) == {}


def test_the_probe_sees_a_forbidden_import() -> None:
    """The probe is not vacuous: the operator's Kubernetes I/O module does load the client."""
    assert newly_loaded(
        ["ebbflow_operator.decision.model", "ebbflow_operator.kube"], ["kubernetes"]
    ).keys() == {"ebbflow_operator.kube"}


def test_all_listed_modules_are_covered() -> None:
    assert {"ebbflow_api", "ebbflow_api.models", "ebbflow_api.crd"} <= set(API_MODULES)
    assert {"ebbflow_api.contract", "ebbflow_api.rules"} <= set(API_MODULES)
    assert {"ebbflow_operator.__main__", "ebbflow_operator.handlers", "ebbflow_operator.reconciler"} <= set(
        OPERATOR_MODULES
    )


# --- static: the import graph --------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    target: str  # absolute dotted name of the module imported (see `resolve`)
    line: int
    lazy: bool  # inside a function body: runs when called, not when the module is imported


def resolve(name: str, known: Collection[str]) -> str:
    """`name` itself if it is a known module, else its longest known prefix, else `name` unchanged."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return name


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: Collection[str]) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.found: list[Import] = []
        self.depth = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, name: str, node: ast.stmt) -> None:
        self.found.append(Import(resolve(name, self.known), node.lineno, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        for alias in node.names:
            # `from package import name` imports the submodule package.name when there is one, else
            # a name defined in the package (resolve falls back to the package).
            self._add(f"{base}.{alias.name}", node)


def imports_in(module: str, path: Path, known: Collection[str]) -> list[Import]:
    collector = _Collector(module, path.name == "__init__.py", known)
    collector.visit(ast.parse(path.read_text(), str(path)))
    return collector.found


def import_graph(package: str, *, lazy: bool) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (function-level imports if `lazy`).

    Importing `package.sub` also runs `package/__init__.py`; that implicit edge is left out (every
    submodule would otherwise form a cycle with an `__init__` that imports it)."""
    modules = modules_of(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for found in imports_in(name, path, modules):
            if (lazy or not found.lazy) and found.target in modules and found.target != name:
                graph[name].add(found.target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with a cycle (more than one module, or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def simple_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle, each starting from its smallest module (the graphs are small)."""
    cycles: list[list[str]] = []
    for component in strongly_connected(graph):
        members = set(component)
        for start in component:

            def walk(path: list[str], start: str = start, members: set[str] = members) -> Iterator[list[str]]:
                for succ in sorted(graph[path[-1]] & members):
                    if succ == start:
                        yield [*path, start]
                    elif succ > start and succ not in path:
                        yield from walk([*path, succ])

            cycles.extend(walk([start]))
    return cycles


def describe(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("package", list(PACKAGE_DIRS))
def test_no_import_cycle_at_module_level(package: str) -> None:
    """Imports that run when the module is imported (module and class bodies, `if`/`try` blocks and
    `if TYPE_CHECKING:` included)."""
    cycles = simple_cycles(import_graph(package, lazy=False))
    assert cycles == [], f"import cycles in {package}: {describe(cycles)}"


@pytest.mark.parametrize("package", list(PACKAGE_DIRS))
def test_no_import_cycle_even_through_function_level_imports(package: str) -> None:
    """A lazy import inside a function hides a cycle from the interpreter, not from the design: two
    modules that need each other are one module, or need a third that both import."""
    cycles = simple_cycles(import_graph(package, lazy=True))
    assert cycles == [], f"import cycles in {package} (function-level imports included): {describe(cycles)}"


@pytest.mark.parametrize(
    ("graph", "cycles"),
    [
        pytest.param({"a": {"b"}, "b": {"c"}, "c": set()}, [], id="chain"),
        pytest.param({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]], id="two"),
        pytest.param({"a": {"a"}}, [["a", "a"]], id="self"),
        pytest.param(
            {"l": {"p", "w"}, "p": {"w"}, "w": {"l"}},
            [["l", "p", "w", "l"], ["l", "w", "l"]],
            id="launcher-preload-worker",
        ),
        pytest.param({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, [], id="diamond"),
    ],
)
def test_cycle_finder(graph: dict[str, set[str]], cycles: list[list[str]]) -> None:
    assert simple_cycles(graph) == cycles


def test_import_resolution() -> None:
    """Relative imports, `from package import submodule` and function-level imports resolve as Python does."""
    module_level = import_graph("ebbflow_operator", lazy=False)
    assert {
        "ebbflow_operator.decision.manifests",
        "ebbflow_operator.decision.status",
        "ebbflow_operator.decision.model",
    } <= module_level["ebbflow_operator.decision.planner"]
    assert "ebbflow_operator.handlers" in module_level["ebbflow_operator.__main__"]
    trainer = import_graph("ebbflow_trainer", lazy=False)
    worker = trainer["ebbflow_trainer.launch.worker"]
    assert {"ebbflow_trainer.metrics", "ebbflow_trainer.launch.state"} <= worker
    assert "ebbflow_trainer" not in worker
    assert "ebbflow_trainer.launch.rendezvous" not in trainer["ebbflow_trainer.__main__"]
    lazy = import_graph("ebbflow_trainer", lazy=True)
    assert "ebbflow_trainer.launch.rendezvous" in lazy["ebbflow_trainer.__main__"]


# --- static: each folder imports only what DEVELOPERS.md's layer table allows --------------------

DEVELOPERS = REPO / "DEVELOPERS.md"
LAYER_TABLE_HEADER = "| folder | layer | may import, besides the standard library and its own folder |"


def layer_table(text: str) -> dict[str, tuple[str, ...]]:
    """DEVELOPERS.md's layer table: package folder (dotted, e.g. `ebbflow_operator.decision`), or a
    module with a row of its own (an entry point), -> what it may import (project folders and
    third-party top-level modules)."""
    lines = text.splitlines()
    start = lines.index(LAYER_TABLE_HEADER) + 2  # past the header and its separator
    table: dict[str, tuple[str, ...]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        folder_cell, _, allowed_cell = (cell.strip() for cell in line.strip("|").split("|"))
        path = Path(folder_cell.strip("`").rstrip("/")).with_suffix("")
        for package, directory in PACKAGE_DIRS.items():
            base = directory.relative_to(REPO)
            if path == base or base in path.parents:
                folder = ".".join([package, *path.relative_to(base).parts])
                table[folder] = tuple(e.strip().strip("`") for e in allowed_cell.split(",") if e.strip())
                break
        else:
            raise AssertionError(f"DEVELOPERS.md's layer table names {path}, which is in no package")
    return table


LAYERS = layer_table(DEVELOPERS.read_text())
ALL_MODULES = {name: path for package in PACKAGE_DIRS for name, path in modules_of(package).items()}


def folder_of(module: str, path: Path) -> str:
    """The package folder a module lives in (a package's `__init__` belongs to its own folder)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


FOLDERS = {folder_of(name, path) for name, path in ALL_MODULES.items()}


def allowed(target: str, folder: str, rules: tuple[str, ...]) -> bool:
    """Whether a module in `folder` may import `target` (a resolved module or a third-party name): a
    project folder named in `rules` allows its own modules, not its subfolders'."""
    top = target.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    if not top.startswith("ebbflow_"):
        return top in rules
    target_folder = target if target in FOLDERS else target.rpartition(".")[0]
    return target_folder == folder or target_folder in rules


def violations(module: str, path: Path) -> list[str]:
    folder = folder_of(module, path)
    rules = LAYERS.get(module, LAYERS[folder])
    return sorted(
        f"{module} imports {found.target} (line {found.line})"
        for found in imports_in(module, path, ALL_MODULES)
        if not allowed(found.target, folder, rules)
    )


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_module_imports_only_what_its_folder_may(module: str) -> None:
    """Anywhere in the file, function bodies included: the decision core and the policies stay pure,
    nothing runs back up a layer, and no shipped package imports the simulator or the dev tools."""
    assert violations(module, ALL_MODULES[module]) == []


def test_every_package_folder_has_a_row() -> None:
    entry_points = set(LAYERS) - FOLDERS
    assert set(LAYERS) >= FOLDERS, "DEVELOPERS.md's layer table lacks a package folder"
    assert entry_points <= set(ALL_MODULES), "DEVELOPERS.md's layer table names a module that is not there"


def test_readme_layout_names_every_distribution() -> None:
    layout = (REPO / "README.md").read_text()
    missing = [d for d in PACKAGE_DIRS.values() if f"`{d.relative_to(REPO)}/`" not in layout]
    assert missing == []


DECISION = "ebbflow_operator.decision"


@pytest.mark.parametrize(
    ("folder", "source", "allowed_import"),
    [
        pytest.param("ebbflow_operator.decision", "import kopf\n", False, id="decision-uses-kopf"),
        pytest.param(DECISION, "from ..kube import KubeIO\n", False, id="decision-uses-the-shell"),
        pytest.param(DECISION, "from ..policies import x\n", False, id="decision-up-to-policies"),
        pytest.param(
            "ebbflow_operator.decision", "def f():\n    import kubernetes\n", False, id="in-a-function"
        ),
        pytest.param("ebbflow_operator.decision", "from .model import Job\n", True, id="own-folder"),
        pytest.param("ebbflow_operator.decision", "from ebbflow_api import contract\n", True, id="api"),
        pytest.param(
            "ebbflow_operator.policies", "from ..decision.model import Job\n", True, id="policies-down"
        ),
        pytest.param("ebbflow_operator", "from .policies import policy_named\n", True, id="shell-down"),
        pytest.param("ebbflow_operator", "import ebbflow_sim\n", False, id="shipped-uses-sim"),
        pytest.param("ebbflow_api", "import torch\n", False, id="api-uses-torch"),
        pytest.param("ebbflow_trainer.step", "from ..launch import worker\n", False, id="step-up-to-launch"),
        pytest.param(
            "ebbflow_trainer", "from .launch import launcher\n", False, id="trainer-base-up-to-launch"
        ),
    ],
)
def test_the_folder_rules_see_each_spelling(
    tmp_path: Path, folder: str, source: str, allowed_import: bool
) -> None:
    path = tmp_path / "fake.py"
    path.write_text(source)
    assert (violations(f"{folder}.fake", path) == []) == allowed_import
