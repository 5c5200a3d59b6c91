"""Import layers: the API package stays free of torch, kopf and the Kubernetes client; the operator never
loads torch or the trainer; the trainer's entry points never load the operator; the operator's
decision modules and the simulator stay pure; no shipped package imports the simulator or the dev
tools; and no package has an import cycle.

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
# What the images ship (api/, operator/, trainer-image/); the simulator and the dev tools may import
# them, never the other way round.
SHIPPED = ("ebbflow_api", "ebbflow_operator", "ebbflow_trainer")
UNSHIPPED = ("ebbflow_sim", "ebbflow_devtools")


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
    assert newly_loaded(["ebbflow_operator.model", "ebbflow_operator.kube"], ["kubernetes"]).keys() == {
        "ebbflow_operator.kube"
    }


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
        "ebbflow_operator.manifests",
        "ebbflow_operator.status",
        "ebbflow_operator.model",
    } <= module_level["ebbflow_operator.planner"]
    assert "ebbflow_operator.handlers" in module_level["ebbflow_operator.__main__"]
    trainer = import_graph("ebbflow_trainer", lazy=False)
    assert {"ebbflow_trainer.metrics", "ebbflow_trainer.state"} <= trainer["ebbflow_trainer.worker"]
    assert "ebbflow_trainer" not in trainer["ebbflow_trainer.worker"]
    assert "ebbflow_trainer.rendezvous" not in trainer["ebbflow_trainer.__main__"]
    lazy = import_graph("ebbflow_trainer", lazy=True)
    assert "ebbflow_trainer.rendezvous" in lazy["ebbflow_trainer.__main__"]


# --- static: the decision modules are pure -------------------------------------------------------

DECISION_MODULES = [
    "allocator",
    "capacity",
    "gpu_memory",
    "planner",
    "status",
    "manifests",
    "model",
    "throughput",
    "loss_curve",
    "search",
    "policies",
    "history",
]
if (PACKAGE_DIRS["ebbflow_operator"] / "decide.py").exists():
    DECISION_MODULES.append("decide")
IMPURE = (
    "kubernetes",
    "kopf",
    "ebbflow_operator.kube",
    "ebbflow_operator.cache",
    "ebbflow_operator.reconciler",
    "ebbflow_operator.handlers",
)


def impure_imports(module: str, path: Path) -> list[str]:
    known = {**modules_of("ebbflow_operator"), **modules_of("ebbflow_sim")}
    return sorted(
        f"{found.target} (line {found.line})"
        for found in imports_in(module, path, known)
        if any(found.target == name or found.target.startswith(name + ".") for name in IMPURE)
    )


@pytest.mark.parametrize("module", [pytest.param(m, id=m) for m in DECISION_MODULES])
def test_decision_module_imports_no_io(module: str) -> None:
    """Anywhere in the file, function bodies included."""
    name = f"ebbflow_operator.{module}"
    assert impure_imports(name, modules_of("ebbflow_operator")[name]) == []


@pytest.mark.parametrize("module", sorted(modules_of("ebbflow_sim")))
def test_simulator_module_imports_no_io(module: str) -> None:
    """The simulator runs the operator's policies; it must never reach the Kubernetes I/O layer."""
    assert impure_imports(module, modules_of("ebbflow_sim")[module]) == []


@pytest.mark.parametrize("package", SHIPPED)
def test_shipped_packages_import_neither_simulator_nor_dev_tools(package: str) -> None:
    """Anywhere in the file: the images hold api/, operator/ and trainer-image/ only."""
    found = [
        f"{module} imports {entry.target} (line {entry.line})"
        for module, path in modules_of(package).items()
        for entry in imports_in(module, path, modules_of(package))
        if entry.target.split(".")[0] in UNSHIPPED
    ]
    assert found == []


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        pytest.param("kube", "kubernetes", id="kube-uses-the-client"),
        pytest.param("handlers", "kopf", id="handlers-use-kopf"),
        pytest.param("__main__", "ebbflow_operator.handlers", id="main-registers-handlers"),
    ],
)
def test_impure_imports_are_found(module: str, expected: str) -> None:
    """The check is not vacuous: the I/O layer's own modules do import these."""
    name = f"ebbflow_operator.{module}"
    assert any(
        entry.startswith(expected) for entry in impure_imports(name, modules_of("ebbflow_operator")[name])
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("from . import kube\n", "ebbflow_operator.kube", id="from-package-import-module"),
        pytest.param("from .cache import Store\n", "ebbflow_operator.cache", id="relative-from"),
        pytest.param(
            "from ebbflow_operator.reconciler import X\n", "ebbflow_operator.reconciler", id="absolute"
        ),
        pytest.param("import ebbflow_operator.handlers\n", "ebbflow_operator.handlers", id="import-module"),
        pytest.param("from kubernetes.client import V1Pod\n", "kubernetes", id="client-submodule"),
        pytest.param("def f() -> None:\n    import kopf\n", "kopf", id="inside-a-function"),
        pytest.param("if True:\n    from .kube import KubeIO\n", "ebbflow_operator.kube", id="inside-if"),
    ],
)
def test_impure_import_spellings_are_found(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "fake.py"
    path.write_text(source)
    [entry] = impure_imports("ebbflow_operator.fake", path)
    assert entry.startswith(expected)


def test_pure_imports_pass(tmp_path: Path) -> None:
    path = tmp_path / "fake.py"
    path.write_text("from . import manifests\nfrom .model import Job\nfrom ebbflow_api import contract\n")
    assert impure_imports("ebbflow_operator.fake", path) == []
