"""KubeIO's full lists against the real API server: paged, complete, one snapshot."""

from __future__ import annotations

from ebbflow_api import contract
from ebbflow_operator.kube import KubeIO

from .conftest import Kube


def _service(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {contract.LABEL_JOB_NAME: name}},
        "spec": {"clusterIP": "None", "ports": [{"name": "c10d", "port": 29400}]},
    }


def test_a_full_list_comes_in_pages_and_misses_nothing(kube: Kube, namespace: str) -> None:
    names = [f"paged-{i}" for i in range(5)]
    for name in names:
        kube.core.create_namespaced_service(namespace, _service(name))
    requests: list[tuple[str, str]] = []
    io = KubeIO(kube.core.api_client, [namespace], lambda *kind: requests.append(kind), page_size=2)

    items, version = io.list_services()
    assert requests == [("list", "services")]  # the first page only, for its resourceVersion
    listed = list(items)

    assert sorted(item["metadata"]["name"] for item in listed) == names
    assert requests == [("list", "services")] * 3  # 2 + 2 + 1
    # One snapshot: the list's version is at least every item's.
    assert version >= max(int(item["metadata"]["resourceVersion"]) for item in listed)


def test_a_list_of_several_namespaces_pages_each(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_service(namespace, _service("only"))
    empty = f"{namespace}-none"  # a namespace that does not exist lists as empty
    io = KubeIO(kube.core.api_client, [empty, namespace], page_size=1)
    items, version = io.list_services()
    assert [item["metadata"]["name"] for item in items] == ["only"]
    assert version > 0
