"""A fluent builder for ElasticTrainingJob manifests, for tests, benchmarks and scripts.

In the style of Kueue's test wrappers: start from a small valid job and change only what the
caller cares about, `JobBuilder("train").replicas(1, 4).gpus(2).priority(10).obj()`. The result is
the plain manifest a user would `kubectl apply`; `model()` validates it with the API models.
"""

from __future__ import annotations

import copy
from typing import Any, Self

from . import contract
from .models import GPU_RESOURCE, ElasticTrainingJob

DEFAULT_IMAGE = "ebbflow/trainer:test"


class JobBuilder:
    """Builds one manifest; every method returns the builder, `obj()` a fresh copy of the manifest."""

    def __init__(self, name: str, namespace: str | None = None) -> None:
        metadata: dict[str, Any] = {"name": name}
        if namespace:
            metadata["namespace"] = namespace
        self._manifest: dict[str, Any] = {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "metadata": metadata,
            "spec": {
                "replicas": {"min": 1, "max": 1},
                "globalBatchSize": 64,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "trainer",
                                "image": DEFAULT_IMAGE,
                                "resources": {"limits": {GPU_RESOURCE: 1}},
                            }
                        ]
                    }
                },
            },
        }

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._manifest["spec"]
        return spec

    @property
    def _pod_spec(self) -> dict[str, Any]:
        pod_spec: dict[str, Any] = self._spec["template"]["spec"]
        return pod_spec

    @property
    def _container(self) -> dict[str, Any]:
        container: dict[str, Any] = self._pod_spec["containers"][0]
        return container

    def replicas(self, low: int, high: int) -> Self:
        """min and max workers; the global batch follows (64 samples per worker at max) unless set."""
        self._spec["replicas"] = {"min": low, "max": high}
        self._spec["globalBatchSize"] = 64 * high
        return self

    def virtual_nodes(self, count: int) -> Self:
        self._spec["virtualNodes"] = count
        return self

    def global_batch_size(self, samples: int) -> Self:
        self._spec["globalBatchSize"] = samples
        return self

    def set(self, **fields: Any) -> Self:
        """Any other spec field by its API name, e.g. `.set(priority=10, leaveGraceSeconds=5)`."""
        self._spec.update(fields)
        return self

    def priority(self, value: int) -> Self:
        return self.set(priority=value)

    def band_limit(
        self, memory_budget_mib: int | None = None, max_compression_rate: float | None = None
    ) -> Self:
        """spec.bandLimit: band-limited convolutions; without a budget it comes from the nodes' labels."""
        band: dict[str, Any] = {}
        if memory_budget_mib is not None:
            band["memoryBudgetMiB"] = memory_budget_mib
        if max_compression_rate is not None:
            band["maxCompressionRate"] = max_compression_rate
        return self.set(bandLimit=band)

    def gpus(self, count: int | str) -> Self:
        """GPUs per worker (the trainer container's nvidia.com/gpu limit)."""
        self._container.setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = count
        return self

    def cpu(self, request: str) -> Self:
        self._container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = request
        return self

    def image(self, image: str) -> Self:
        self._container["image"] = image
        return self

    def command(self, *command: str) -> Self:
        self._container["command"] = list(command)
        return self

    def env(self, **variables: str) -> Self:
        self._container.setdefault("env", []).extend({"name": k, "value": v} for k, v in variables.items())
        return self

    def node_selector(self, selector: dict[str, str]) -> Self:
        self._pod_spec["nodeSelector"] = dict(selector)
        return self

    def toleration(self, key: str, effect: str = "", operator: str = "Exists", value: str = "") -> Self:
        toleration = {"key": key, "operator": operator}
        if effect:
            toleration["effect"] = effect
        if value:
            toleration["value"] = value
        self._pod_spec.setdefault("tolerations", []).append(toleration)
        return self

    def pod_spec(self, **fields: Any) -> Self:
        """Any other field of the worker pod spec (volumes, affinity, ...)."""
        self._pod_spec.update(fields)
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._manifest)

    def model(self) -> ElasticTrainingJob:
        return ElasticTrainingJob.model_validate(self.obj())
