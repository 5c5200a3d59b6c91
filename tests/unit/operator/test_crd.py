"""The committed CRD is exactly what the models generate, and it wires the contract's names."""

from __future__ import annotations

from pathlib import Path

import pytest
from ebbflow_api import contract, crd
from ebbflow_api.base import ApiModel
from ebbflow_api.models import Batching, LrScaling
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
