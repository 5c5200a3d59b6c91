"""Every spec default and cross-field rule is written once (in api/ebbflow_api/models.py), and the
trainer, the CRD and the Python rule evaluator all use that one spelling.

How the source scan works. It reads every .py file under api/, operator/, trainer-image/ and bench/
(tests/ may spell values out: they are the hand-checked expectations) and looks for each fact with
a pattern that matches its one definition site *and* the obvious ways of writing it again:

- the checkpoint path default: any string literal that starts with the default path (`"/checkpoints"`,
  `Path("/checkpoints")`, `"/checkpoints/ckpt.pt"`); prose in docstrings has no quote in front;
- the join timeout default (600): a bare number is far too common to grep (the benchmark waits 600 s
  for its cluster), so it is found with `ast` in *default positions* only: the first argument or
  `default=` of `Field(...)`/`field(...)`, any `default=` keyword (argparse), a parameter default,
  a module- or class-level assignment (constants, dataclass fields, `timedelta(seconds=600)` there),
  the fallback argument of `.get`/`getattr`/`.setdefault`/`_env_*` helpers, and the right side of
  `or` / the else of a conditional expression; as int, float or string;
- "B is a multiple of V": `globalBatchSize %` (the CEL rule) or a Python `global_batch_size %` /
  `% ...virtual_nodes`;
- "V >= max": `virtualNodes >= self.replicas.max` (the CEL rule) or a Python comparison of
  virtual_nodes with max_replicas / replicas.max in either direction;
- "V defaults to max": the CEL ternary `has(self.virtualNodes) ? ...` that `VIRTUAL_NODES_OR_MAX`
  holds, or a Python `virtual_nodes or ...max` / `.get("virtualNodes", ...max)` / `virtual_nodes if
  ... else ...max`; and the constant `VIRTUAL_NODES_OR_MAX` itself is assigned once.

A match counts once per line. Each fact must match exactly one line, in api/ebbflow_api/models.py.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract, crd
from ebbflow_api.models import (
    Checkpoint,
    ElasticTrainingJob,
    ElasticTrainingJobSpec,
    RendezvousSpec,
    Replicas,
    TrainingShape,
    rule_violations,
)
from ebbflow_api.rules import Rule, violations
from ebbflow_devtools.builders import JobBuilder
from ebbflow_devtools.testing.trainer_config import VALID_ENVIRONMENT
from ebbflow_trainer.config import ConfigError, from_environment

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("api", "operator", "trainer-image", "sim", "devtools", "bench")
MODELS = "api/ebbflow_api/models.py"
SKIPPED_PARTS = {".venv", "build", "dist", "__pycache__"}

JOIN_TIMEOUT_DEFAULT = RendezvousSpec.model_fields["join_timeout_seconds"].default
CHECKPOINT_PATH_DEFAULT = Checkpoint.model_fields["path"].default

_V = r"(?:virtualNodes|virtual_nodes)"
_MAX = r"(?:replicas\.max|max_replicas)"
PATTERNS = {
    "checkpoint-path": rf"""["']{re.escape(CHECKPOINT_PATH_DEFAULT)}(?:/[^"']*)?["']""",
    "batch-multiple-of-virtual-nodes": (
        r"(?:globalBatchSize|global_batch_size)\s*%"
        r"|%\s*[{(]?\s*[\w.]*(?:virtualNodes|virtual_nodes|VIRTUAL_NODES_OR_MAX)"
    ),
    # V >= max itself; V >= max x the GPUs per worker is a rule of its own.
    "virtual-nodes-at-least-max": rf"{_V}\s*(?:>=|<)\s*[\w.]*{_MAX}(?!\s*\*)|{_MAX}\s*(?:<=|>)\s*[\w.]*{_V}",
    "virtual-nodes-default-to-max": (
        rf"has\(\s*self\.virtualNodes\s*\)\s*\?"
        rf"|{_V}['\"]?\)?\s+or\s+[\w.\[\]'\"]*(?:{_MAX}|\bmax\b)"
        rf"|\.get\(\s*['\"]virtualNodes['\"]\s*,\s*[\w.\[\]'\"]*max"
        rf"|{_V}\s+if\s+[^\n]*\belse\s+[\w.\[\]'\"]*{_MAX}"
    ),
    "virtual-nodes-or-max-constant": r"\bVIRTUAL_NODES_OR_MAX\s*(?::[^=\n]*)?=(?!=)",
}


def source_files() -> Iterator[Path]:
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            relative = path.relative_to(REPO)
            skipped = SKIPPED_PARTS & set(relative.parts) or any(
                p.endswith(".egg-info") for p in relative.parts
            )
            if not skipped:
                yield path


def grep(pattern: str) -> list[tuple[str, int, str]]:
    """(file, line number, line) of every line `pattern` matches, once per line."""
    found: dict[tuple[str, int], str] = {}
    compiled = re.compile(pattern)
    for path in source_files():
        text = path.read_text()
        lines = text.splitlines()
        for match in compiled.finditer(text):
            number = text.count("\n", 0, match.start()) + 1
            found[(str(path.relative_to(REPO)), number)] = lines[number - 1].strip()
    return [(file, number, line) for (file, number), line in sorted(found.items())]


def test_the_scan_sees_the_whole_tree() -> None:
    files = {str(p.relative_to(REPO)) for p in source_files()}
    assert MODELS in files
    assert "trainer-image/ebbflow_trainer/config.py" in files
    assert "operator/ebbflow_operator/decision/manifests.py" in files
    assert any(f.startswith("bench/") for f in files)


@pytest.mark.parametrize("fact", [pytest.param(fact, id=fact) for fact in PATTERNS])
def test_written_once(fact: str) -> None:
    found = grep(PATTERNS[fact])
    assert len(found) == 1 and found[0][0] == MODELS, f"{fact} must be written once, in {MODELS}: {found}"


@pytest.mark.parametrize(
    ("line", "fact"),
    [
        pytest.param('root = Path("/checkpoints")', "checkpoint-path", id="checkpoint-path-literal"),
        pytest.param("path = '/checkpoints/ckpt.pt'", "checkpoint-path", id="checkpoint-file-literal"),
        pytest.param(
            "if config.global_batch_size % config.virtual_nodes:",
            "batch-multiple-of-virtual-nodes",
            id="b-mod-v",
        ),
        pytest.param("remainder = b % spec.virtual_nodes", "batch-multiple-of-virtual-nodes", id="mod-v"),
        pytest.param(
            "if config.virtual_nodes < config.max_replicas:", "virtual-nodes-at-least-max", id="v-lt-max"
        ),
        pytest.param(
            "ok = spec.replicas.max <= spec.virtual_nodes", "virtual-nodes-at-least-max", id="max-le-v"
        ),
        pytest.param(
            "v = spec.virtual_nodes or spec.replicas.max", "virtual-nodes-default-to-max", id="v-or-max"
        ),
        pytest.param(
            "v = spec.get('virtualNodes', spec['replicas']['max'])",
            "virtual-nodes-default-to-max",
            id="get-v-max",
        ),
        pytest.param(
            "v = s.virtual_nodes if s.virtual_nodes is not None else s.replicas.max",
            "virtual-nodes-default-to-max",
            id="v-if-else-max",
        ),
        pytest.param(
            'OR_MAX = "(has(self.virtualNodes) ? self.virtualNodes : self.replicas.max)"',
            "virtual-nodes-default-to-max",
            id="cel-ternary-again",
        ),
        pytest.param("VIRTUAL_NODES_OR_MAX: str = 'x'", "virtual-nodes-or-max-constant", id="constant-again"),
    ],
)
def test_patterns_catch_a_respelling(line: str, fact: str) -> None:
    """The patterns are not vacuous: a second spelling of each fact would be found."""
    assert re.search(PATTERNS[fact], line)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('help="checkpoint every N steps"', id="prose"),
        pytest.param("if self.step % interval == 0:", id="other-modulo"),
        pytest.param(
            "max=job.spec.replicas.max if cap is None else min(cap, job.spec.replicas.max)", id="cap"
        ),
        pytest.param("virtual_nodes=config.virtual_nodes,", id="keyword-pass-through"),
        pytest.param("self.virtualNodes >= self.replicas.max * gpus", id="v-per-gpu-is-another-rule"),
    ],
)
def test_patterns_leave_other_code_alone(line: str) -> None:
    assert not any(re.search(pattern, line) for pattern in PATTERNS.values())


# --- the join timeout default, by AST ------------------------------------------------------------

FALLBACK_CALLS = {"get", "getenv", "getattr", "setdefault", "pop"}


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def default_positions(tree: ast.Module) -> Iterator[ast.expr]:
    """Expressions that hold a default value (see the module docstring)."""
    for statement in tree.body:
        yield from _assigned(statement)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                yield from _assigned(statement)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from node.args.defaults
            yield from (d for d in node.args.kw_defaults if d is not None)
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            yield from (k.value for k in node.keywords if k.arg == "default")
            if name in ("Field", "field") and node.args:
                yield node.args[0]
            if (name in FALLBACK_CALLS or name.startswith(("_env", "env_"))) and len(node.args) >= 2:
                yield node.args[-1]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            yield from node.values[1:]
        elif isinstance(node, ast.IfExp):
            yield node.orelse


def _assigned(statement: ast.stmt) -> Iterator[ast.expr]:
    if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
        yield statement.value


def constants_in(expression: ast.expr) -> Iterator[ast.Constant]:
    for node in ast.walk(expression):
        if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
            yield node


def find_default(value: int) -> list[tuple[str, int]]:
    """(file, line) of every default-position constant equal to `value` (int, float or string)."""
    found: set[tuple[str, int]] = set()
    for path in source_files():
        tree = ast.parse(path.read_text(), str(path))
        for expression in default_positions(tree):
            for constant in constants_in(expression):
                if constant.value in (value, float(value), str(value)):
                    found.add((str(path.relative_to(REPO)), constant.lineno))
    return sorted(found)


def test_join_timeout_default_written_once() -> None:
    assert JOIN_TIMEOUT_DEFAULT == 600
    found = find_default(JOIN_TIMEOUT_DEFAULT)
    assert len(found) == 1 and found[0][0] == MODELS, f"the join timeout default is re-spelled: {found}"
    [(_, line)] = found
    source = (REPO / MODELS).read_text().splitlines()
    assert any("join_timeout_seconds" in text for text in source[line - 3 : line])


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("DEFAULT_JOIN_TIMEOUT = 600", id="module-constant"),
        pytest.param("class C:\n    join_timeout: float = 600.0", id="dataclass-field"),
        pytest.param("def f(timeout=600): pass", id="parameter-default"),
        pytest.param("x = Field(600, ge=10)", id="field"),
        pytest.param("p.add_argument('--join-timeout', default=600)", id="argparse-default"),
        pytest.param(
            "def f(env):\n    return env.get('EBBFLOW_RDZV_JOIN_TIMEOUT_SECONDS', '600')", id="env-get"
        ),
        pytest.param("def f(env):\n    return _env_int(env, 'X', 600)", id="env-helper"),
        pytest.param("def f(t):\n    return t or 600", id="or-fallback"),
        pytest.param("JOIN = timedelta(seconds=600)", id="wrapped-constant"),
    ],
)
def test_default_positions_catch_a_respelling(code: str) -> None:
    tree = ast.parse(code)
    assert any(c.value in (600, "600") for e in default_positions(tree) for c in constants_in(e))


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("wait_for(lambda: ready(), 600, 'cluster')", id="call-argument"),
        pytest.param("def f():\n    time.sleep(600)", id="sleep"),
        pytest.param("def f(x):\n    return x > 600", id="comparison"),
    ],
)
def test_default_positions_leave_other_numbers_alone(code: str) -> None:
    tree = ast.parse(code)
    assert not any(c.value == 600 for e in default_positions(tree) for c in constants_in(e))


# --- the trainer and the CRD carry the same messages -------------------------------------------

SHAPE_RULES = {rule.field_path: rule for rule in TrainingShape.cel_rules}
TRAINER_ENV = VALID_ENVIRONMENT


def crd_messages() -> list[str]:
    [version] = crd.crd_manifest()["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return [entry["message"] for entry in spec["x-kubernetes-validations"]]


@pytest.mark.parametrize(
    ("overrides", "field_path", "named"),
    [
        pytest.param(
            {contract.ENV_VIRTUAL_NODES: "6"},
            ".globalBatchSize",
            {contract.ENV_VIRTUAL_NODES, contract.ENV_GLOBAL_BATCH_SIZE},
            id="v-does-not-divide-b",
        ),
        pytest.param(
            {contract.ENV_VIRTUAL_NODES: "8", contract.ENV_GLOBAL_BATCH_SIZE: "100"},
            ".globalBatchSize",
            {contract.ENV_GLOBAL_BATCH_SIZE},
            id="b-not-a-multiple",
        ),
        pytest.param(
            {contract.ENV_VIRTUAL_NODES: "2"},
            ".virtualNodes",
            {contract.ENV_VIRTUAL_NODES, contract.ENV_MAX_REPLICAS},
            id="v-below-max",
        ),
        pytest.param(
            {contract.ENV_VIRTUAL_NODES: "3"},
            ".virtualNodes",
            {contract.ENV_VIRTUAL_NODES, contract.ENV_MAX_REPLICAS},
            id="v-below-max-and-not-dividing-reports-the-first-rule",
        ),
        pytest.param(
            {
                contract.ENV_VIRTUAL_NODES: "1",
                contract.ENV_MAX_REPLICAS: "1",
                contract.ENV_LR_SCALING: "adascale",
            },
            ".lrScaling",
            {contract.ENV_LR_SCALING},
            id="adascale-needs-two",
        ),
    ],
)
def test_trainer_rejects_with_the_crd_message(
    overrides: dict[str, str], field_path: str, named: set[str]
) -> None:
    rule = SHAPE_RULES[field_path]
    assert rule.message in crd_messages()  # the API server says exactly this
    with pytest.raises(ConfigError) as error:
        from_environment({**TRAINER_ENV, **overrides}, spec="train.py", state_dir="/tmp/ebbflow-test")
    text = str(error.value)
    assert text.endswith(f": {rule.message}"), text  # and so does the trainer, word for word
    assert all(name in text for name in named), text


def test_trainer_accepts_what_the_rules_accept() -> None:
    config = from_environment(TRAINER_ENV, spec="train.py", state_dir="/tmp/ebbflow-test")
    assert (config.virtual_nodes, config.global_batch_size, config.max_replicas) == (8, 64, 4)
    assert config.join_timeout == float(JOIN_TIMEOUT_DEFAULT)


# --- rules.violations against hand-checked manifests ---------------------------------------------


@pytest.mark.parametrize(
    ("builder", "broken"),
    [
        pytest.param(JobBuilder("j").replicas(1, 4), [], id="v-unset-b-256-max-4"),
        pytest.param(JobBuilder("j").replicas(1, 4).virtual_nodes(8).global_batch_size(64), [], id="v8-b64"),
        pytest.param(
            JobBuilder("j").replicas(1, 4).virtual_nodes(4).global_batch_size(4), [], id="v-equals-b"
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).virtual_nodes(2).global_batch_size(64),
            [".virtualNodes"],
            id="v2-max4",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).virtual_nodes(6).global_batch_size(64),
            [".globalBatchSize"],
            id="64-mod-6",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).global_batch_size(66), [".globalBatchSize"], id="66-mod-max-4"
        ),
        pytest.param(JobBuilder("j").replicas(1, 3).global_batch_size(66), [], id="66-mod-max-3"),
        pytest.param(
            JobBuilder("j").replicas(1, 3).virtual_nodes(2).global_batch_size(63),
            [".virtualNodes", ".globalBatchSize"],
            id="both",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 1).set(lrScaling="adascale"),
            [".lrScaling"],
            id="adascale-v-defaults-to-1",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 1).virtual_nodes(2).set(lrScaling="adascale"), [], id="adascale-v2"
        ),
        pytest.param(JobBuilder("j").replicas(1, 2).set(lrScaling="adascale"), [], id="adascale-max-2"),
    ],
)
def test_violations_match_hand_checked_specs(builder: JobBuilder, broken: list[str]) -> None:
    spec = builder.obj()["spec"]
    assert [rule.field_path for rule in violations(TrainingShape.cel_rules, spec)] == broken


SEVERAL_GPUS_MESSAGE = ElasticTrainingJobSpec.cel_rules[-1].message


def _replicas_rule() -> Rule:
    [rule] = Replicas.cel_rules
    return rule


@pytest.mark.parametrize(
    ("builder", "broken"),
    [
        pytest.param(JobBuilder("good").replicas(2, 4), [], id="valid"),
        pytest.param(
            JobBuilder("j").replicas(5, 4), [("spec.replicas", _replicas_rule().message)], id="min-above-max"
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).virtual_nodes(3).global_batch_size(64),
            [
                ("spec", SHAPE_RULES[".virtualNodes"].message),
                ("spec", SHAPE_RULES[".globalBatchSize"].message),
            ],
            id="v3-max4-b64",
        ),
        pytest.param(
            JobBuilder("Bad_Name"), [("", ElasticTrainingJob.cel_rules[1].message)], id="name-not-a-dns-label"
        ),
        pytest.param(
            JobBuilder("n" * 41), [("", ElasticTrainingJob.cel_rules[0].message)], id="name-too-long"
        ),
        pytest.param(JobBuilder("n" * 40), [], id="name-longest"),
        pytest.param(
            JobBuilder("j").replicas(1, 4).gpus(2),
            [("spec", SEVERAL_GPUS_MESSAGE)],
            id="two-gpus-per-worker-v-unset",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).gpus(2).virtual_nodes(4).global_batch_size(64),
            [("spec", SEVERAL_GPUS_MESSAGE)],
            id="two-gpus-per-worker-v-equals-max",
        ),
        pytest.param(
            JobBuilder("j").replicas(1, 4).gpus("2").virtual_nodes(8).global_batch_size(64),
            [],
            id="two-gpus-as-a-string-v-max-times-two",
        ),
        pytest.param(JobBuilder("j").replicas(1, 4).gpus(0), [], id="no-gpu"),
    ],
)
def test_rule_violations_of_whole_jobs(builder: JobBuilder, broken: list[tuple[str, str]]) -> None:
    found = rule_violations(builder.model())
    assert [(path, rule.message) for path, rule in found] == broken
