"""The committed CRD is exactly what the models generate, and it wires the contract's names."""

from __future__ import annotations

from pathlib import Path

import pytest
from ebbflow_api import contract, crd
from ebbflow_api.base import ApiModel
from ebbflow_api.models import Batching, LrScaling
from ebbflow_api.rules import evaluate
from ebbflow_api.schema import model_schema
from pydantic import Field

CRD_FILE = Path(__file__).resolve().parents[3] / crd.CRD_FILE


def test_committed_crd_matches_the_generator() -> None:
    assert CRD_FILE.read_text() == crd.render(), "crds/ is stale: run `make crds`"


def test_names_and_subresources_come_from_the_contract() -> None:
    manifest = crd.crd_manifest()
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == f"{contract.PLURAL}.{contract.API_GROUP}"
    assert spec["names"]["kind"] == contract.KIND
    assert spec["names"]["shortNames"] == [contract.SHORT_NAME]
    [version] = spec["versions"]
    assert version["name"] == contract.API_VERSION
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.max"
    columns = [(c["name"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]
    wide_only = [("Rate", 1)]  # `kubectl get etj -o wide`: the band-limited convolutions' compression rate
    assert columns == [
        ("Min", 0),
        ("Max", 0),
        ("Desired", 0),
        ("Ready", 0),
        ("Phase", 0),
        ("Step", 0),  # README: `kubectl get etj -w` shows the phase, workers, step and loss
        ("Loss", 0),
        *wide_only,
        ("Age", 0),
    ]
    properties = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert properties["batching"]["enum"] == [b.value for b in Batching]
    assert properties["lrScaling"]["enum"] == [s.value for s in LrScaling]
    assert properties["rendezvous"]["properties"]["port"]["default"] == contract.RENDEZVOUS_PORT


class Bounded(ApiModel):
    floor: int = Field(1, ge=1)
    above: float = Field(1.0, gt=0)
    ceiling: int = Field(1, le=10)
    below: float = Field(0.5, lt=1)


@pytest.mark.parametrize(
    ("field", "bounds"),
    [
        pytest.param("floor", {"minimum": 1}, id="ge"),
        pytest.param("above", {"minimum": 0, "exclusiveMinimum": True}, id="gt"),
        pytest.param("ceiling", {"maximum": 10}, id="le"),
        pytest.param("below", {"maximum": 1, "exclusiveMaximum": True}, id="lt"),
    ],
)
def test_every_bound_reaches_the_schema(field: str, bounds: dict[str, object]) -> None:
    """A bound the models enforce and the CRD lacked would let the API server store a job the
    operator cannot parse (spec.bandLimit.maxCompressionRate < 1 was one)."""
    schema = model_schema(Bounded)["properties"][field]
    keys = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    assert {key: value for key, value in schema.items() if key in keys} == bounds


def _defaulted_objects(schema: dict[str, object], where: str = "") -> list[tuple[str, object, list[str]]]:
    """Every schema node with both a default and CEL rules: (path, default, rules)."""
    found: list[tuple[str, object, list[str]]] = []
    rules = [r["rule"] for r in schema.get("x-kubernetes-validations", [])]  # type: ignore[attr-defined]
    if "default" in schema and rules:
        found.append((where, schema["default"], rules))
    for name, child in (schema.get("properties") or {}).items():  # type: ignore[attr-defined]
        found += _defaulted_objects(child, f"{where}.{name}")
    return found


def test_every_rule_holds_on_its_objects_default() -> None:
    """The API server evaluates an object's rules on its schema default when the CRD is applied (a
    rule that reads a field the default lacks makes the CRD invalid: `no such key`)."""
    [version] = crd.crd_manifest()["spec"]["versions"]
    defaulted = _defaulted_objects(version["schema"]["openAPIV3Schema"])
    assert defaulted, "no defaulted object with rules: the walk found nothing to check"
    for where, default, rules in defaulted:
        for rule in rules:
            assert rules_evaluate(rule, default) is True, f"{where}: {rule!r} on the default {default!r}"


def rules_evaluate(rule: str, value: object) -> object:
    """The rule's value, or the evaluation's error as text (celpy raises some, returns others)."""
    try:
        return evaluate(rule, value)  # type: ignore[arg-type]
    except Exception as error:
        return f"{type(error).__name__}: {error}"
