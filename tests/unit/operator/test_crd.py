"""The committed CRD is exactly what the models generate, and it wires the contract's names."""

from __future__ import annotations

from pathlib import Path

from ebbflow_api import contract, crd
from ebbflow_api.models import Batching, LrScaling

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
        *wide_only,
        ("Age", 0),
    ]
    properties = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert properties["batching"]["enum"] == [b.value for b in Batching]
    assert properties["lrScaling"]["enum"] == [s.value for s in LrScaling]
    assert properties["rendezvous"]["properties"]["port"]["default"] == contract.RENDEZVOUS_PORT
